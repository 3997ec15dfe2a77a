#!/usr/bin/env python3
"""ResNet-50 (torchvision, built from its definition with random weights: nothing is downloaded),
f16, channels_last, eval: capture its matmul/conv2d workloads, tune them as one job through the
`tensortune` CLI, export the bundle, apply it, and print eager against tuned by CUDA-graph replay.

    PYTHONPATH=python examples/resnet50.py --batch 32 --total-trials 600 --tensortune target/release/tensortune
    PYTHONPATH=python examples/resnet50.py --batch 32 --compare-compile ...   # torch.compile in the same rounds
"""

import torch
import torchvision

from tensortune import endtoend

args = endtoend.arguments(__doc__.splitlines()[0], batch=32)
torch.manual_seed(0)
# Eager's strongest cuDNN choice (timed per shape), not its heuristics: the baseline to beat.
torch.backends.cudnn.benchmark = True
model = torchvision.models.resnet50(weights=None).cuda().half().eval().to(memory_format=torch.channels_last)
x = torch.randn(args.batch, 3, 224, 224, device="cuda", dtype=torch.half).to(memory_format=torch.channels_last)
endtoend.run(f"resnet50-n{args.batch}", model, (x,), args)
