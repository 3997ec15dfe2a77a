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
        (f"conv2d/n2h4w4c8/k16r3s3/pad1x1,stride1x1,dil1x1/nhwc/{t}", "relu", None): 1,
        (f"matmul/m32n2k256/tn/{t}/alpha=1,beta=0", "bias+gelu", None): 1,
        (f"matmul/m32n2k32/tn/{t}/alpha=1,beta=0", "bias+relu", None): 1,
        (f"matmul/m32n2k32/tn/{t}/alpha=1,beta=0", "bias", None): 1,
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
    applied.remove()
