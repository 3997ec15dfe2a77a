#!/usr/bin/env python3
"""BERT-base (transformers' BertModel from a default BertConfig, random weights: nothing is
downloaded), f16, eval, sequence 384: capture its workloads, tune them as one job through the
`tensortune` CLI, export, apply, and print eager against tuned by CUDA-graph replay.

    PYTHONPATH=python examples/bert.py --batch 8 --total-trials 300 --profile --tensortune target/release/tensortune

Each linear layer's key carries its bias and, after the attention output and FFN down
projections, the residual add (`alpha=1,beta=1,epi=bias`); the exact (erf) GELU after the FFN up
projection stays PyTorch's (the kernels' GELU is the tanh form). `--profile` first prints where
one eager forward's GPU time goes.
"""

import torch
from transformers import BertConfig, BertModel

from tensortune import endtoend

SEQUENCE = 384
args = endtoend.arguments(__doc__.splitlines()[0], batch=8)
torch.manual_seed(0)
# Eager's strongest cuDNN choice (timed per shape), not its heuristics: the baseline to beat.
torch.backends.cudnn.benchmark = True
model = BertModel(BertConfig()).cuda().half().eval()
print(f"attention: {model.config._attn_implementation}; hidden activation: {model.config.hidden_act}")
ids = torch.randint(0, BertConfig().vocab_size, (args.batch, SEQUENCE), device="cuda")
endtoend.run(f"bert-base-b{args.batch}-s{SEQUENCE}", model, {"input_ids": ids}, args)
