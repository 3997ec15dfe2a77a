"""Capture and apply's fallback with torch (skipped where torch is not installed: CI installs no
torch, the device machine has it; `pytest python/tests` runs these there)."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from tensortune.torch import apply, capture  # noqa: E402


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1, bias=False)
        self.grouped = nn.Conv2d(16, 16, 3, padding=1, groups=4)
        self.fc1 = nn.Linear(16 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 32)

    def forward(self, x):
        x = torch.relu(self.conv(x))
        x = self.grouped(x).flatten(1)
        h = torch.nn.functional.gelu(self.fc1(x))
        h = torch.relu(self.fc2(h)) + self.fc2(h)
        q = h.view(-1, 4, 8)
        return q @ q.transpose(-1, -2)


def keys(suite):
    return {(e["workload"], e.get("epilogue"), e.get("batch")): e["count"] for e in suite["workloads"]}


@pytest.mark.parametrize("device, dtype", [("cpu", torch.float32), ("meta", torch.float16)])
def test_capture_writes_the_suite(tmp_path, device, dtype):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = Block().to(device=device, dtype=dtype).eval()
    x = torch.randn(2, 8, 4, 4, device=device, dtype=dtype)
    suite = capture(model, (x,), tmp_path / "s.json", name="block")
    t = {torch.float32: "f32,f32,f32", torch.float16: "f16,f32,f16"}[dtype]
    assert keys(suite) == {
        # A conv's epilogue is in its key (the fused kernel is what is tuned).
        (f"conv2d/n2h4w4c8/k16r3s3/pad1x1,stride1x1,dil1x1/nhwc/{t}/epi=relu", None, None): 1,
        # So is a linear layer's: its bias, then an add and ReLU or GELU (F.gelu's default, the
        # exact erf form: gelu_erf).
        (f"matmul/m32n2k256/tn/{t}/alpha=1,beta=0,epi=bias+gelu_erf", None, None): 1,
        (f"matmul/m32n2k32/tn/{t}/alpha=1,beta=0,epi=bias+relu", None, None): 1,
        (f"matmul/m32n2k32/tn/{t}/alpha=1,beta=1,epi=bias", None, None): 1,
        # q @ q^T: the transposed view is the key's op(A), as a Linear's weight.
        (f"matmul/m4n4k8/tn/{t}/alpha=1,beta=0", None, 2): 1,
    }
    assert any("groups=4" in s for s in suite["skipped"])
    assert (tmp_path / "s.json").exists()
    ops = [op for e in suite["workloads"] for op in e.get("ops", [])]
    assert "conv" in ops and "fc1" in ops


def test_apply_keeps_torchs_op_where_the_bundle_has_no_winner(tmp_path):
    import json

    model = Block().eval()
    x = torch.randn(2, 8, 4, 4)
    want = model(x)
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "kernels": []}))
    applied = apply(model, tmp_path, arch=90)
    got = model(x)
    assert torch.equal(got, want)
    r = applied.report()
    assert r["ours"] == 0 and r["kept"]["not tuned (no kernel in the bundle)"] == 5
    # Counts start again from a reset (what endtoend reports per graph).
    applied.reset_counts()
    assert (applied.report()["kept"], applied.report()["forwards"]) == ({}, 0)
    model(x)
    assert (applied.report()["kept"], applied.report()["forwards"]) == ({"not tuned (no kernel in the bundle)": 5}, 1)
    applied.remove()


class Bottleneck(nn.Module):
    """torchvision's bottleneck, small: conv-BN-ReLU twice, then conv-BN, the downsample's
    conv-BN, the add and ReLU (the add follows the downsample, as in torchvision's forward)."""

    def __init__(self, down):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv3, self.bn3 = nn.Conv2d(8, 16, 1, bias=False), nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.down = nn.Sequential(nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16)) if down else None

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.down is not None:
            identity = self.down(x)
        out += identity
        return self.relu(out)


