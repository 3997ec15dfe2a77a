"""Apply's decisions (which workloads run the bundle's kernel), without torch or a GPU."""

import json

import pytest

from tensortune.bundle import Plan, cubin_for, winner
from tensortune.suite import matmul_key

KEY = matmul_key(768, 256, 768, "tn", "f16")


def entry(key=KEY, time_us=10.0, vendor_us=12.0, cubins=None, **extra):
    e = {
        "name": "k",
        "workload_key": key,
        "problem": {"op": "matmul", "alpha": 1.0, "beta": 0.0},
        "time_us": time_us,
        "vendor_us": vendor_us,
        "cubins": {"sm_90a": "k.sm_90a.cubin"} if cubins is None else cubins,
    }
    e.update(extra)
    return e


def plan(*entries, arch=90):
    return Plan({"format": 1, "kernels": list(entries)}, "/b", arch=arch)


def test_ours_runs_only_where_it_won_and_can_run():
    e, why = plan(entry()).decide(KEY)
    assert e is not None and why is None
    assert cubin_for(e, 90) == "k.sm_90a.cubin"
    _, why = plan(entry(time_us=13.0)).decide(KEY)
    assert why.startswith("the vendor won (12.00 us vs ours 13.00 us)")
    # The recorded winner overrides the times (a finalist re-measurement may disagree with them).
    _, why = plan(entry(winner="vendor")).decide(KEY)
    assert why.startswith("the vendor won")
    assert plan(entry(time_us=13.0, winner="ours")).decide(KEY)[0] is not None
    # For timing in place, a kernel that lost is handed out too; one that cannot run is not.
    assert plan(entry(winner="vendor")).decide(KEY, any_winner=True)[0] is not None
    _, why = plan(entry(winner="vendor"), arch=80).decide(KEY, any_winner=True)
    assert why == "no cubin for sm_80 (the bundle has sm_90a)"
    _, why = plan(entry()).decide(matmul_key(1, 2, 3, "nn", "f16"))
    assert why == "not tuned (no kernel in the bundle)"
    _, why = plan(entry(), arch=80).decide(KEY)
    assert why == "no cubin for sm_80 (the bundle has sm_90a)"
    _, why = plan(entry(problem={"op": "matmul", "alpha": 2.0, "beta": 0.0})).decide(KEY)
    assert why == "the kernel scales by alpha/beta"
    # A call with a bias keeps PyTorch's fused GEMM + bias unless the kernel fuses it too.
    _, why = plan(entry()).decide(KEY, ["bias"])
    assert why == "a bias PyTorch fuses and this kernel does not"
    assert plan(entry(epilogue="bias")).decide(KEY, ["bias"])[0] is not None
    assert plan(entry()).decide(KEY, [])[0] is not None


def test_the_fastest_of_several_classes_is_kept_and_summarised():
    p = plan(entry(time_us=11.0), entry(time_us=9.0, vendor_us=None))
    assert p.entries[KEY]["time_us"] == 9.0
    assert winner(p.entries[KEY]) == "ours"
    ours, why = p.summary([KEY, KEY, "matmul/m1n1k1/nn/f16,f32,f16/alpha=1,beta=0", (KEY, ["bias"])])
    assert ours == 2 and why == {"not tuned": 1, "a bias PyTorch fuses and this kernel does not": 1}


def test_a_bad_bundle_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="is .* a bundle"):
        Plan.load(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 2, "kernels": []}))
    with pytest.raises(ValueError, match="format 2 is not supported"):
        Plan.load(tmp_path)


def test_fused_conv_kernels_that_won_mark_their_plain_key():
    base = "conv2d/n32h56w56c64/k256r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16"
    kernels = [
        {"workload_key": base + "/beta=1,epi=bias+relu", "time_us": 5.0, "vendor_us": 6.0, "problem": {"op": "conv2d"}},
        {"workload_key": base.replace("k256", "k64") + "/epi=bias", "time_us": 5.0, "vendor_us": 4.0,
         "problem": {"op": "conv2d"}},
        {"workload_key": base.replace("n32", "n1"), "time_us": 1.0, "vendor_us": 2.0, "problem": {"op": "conv2d"}},
    ]
    plan = Plan({"format": 1, "kernels": kernels})
    assert plan.fuses(base)
    assert not plan.fuses(base.replace("k256", "k64")), "the vendor won that one"
    assert plan.chains(base) and plan.chains(base.replace("k256", "k64")), "its chain runs as the vendor's fused call"
    assert not plan.chains(base.replace("n32", "n1"))
    assert not plan.fuses(base.replace("n32", "n1")), "a plain kernel is no reason to wait for an epilogue"
    entry, why = plan.decide(base + "/beta=1,epi=bias+relu")
    assert entry is kernels[0] and why is None
    assert plan.decide(base.replace("k256", "k64")) == (None, "the vendor won each fused kernel of this layer")
    assert plan.decide(base.replace("k256", "k32"))[1].startswith("not tuned")


def test_fused_linear_kernels_that_won_mark_their_plain_key():
    plain = matmul_key(768, 3072, 768, "tn", "f16")
    residual = matmul_key(768, 3072, 768, "tn", "f16", epilogue="bias", residual=True)
    assert residual == plain.replace("beta=0", "beta=1,epi=bias")
    won = entry(residual, problem={"op": "matmul", "alpha": 1.0, "beta": 1.0})
    p = plan(won, entry(matmul_key(64, 64, 64, "tn", "f16", epilogue="bias"), time_us=13.0))
    assert p.fuses(plain) and p.decide(residual) == (won, None)
    assert not p.fuses(matmul_key(64, 64, 64, "tn", "f16")), "the vendor won that one"
    assert p.decide(matmul_key(64, 64, 64, "tn", "f16")) == (None, "the vendor won each fused kernel of this layer")
    # A kernel without C for a key with it (or the other way round) is refused.
    _, why = plan(entry(residual)).decide(residual)
    assert why == "the kernel scales by alpha/beta"
