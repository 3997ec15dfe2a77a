"""The suite writer and the keys, without torch."""

import json

import pytest

from tensortune.suite import (
    SuiteBuilder,
    conv2d_key,
    matmul_key,
    matmul_layout,
    parse_key,
    plain_key,
    read_suite,
    write_suite,
)


def test_keys_are_the_trackers_spelling():
    assert matmul_key(768, 3072, 768, "tn", "f16") == "matmul/m768n3072k768/tn/f16,f32,f16/alpha=1,beta=0"
    assert (
        conv2d_key(32, 56, 56, 64, 64, 3, 3, (1, 1), (1, 1), (1, 1), "f16")
        == "conv2d/n32h56w56c64/k64r3s3/pad1x1,stride1x1,dil1x1/nhwc/f16,f32,f16"
    )
    k = parse_key("conv2d/n8h7w7c512/k2048r1s1/pad0x0,stride2x2,dil1x1/nhwc/bf16,f32,bf16")
    assert (k["op"], k["n"], k["k"], k["stride"], k["types"]) == ("conv2d", 8, 2048, (2, 2), ("bf16", "f32", "bf16"))
    m = parse_key(matmul_key(1, 2, 3, "nt", "tf32"))
    assert (m["m"], m["n"], m["k"], m["layout"], m["types"]) == (1, 2, 3, "nt", ("tf32", "f32", "f32"))
    fused = matmul_key(768, 3072, 768, "tn", "f16", epilogue="bias+gelu", residual=True)
    assert fused == "matmul/m768n3072k768/tn/f16,f32,f16/alpha=1,beta=1,epi=bias+gelu"
    f = parse_key(fused)
    assert (f["residual"], f["epilogue"], f["beta"]) == (True, "bias+gelu", 1.0)
    exact = matmul_key(768, 3072, 768, "tn", "bf16", epilogue="bias+gelu_erf")
    assert exact == "matmul/m768n3072k768/tn/bf16,f32,bf16/alpha=1,beta=0,epi=bias+gelu_erf"
    assert parse_key(exact)["epilogue"] == "bias+gelu_erf"
    assert plain_key(fused) == matmul_key(768, 3072, 768, "tn", "f16")


def test_conv_keys_carry_their_epilogue_as_the_tracker_spells_it():
    base = "conv2d/n32h56w56c64/k256r1s1/pad0x0,stride1x1,dil1x1/nhwc/f16,f32,f16"
    key = conv2d_key(32, 56, 56, 64, 256, 1, 1, dtype="f16", epilogue="bias+relu", residual=True)
    assert key == base + "/beta=1,epi=bias+relu"
    assert conv2d_key(32, 56, 56, 64, 256, 1, 1, epilogue="bias") == base + "/epi=bias"
    assert conv2d_key(32, 56, 56, 64, 256, 1, 1, residual=True) == base + "/beta=1"
    for k, residual, epi in [(key, True, "bias+relu"), (base + "/beta=1", True, None), (base, False, None)]:
        f = parse_key(k)
        assert (f["residual"], f["epilogue"], f["types"]) == (residual, epi, ("f16", "f32", "f16")), k
    with pytest.raises(ValueError, match="epilogue part 'swish'"):
        conv2d_key(1, 1, 1, 1, 1, 1, 1, epilogue="bias+swish")
    # The shipped CNN suite's keys all parse.
    suite = json.load(open(__file__.rsplit("/python/", 1)[0] + "/suites/cnn.json"))
    assert all(parse_key(w["workload"])["epilogue"] for w in suite["workloads"])


def test_layouts_follow_which_dimension_is_contiguous():
    # nn.Linear: X rows contiguous, W used transposed (its k contiguous).
    assert matmul_layout(True, False) == "tn"
    assert matmul_layout(True, True) == "nn"
    # X^T @ W with X^T a transposed view.
    assert matmul_layout(False, True) == "nt"


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: matmul_key(0, 1, 1, "nn", "f16"), "m must be a positive integer"),
        (lambda: matmul_key(1, 1, 1, "xx", "f16"), "layout 'xx' is not one of nn, nt, tn, tt"),
        (lambda: matmul_key(1, 1, 1, "nn", "f64"), "dtype 'f64' is not supported; allowed: f16, bf16, f32, tf32"),
        (lambda: conv2d_key(1, 1, 1, 1, 1, 1, 1, pad=(-1, 0)), "pad must be >= 0"),
        (lambda: conv2d_key(1, 1, 1, 1, 1, 1, 1, stride=(1,)), "stride must be two integers"),
        (lambda: parse_key("matmul/m1"), "is not a matmul or conv2d workload key"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(")):
        call()


def test_the_builder_counts_and_merges(tmp_path):
    b = SuiteBuilder()
    lin = matmul_key(3072, 1024, 768, "tn", "f16")
    for i in range(12):
        b.add(lin, op=f"layer.{i}.intermediate.dense", epilogue="bias+gelu")
    b.add(lin, op="head")  # same key, no epilogue: its own entry
    b.add(matmul_key(384, 384, 64, "nt", "f16"), op="attn", batch=96)
    b.add(matmul_key(384, 384, 64, "nt", "f16"), op="attn", batch=1)
    b.skip("conv: groups=32")
    suite = b.suite("bert")
    w = suite["workloads"]
    assert [e["count"] for e in w] == [12, 1, 1, 1]
    assert w[0]["epilogue"] == "bias+gelu" and len(w[0]["ops"]) == SuiteBuilder.MAX_OPS
    assert w[2]["batch"] == 96 and "batch" not in w[3]
    path = tmp_path / "bert.json"
    write_suite(suite, path)
    assert read_suite(path) == json.loads(path.read_text())
    with pytest.raises(ValueError, match="no workloads"):
        SuiteBuilder().suite("empty")


def test_read_suite_names_the_bad_entry(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"name": "s", "workloads": [{"workload": matmul_key(1, 1, 1, "nn", "f16"), "count": 0}]}))
    with pytest.raises(ValueError, match=r"workloads\[0\]: count must be a positive integer"):
        read_suite(path)
