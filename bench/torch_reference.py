#!/usr/bin/env python3
"""The models of bench/engine_benchmark.cc's step/* benchmarks, in PyTorch on
the CPU with the same thread count, for the Conveyor/PyTorch comparison in
scripts/bench. Same shapes, batch, microbatches (loss / M, gradients
accumulated), AdamW, fixed data. Prints JSON: median milliseconds per step.

step/llama_block is timed in several configurations (eager and TorchScript,
each at 1, 2, 4, ... threads up to the thread count) and reports the fastest,
with the winner under "step/llama_block_config": on a small machine one
thread can beat two for a block this size, and the row must not gain from
PyTorch running slower than it can.
"""
import json
import math
import os
import statistics
import subprocess
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


class RMSNorm(nn.Module):
    """HF's LlamaRMSNorm: w * x * rsqrt(mean(x^2) + eps)."""

    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    """HF's LlamaDecoderLayer, Conveyor's llama_block: pre-norm RMSNorm,
    grouped-query causal attention with rotate_half rotary embedding
    (inv_freq = 1 / theta^(2i / head_dim)), SwiGLU MLP, no biases. The rotary
    tables and the causal mask depend only on the sequence length, so they are
    built once, as a fast PyTorch model would."""

    def __init__(self, seq, d, heads, kv_heads, mlp, theta=10000.0, eps=1e-6):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, d // heads
        hd = self.head_dim
        self.input_layernorm = RMSNorm(d, eps)
        self.q_proj = nn.Linear(d, heads * hd, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(heads * hd, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.gate_proj = nn.Linear(d, mlp, bias=False)
        self.up_proj = nn.Linear(d, mlp, bias=False)
        self.down_proj = nn.Linear(mlp, d, bias=False)
        inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
        angles = torch.outer(torch.arange(seq).float(), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        self.register_buffer(
            "mask", torch.full((seq, seq), float("-inf")).triu(1),
            persistent=False)

    def attention(self, x):
        b, s, _ = x.shape
        h, g, hd = self.heads, self.kv_heads, self.head_dim
        q = self.q_proj(x).view(b, s, h, hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, g, hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, g, hd).transpose(1, 2)
        q = q * self.cos + rotate_half(q) * self.sin
        k = k * self.cos + rotate_half(k) * self.sin
        # HF's repeat_kv: key/value head j serves the h/g query heads from
        # j*h/g on.
        k = k.repeat_interleave(h // g, dim=1)
        v = v.repeat_interleave(h // g, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + self.mask
        context = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(context.transpose(1, 2).reshape(b, s, h * hd))

    def forward(self, x):
        x = x + self.attention(self.input_layernorm(x))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(
            nn.functional.silu(self.gate_proj(y)) * self.up_proj(y))


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


def time_llama_block_configs(seconds):
    """{mode: ms} for eager and TorchScript at this process's thread count,
    each model from the same seed. A mode this torch cannot run is left out
    (the reason goes to stderr)."""
    times = {}
    for mode in ("eager", "torchscript"):
        torch.manual_seed(0)
        model = LlamaBlock(32, 64, 4, 2, 172)
        try:
            if mode == "torchscript":
                model = torch.jit.script(model)
            times[mode] = time_steps(model, [32, 64], [32, 64], 8, 4, seconds)
        except RuntimeError as e:
            print(f"llama_block {mode}: {e}", file=sys.stderr)
    return times


def time_llama_block(seconds, max_threads):
    """(ms, configuration) of the fastest of eager and TorchScript at 1, 2,
    4, ... threads up to max_threads; (None, None) if none ran. Each thread
    count runs in its own process started with OMP_NUM_THREADS and
    OPENBLAS_NUM_THREADS set, as a user would run it: Debian's torch calls a
    generic BLAS (OpenBLAS), whose thread pool torch.set_num_threads does not
    reach and which reads its count only when it loads."""
    counts = sorted({min(1 << i, max_threads)
                     for i in range(max_threads.bit_length() + 1)})
    best = (None, None)
    for n in counts:
        env = dict(os.environ, OMP_NUM_THREADS=str(n),
                   OPENBLAS_NUM_THREADS=str(n), MKL_NUM_THREADS=str(n),
                   CONVEYOR_BENCH_THREADS=str(n))
        command = [sys.executable, os.path.abspath(__file__),
                   "--llama-block-configs"]
        run = subprocess.run(command, env=env, stdout=subprocess.PIPE,
                             text=True)
        if run.returncode != 0:
            print(f"llama_block at {n} threads: exit {run.returncode}",
                  file=sys.stderr)
            continue
        for mode, ms in json.loads(run.stdout).items():
            if best[0] is None or ms < best[0]:
                best = (ms, f"{mode}, {n} thread{'s' * (n > 1)}")
    return best


def main():
    threads = int(os.environ.get("CONVEYOR_BENCH_THREADS", os.cpu_count() or 1))
    seconds = float(os.environ.get("CONVEYOR_BENCH_SECONDS", "2"))
    torch.set_num_threads(threads)
    if sys.argv[1:] == ["--llama-block-configs"]:
        json.dump(time_llama_block_configs(seconds), sys.stdout)
        return
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
    # Without a time (every configuration failed) the row shows n/a and the
    # rows above still compare.
    ms, config = time_llama_block(seconds, threads)
    if ms is not None:
        result["step/llama_block"] = ms
        result["step/llama_block_config"] = config
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
