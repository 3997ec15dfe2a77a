"""tensortune for PyTorch users: capture a model's matmul and conv2d workloads as a suite the
`tensortune` CLI tunes as one job (`tensortune.torch.capture`), and run the exported bundle's
kernels inside the model where they beat the vendor library (`tensortune.torch.apply`).

`tensortune.suite` (keys and suite files) and `tensortune.bundle` (which workloads run ours) are
plain Python; `tensortune.torch` imports torch and `tensortune.cuda` reaches the CUDA driver
through ctypes.
"""

__version__ = "0.1.0"
