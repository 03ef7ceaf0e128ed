#!/usr/bin/env python3
"""The models of bench/engine_benchmark.cc's step/* benchmarks, in PyTorch on
the CPU, for the Conveyor/PyTorch comparison in scripts/bench. Same shapes,
batch, microbatches (loss / M, gradients accumulated), AdamW, fixed data.
Prints JSON: per row, the median milliseconds per step of PyTorch's FASTEST
configuration for the cores given, and that configuration's name. With
--onecore, the onecore/gpt rows on one thread (the caller pins the core).

The configurations (each in its own process, since OpenMP and OpenBLAS read
their settings only when they load):
  - 1 thread;
  - N threads with OMP_WAIT_POLICY=PASSIVE, and N threads with OpenMP's
    default wait policy (which spins, and on a small machine fights
    OpenBLAS's own threads), for N = 2, 4, ... up to the thread count;
  - for step/llama_block, eager and TorchScript in each.
A row compares against the fastest, so Conveyor never gains from PyTorch
running slower than it can (issue 23: the baseline is PyTorch's best).
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

    return time_callable(step, seconds)


class Gpt(nn.Module):
    """examples/gpt.yaml's byte-level GPT, Conveyor's step/gpt: token and
    learned position embeddings, pre-norm causal transformer blocks (exact
    GELU, no dropout), a final layer norm and a bias-free 256-way head."""

    def __init__(self, vocab=256, d=128, seq=64, heads=4, mlp=512, layers=2):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)
        self.positions = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d, heads, mlp, dropout=0.0,
                                       activation="gelu", batch_first=True,
                                       norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer(
            "mask", torch.full((seq, seq), float("-inf")).triu(1),
            persistent=False)
        self.register_buffer("pos", torch.arange(seq), persistent=False)

    def forward(self, ids):
        x = self.tokens(ids) + self.positions(self.pos)
        for block in self.blocks:
            x = block(x, src_mask=self.mask)
        return self.head(self.norm(x))


def time_token_steps(model, seq, vocab, batch, microbatches, seconds):
    """time_steps for a language model: random token ids, cross-entropy over
    the vocabulary at every position."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mb = batch // microbatches
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randint(vocab, (mb, seq), generator=gen)
          for _ in range(microbatches)]
    ys = [torch.randint(vocab, (mb, seq), generator=gen)
          for _ in range(microbatches)]

    def step():
        opt.zero_grad(set_to_none=False)
        for x, y in zip(xs, ys):
            logits = model(x)
            loss = nn.functional.cross_entropy(
                logits.reshape(-1, vocab), y.reshape(-1)) / microbatches
            loss.backward()
        opt.step()

    return time_callable(step, seconds)


def time_callable(step, seconds):
    for _ in range(5):
        step()
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 10:
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def time_rows(seconds):
    """{row: {mode: ms}} for every row at this process's configuration;
    modes are "eager" and, for step/llama_block, "torchscript". A mode this
    torch cannot run is left out (the reason goes to stderr)."""
    rows = {}
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512),
                        nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                        nn.Linear(512, 128))
    rows["step/mlp"] = {"eager": time_steps(mlp, [128], [128], 128, 4,
                                            seconds)}
    torch.manual_seed(0)
    rows["step/transformer_block"] = {
        "eager": time_steps(Block(64, 4, 256), [32, 64], [32, 64], 8, 4,
                            seconds)}
    rows["step/llama_block"] = time_llama_block_configs(seconds)
    torch.manual_seed(0)
    rows["step/gpt"] = {"eager": time_token_steps(Gpt(), 64, 256, 16, 4,
                                                  seconds)}
    return rows


def configurations(max_threads):
    """(name, environment) of each configuration for max_threads cores."""
    counts = sorted({min(1 << i, max_threads)
                     for i in range(max_threads.bit_length() + 1)})
    out = []
    for n in counts:
        threads = dict(OMP_NUM_THREADS=str(n), OPENBLAS_NUM_THREADS=str(n),
                       MKL_NUM_THREADS=str(n), CONVEYOR_BENCH_THREADS=str(n))
        if n == 1:
            out.append(("1 thread", threads))
            continue
        out.append((f"{n} threads, OMP_WAIT_POLICY=PASSIVE",
                    dict(threads, OMP_WAIT_POLICY="PASSIVE")))
        out.append((f"{n} threads", threads))
    return out


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


def time_onecore_rows(seconds):
    """{row: ms} for bench/engine_benchmark.cc's onecore/gpt/SEQ rows: the
    byte-level GPT with four pre-norm causal blocks at sequence 128 and 256,
    batch 16 in 4 microbatches, on this process's one thread (scripts/bench
    pins it to the core Conveyor's row ran on)."""
    rows = {}
    for seq in (128, 256):
        torch.manual_seed(0)
        rows[f"onecore/gpt/{seq}"] = time_token_steps(
            Gpt(seq=seq, layers=4), seq, 256, 16, 4, seconds)
    return rows


def main():
    threads = int(os.environ.get("CONVEYOR_BENCH_THREADS", os.cpu_count() or 1))
    seconds = float(os.environ.get("CONVEYOR_BENCH_SECONDS", "2"))
    torch.set_num_threads(threads)
    if sys.argv[1:] == ["--rows"]:
        json.dump(time_rows(seconds), sys.stdout)
        return
    if sys.argv[1:] == ["--onecore"]:
        torch.set_num_threads(1)
        result = time_onecore_rows(seconds)
        result["torch_version"] = torch.__version__
        json.dump(result, sys.stdout)
        print()
        return
    result = {"torch_version": torch.__version__, "threads": threads}
    for name, env in configurations(threads):
        run = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--rows"],
            env=dict(os.environ, **env), stdout=subprocess.PIPE, text=True)
        if run.returncode != 0:
            print(f"{name}: exit {run.returncode}", file=sys.stderr)
            continue
        for row, modes in json.loads(run.stdout).items():
            for mode, ms in modes.items():
                config = name if mode == "eager" else f"{mode}, {name}"
                print(f"{row}: {ms:.2f} ms ({config})", file=sys.stderr)
                if row not in result or ms < result[row]:
                    result[row] = ms
                    result[f"{row}_config"] = config
    # A row without a time (every configuration failed) shows n/a and the
    # others still compare.
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
