# Lead, 2026-11-29 evening: which cuBLAS kernel PyTorch's matmul runs on the union-v19 workloads whose space read under
# 0.98x the vendor (kernel names carry cuBLAS's tile, cluster and split), and its time by CUDA-graph replay.
import torch
from torch.profiler import profile, ProfilerActivity
cases = [  # (name, M, N, K, layout, dtype): layout letters as tensortune's (A then B; n = row-major as given)
    ("m2824n1720k1368 nn f16", 2824, 1720, 1368, "nn", torch.float16),
    ("m1536n1536k6144 nt bf16", 1536, 1536, 6144, "nt", torch.bfloat16),
    ("m3072n3072k3072 tn bf16", 3072, 3072, 3072, "tn", torch.bfloat16),
    ("m2824n1720k1368 tn f16", 2824, 1720, 1368, "tn", torch.float16),
]
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
for name, M, N, K, lay, dt in cases:
    a = torch.randn(M, K, device="cuda", dtype=dt) if lay[0] == "n" else torch.randn(K, M, device="cuda", dtype=dt).t()
    b = torch.randn(K, N, device="cuda", dtype=dt) if lay[1] == "n" else torch.randn(N, K, device="cuda", dtype=dt).t()
    for _ in range(20): c = a @ b
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(10): c = a @ b
        torch.cuda.synchronize()
    ks = {}
    for e in p.events():
        if e.device_type.name == "CUDA": ks.setdefault(e.name, []).append(e.device_time)
    g = torch.cuda.CUDAGraph(); s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): c = a @ b
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(100): c = a @ b
    ts = []
    for _ in range(7):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); g.replay(); e1.record(); torch.cuda.synchronize(); ts.append(e0.elapsed_time(e1) * 1000 / 100)
    print(f"{name}: graph {min(ts):.2f} us (median {sorted(ts)[3]:.2f}), {2*M*N*K/min(ts)/1e6:.0f} TFLOP/s")
    for k, v in ks.items(): print(f"   {len(v)}x {sum(v)/len(v):8.2f} us  {k}")
