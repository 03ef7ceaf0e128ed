#!/usr/bin/env python3
"""The models of bench/engine_benchmark.cc's step/* benchmarks, in PyTorch on
the CPU with the same thread count, for the Conveyor/PyTorch comparison in
scripts/bench. Same shapes, batch, microbatches (loss / M, gradients
accumulated), AdamW, fixed data. Prints JSON: median milliseconds per step.
"""
import json
import os
import statistics
import sys
import time

import torch
from torch import nn


class Block(nn.Module):
    """The JaxPP notebook's post-norm transformer block."""

    def __init__(self, d, heads, mlp):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.norm1 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, mlp), nn.GELU(), nn.Linear(mlp, d))
        self.norm2 = nn.LayerNorm(d)

    def forward(self, x):
        x = self.norm1(x + self.attn(x, x, x, need_weights=False)[0])
        return self.norm2(x + self.mlp(x))


def time_steps(model, sample_shape, out_shape, batch, microbatches, seconds):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mb = batch // microbatches
    xs = [torch.randn(mb, *sample_shape) for _ in range(microbatches)]
    ys = [torch.randn(mb, *out_shape) for _ in range(microbatches)]

    def step():
        opt.zero_grad(set_to_none=False)
        for x, y in zip(xs, ys):
            loss = nn.functional.mse_loss(model(x), y) / microbatches
            loss.backward()
        opt.step()

    for _ in range(5):
        step()
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 10:
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    threads = int(os.environ.get("CONVEYOR_BENCH_THREADS", os.cpu_count() or 1))
    seconds = float(os.environ.get("CONVEYOR_BENCH_SECONDS", "2"))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512),
                        nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                        nn.Linear(512, 128))
    result = {
        "torch_version": torch.__version__,
        "threads": threads,
        "step/mlp": time_steps(mlp, [128], [128], 128, 4, seconds),
        "step/transformer_block": time_steps(Block(64, 4, 256), [32, 64],
                                             [32, 64], 8, 4, seconds),
    }
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