def _randomized(model):
    """Batch norms with statistics and affine parameters away from the identity."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(torch.randn(c, generator=g) * 0.3)
            m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            m.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            m.bias.data.copy_(torch.randn(c, generator=g) * 0.2)
    return model.eval()


def test_capture_folds_batch_norm_add_and_relu_into_the_conv_keys():
    torch.backends.cudnn.allow_tf32 = False
    model = _randomized(nn.Sequential(Bottleneck(down=True), Bottleneck(down=False)))
    x = torch.randn(2, 16, 6, 6)
    suite = capture(model, (x,), name="bottleneck")
    geo = "stride1x1,dil1x1/nhwc/f32,f32,f32"
    assert keys(suite) == {
        (f"conv2d/n2h6w6c16/k8r1s1/pad0x0,{geo}/epi=bias+relu", None, None): 2,
        (f"conv2d/n2h6w6c8/k8r3s3/pad1x1,{geo}/epi=bias+relu", None, None): 2,
        # The first block's add follows its downsample conv, which carries it; the second's
        # follows conv3.
        (f"conv2d/n2h6w6c8/k16r1s1/pad0x0,{geo}/epi=bias", None, None): 1,
        (f"conv2d/n2h6w6c16/k16r1s1/pad0x0,{geo}/beta=1,epi=bias+relu", None, None): 1,
        (f"conv2d/n2h6w6c8/k16r1s1/pad0x0,{geo}/beta=1,epi=bias+relu", None, None): 1,
    }


def test_a_chain_without_a_kernel_runs_the_folded_conv_add_and_relu():
    from tensortune import torch as tt

    torch.backends.cudnn.allow_tf32 = False
    block = _randomized(Bottleneck(down=False))
    x = torch.randn(2, 8, 6, 6)
    identity = torch.randn(2, 16, 6, 6)
    want = torch.relu(block.bn3(block.conv3(x)) + identity)

    class NoKernels:
        def decide(self, key, epilogue=(), any_winner=False):
            return None, f"not tuned: {key}"

    applied = tt.Applied(block, NoKernels(), block.forward)
    call, why = tt._workload(torch.nn.functional.conv2d, (x, block.conv3.weight, None, 1, 0, 1, 1), {})
    assert why is None
    chain = tt._Chain(call, torch.empty(2, 16, 6, 6))
    bn = block.bn3
    args = (chain.out, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.1, bn.eps)
    assert chain.absorb(torch.nn.functional.batch_norm, args, {})
    assert not chain.absorb(torch.relu, (identity,), {}), "ReLU of another tensor is not the chain's"
    assert chain.absorb(torch.Tensor.__iadd__, (chain.out, identity), {})
    assert chain.absorb(torch.nn.functional.relu, (chain.out,), {"inplace": True})
    assert not chain.absorb(torch.relu, (chain.out,), {}), "one activation"
    assert chain.key().endswith("/beta=1,epi=bias+relu")
    tt._run_chain(applied, chain)
    assert torch.allclose(chain.out, want, rtol=1e-5, atol=1e-5), (chain.out - want).abs().max()
    assert applied.ours == 0 and list(applied.kept) == [f"not tuned: {chain.key()}"]
    # The folded weight is made once per weight and batch norm.
    tt._run_chain(applied, chain)
    assert len(applied.folded) == 1


def test_apply_runs_a_cpu_model_as_eager_with_fused_kernels_in_the_bundle(tmp_path):
    import json

    model = _randomized(nn.Sequential(Bottleneck(down=True), Bottleneck(down=False)))
    x = torch.randn(2, 16, 6, 6)
    want = model(x)
    key = "conv2d/n2h6w6c16/k8r1s1/pad0x0,stride1x1,dil1x1/nhwc/f32,f32,f32"
    entry = {"workload_key": f"{key}/epi=bias+relu", "time_us": 1.0, "winner": "ours", "problem": {"op": "conv2d"}}
    (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "kernels": [entry]}))
    applied = apply(model, tmp_path, arch=90)
    assert applied.plan.fuses(key) and not applied.plan.fuses(key + "/epi=bias+relu")
    got = model(x)
    # CPU tensors are not the kernels': every conv runs as PyTorch's, unfused.
    assert torch.equal(got, want)
    assert applied.report()["ours"] == 0 and applied.report()["fused"] == {}
    applied.remove()


class BertOutput(nn.Module):
    """BERT's output layer: dense, dropout, then LayerNorm of the sum with the block's input."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Linear(16, 8)
        self.dropout = nn.Dropout(0.1)
        self.norm = nn.LayerNorm(8)

    def forward(self, h, x):
        return self.norm(self.dropout(self.dense(h)) + x)


def test_a_linear_chain_takes_eval_dropout_and_the_residual_add_and_falls_back_exactly():
    from tensortune import torch as tt

    torch.backends.cuda.matmul.allow_tf32 = False
    model = BertOutput().eval()
    h, x = torch.randn(2, 3, 16), torch.randn(2, 3, 8)
    suite = capture(model, (h, x))
    assert keys(suite) == {("matmul/m8n6k16/tn/f32,f32,f32/alpha=1,beta=1,epi=bias", None, None): 1}
    # In training the dropout is not nothing: the chain ends at it.
    assert "beta=0,epi=bias" in capture(model.train(), (h, x))["workloads"][0]["workload"]
    model.eval()

    class NoKernels:
        def decide(self, key, epilogue=(), any_winner=False):
            return None, f"not tuned: {key}"

    applied = tt.Applied(model, NoKernels(), model.forward)
    d = model.dense
    call, why = tt._workload(torch.nn.functional.linear, (h, d.weight, d.bias), {})
    assert why is None and tt._chains(call)
    chain = tt._Chain(call, torch.empty(2, 3, 8))
    assert chain.absorb(torch.nn.functional.dropout, (chain.out, 0.1, False, False), {})
    assert not chain.absorb(torch.nn.functional.dropout, (chain.out, 0.1, True, False), {}), "training dropout"
    assert chain.absorb(torch.Tensor.__add__, (chain.out, x), {})
    assert chain.key() == "matmul/m8n6k16/tn/f32,f32,f32/alpha=1,beta=1,epi=bias"
    with torch.no_grad():
        tt._run_chain(applied, chain)
    want = d(h) + x
    assert torch.allclose(chain.out, want, rtol=1e-6, atol=1e-6), (chain.out - want).abs().max()
    assert list(applied.kept) == [f"not tuned: {chain.key()}"]


def _downsample_chain(tt, block, x, identity):
    """The downsample conv's chain of `block` as torchvision runs it: conv, batch norm, then
    `identity += out` (the add lands in the other tensor) and ReLU."""
    conv, bn = block.down[0], block.down[1]
    call, why = tt._workload(torch.nn.functional.conv2d, (x, conv.weight, None, 1, 0, 1, 1), {})
    assert why is None
    chain = tt._Chain(call, torch.empty(identity.shape))
    args = (chain.out, bn.running_mean, bn.running_var, bn.weight, bn.bias, False, 0.1, bn.eps)
    assert chain.absorb(torch.nn.functional.batch_norm, args, {})
    assert chain.absorb(torch.Tensor.__iadd__, (identity, chain.out), {})
    assert chain.out is identity
    assert chain.absorb(torch.relu_, (identity,), {})
    return chain


class _NoKernels:
    def decide(self, key, epilogue=(), any_winner=False):
        return None, f"not tuned: {key}"


def test_an_identity_the_chain_adds_into_takes_the_result_without_a_copy_unless_it_is_a_view():
    from tensortune import torch as tt

    torch.backends.cudnn.allow_tf32 = False
    block = _randomized(Bottleneck(down=True))
    x = torch.randn(2, 16, 6, 6)
    base = torch.randn(2, 16, 6, 6)
    want = torch.relu(block.down(x) + base)
    with torch.no_grad():
        applied = tt.Applied(block, _NoKernels(), block.forward)
        identity = base.clone()
        before = identity.data_ptr()
        tt._run_chain(applied, _downsample_chain(tt, block, x, identity))
        assert torch.allclose(identity, want, rtol=1e-5, atol=1e-5), (identity - want).abs().max()
        assert identity.data_ptr() != before, "the identity took the result's storage"
        # A view of a larger buffer is written in place: the buffer must see the sum.
        buffer = torch.cat([base, base], dim=1)
        view = buffer[:, :16]
        tt._run_chain(applied, _downsample_chain(tt, block, x, view))
        assert view.data_ptr() == buffer.data_ptr()
        assert torch.allclose(buffer[:, :16], want, rtol=1e-5, atol=1e-5)
        assert torch.equal(buffer[:, 16:], base)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the chains run on CUDA tensors only")
def test_a_conv_the_bundle_has_no_kernel_for_runs_as_a_chain_with_its_batch_norm_folded(tmp_path):
    import json

    model = _randomized(nn.Sequential(Bottleneck(down=True), Bottleneck(down=False)))
    model = model.cuda().half().to(memory_format=torch.channels_last)
    x = torch.randn(2, 16, 6, 6, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
    with torch.no_grad():
        want = model(x).float()
        (tmp_path / "manifest.json").write_text(json.dumps({"format": 1, "kernels": []}))
        for untuned, folded in ((False, 0), (True, 7)):
            applied = apply(model, tmp_path, arch=90)
            applied.chain_untuned = untuned
            got = model(x).float()
            applied.remove()
            # Seven convs, each with its batch norm: folded once each where they run as chains.
            assert len(applied.folded) == folded
            assert applied.report()["kept"] == {"not tuned (no kernel in the bundle)": 7}
            assert (got - want).abs().max() <= 2e-2 * want.abs().max(), (got - want).abs().max()


def test_a_chain_runs_whichever_way_was_faster_in_place_timed_once_per_key(monkeypatch):
    from tensortune import torch as tt

    class OneKernel:
        def decide(self, key, epilogue=(), any_winner=False):
            return (entry, None) if any_winner else (None, "the vendor won")

    entry = {"name": "k"}
    applied = tt.Applied(None, OneKernel(), None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    timings = []
    monkeypatch.setattr(tt, "_time_both", lambda *a: timings.append(a[2]) or (5.0, 7.0))
    assert tt._timed(applied, None, "k1", entry, None, None) == (entry, None)
    assert tt._timed(applied, None, "k1", entry, None, None) == (entry, None)
    assert len(timings) == 1, "timed once per key"
    monkeypatch.setattr(tt, "_time_both", lambda *a: (9.0, 7.0))
    assert tt._timed(applied, None, "k2", entry, None, None) == (None, "PyTorch's was faster in place (7.00 us vs ours 9.00 us)")
    # A key first seen while a CUDA graph is captured (no timing there) keeps the tuning's decision.
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert tt._timed(applied, None, "k3", entry, None, None) == (None, "the vendor won")
    assert applied.report()["timed"] == {"k1": [5.0, 7.0], "k2": [9.0, 7.0]}
