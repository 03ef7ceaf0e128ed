#!/usr/bin/env python3
"""PyTorch's side of the Llama-3.2-1B-shaped stage in bench/gpu_benchmark.cc
(llama/conveyor_llama_1b_resident), for scripts/gpu-check (issue 37 (b)).

The model, as HF's Llama-3.2-1B builds it: token embedding (vocabulary
128256, d_model 2048) tied to the output head, N pre-norm blocks (RMSNorm eps
1e-5; attention with 32 query and 8 key/value heads of 64, RoPE theta 500000,
no biases; SwiGLU 8192), a final RMSNorm. Sequence 2048, 4 sequences a step
in 4 microbatches (loss / 4, gradients accumulated), cross-entropy on the
next tokens, AdamW (lr 3e-4, weight decay 0.1; fused where this PyTorch has
it). N: CONVEYOR_GPU_LLAMA_BLOCKS (default 16), as the Conveyor side reads it.

Precision (--precision, default bf16): bf16 autocast (fp32 master weights and
optimizer state), or fp32 / tf32. Timed, as the mean of CUDA-synchronized
steps after 3 warm-up steps:
  eager     attention by scaled_dot_product_attention (fused), the rest as is
  compiled  the same under torch.compile, block by block as TorchTitan
            compiles (one compilation serves every block); the compile time
            is reported, not timed; null with the reason where torch.compile
            is missing or fails
Prints one JSON object on stdout. Exits 77 (skip) without torch or CUDA.
--device cpu --tiny runs a small model on the CPU, to test this script.
Environment: CONVEYOR_BENCH_SECONDS (per timed case, default 5).
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

D_MODEL, HEADS, KV_HEADS, MLP, VOCAB, SEQ = 2048, 32, 8, 8192, 128256, 2048
BATCH, MICROBATCHES, THETA, EPS = 4, 4, 500000.0, 1e-5
TINY = dict(D_MODEL=64, HEADS=4, KV_HEADS=2, MLP=128, VOCAB=512, SEQ=32)


def build(torch, nn, blocks, shape):
    d, heads, kv_heads, mlp, vocab = (shape[k] for k in
                                      ("D_MODEL", "HEADS", "KV_HEADS", "MLP", "VOCAB"))
    head_dim = d // heads
    F = nn.functional
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
            return self.weight * h.type_as(x)

    def rotate_half(x):
        a, b = x.chunk(2, dim=-1)
        return torch.cat((-b, a), dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = RMSNorm(), RMSNorm()
            self.q = nn.Linear(d, heads * head_dim, bias=False)
            self.k = nn.Linear(d, kv_heads * head_dim, bias=False)
            self.v = nn.Linear(d, kv_heads * head_dim, bias=False)
            self.o = nn.Linear(heads * head_dim, d, bias=False)
            self.gate = nn.Linear(d, mlp, bias=False)
            self.up = nn.Linear(d, mlp, bias=False)
            self.down = nn.Linear(mlp, d, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            h = self.attn_norm(x)
            q = self.q(h).view(b, s, heads, head_dim).transpose(1, 2)
            k = self.k(h).view(b, s, kv_heads, head_dim).transpose(1, 2)
            v = self.v(h).view(b, s, kv_heads, head_dim).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(heads // kv_heads, dim=1)
            v = v.repeat_interleave(heads // kv_heads, dim=1)
            if sdpa is not None:
                a = sdpa(q, k, v, is_causal=True)
            else:  # PyTorch 1.x: the scores, materialized.
                scores = q @ k.transpose(-1, -2) / head_dim ** 0.5
                mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
                a = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
            x = x + self.o(a.transpose(1, 2).reshape(b, s, heads * head_dim))
            h = self.mlp_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(blocks))
            self.norm = RMSNorm()
            self.head = nn.Linear(d, vocab, bias=False)
            self.head.weight = self.embed.weight  # Tied, as Llama-3.2-1B.
            inv = 1.0 / THETA ** (torch.arange(0, head_dim, 2).float() / head_dim)
            angles = torch.outer(torch.arange(shape["SEQ"]).float(), inv)
            angles = torch.cat((angles, angles), dim=-1)
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)

        def forward(self, ids):
            x = self.embed(ids)
            cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
            for block in self.blocks:
                x = block(x, cos, sin)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    model = Llama()
    for m in model.modules():  # HF's initializer_range.
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
    return model


def time_steps(torch, nn, model, device, precision, seconds, shape):
    vocab, seq = shape["VOCAB"], shape["SEQ"]
    kwargs = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    try:
        opt = torch.optim.AdamW(model.parameters(), fused=device == "cuda", **kwargs)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(model.parameters(), **kwargs)
    rows = BATCH // MICROBATCHES
    gen = torch.Generator().manual_seed(1)
    data = [torch.randint(0, vocab, (rows, seq + 1), generator=gen).to(device)
            for _ in range(MICROBATCHES)]
    autocast = (lambda: torch.autocast(device, dtype=torch.bfloat16)) \
        if precision == "bf16" else contextlib.nullcontext
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step():
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for tokens in data:
            with autocast():
                logits = model(tokens[:, :-1])
            loss = nn.functional.cross_entropy(
                logits.float().reshape(-1, vocab), tokens[:, 1:].reshape(-1))
            (loss / MICROBATCHES).backward()
            total += loss.detach()
        opt.step()
        return total

    first = time.perf_counter()
    for _ in range(3):
        step()
    sync()
    warmup_s = time.perf_counter() - first
    times = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(times) < 5:
        start = time.perf_counter()
        loss = step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    ms = statistics.fmean(times)
    return {"ms_per_step": ms, "steps": len(times),
            "tokens_per_s": BATCH * seq / (ms / 1e3),
            "warmup_s": warmup_s, "loss": float(loss) / MICROBATCHES}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=["fp32", "tf32", "bf16"],
                        default=os.environ.get("CONVEYOR_GPU_PRECISION") or "bf16")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a small model")
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    seconds = float(os.environ.get("CONVEYOR_BENCH_SECONDS", "5"))
    blocks = int(os.environ.get("CONVEYOR_GPU_LLAMA_BLOCKS", "16"))
    shape = dict(D_MODEL=D_MODEL, HEADS=HEADS, KV_HEADS=KV_HEADS, MLP=MLP,
                 VOCAB=VOCAB, SEQ=SEQ)
    if args.tiny:
        shape.update(TINY)
        blocks = min(blocks, 2)
    try:
        import torch
        from torch import nn
    except ImportError as e:
        print(f"torch_llama_reference: PyTorch is not installed ({e}); skipping",
              file=sys.stderr)
        sys.exit(77)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"torch_llama_reference: torch {torch.__version__} sees no CUDA GPU; "
              "skipping", file=sys.stderr)
        sys.exit(77)
    tf32 = args.precision == "tf32"
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32

    result = {"torch_version": torch.__version__, "precision": args.precision,
              "blocks": blocks, "device": args.device,
              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None}
    model = build(torch, nn, blocks, shape).to(args.device)
    result["eager"] = time_steps(torch, nn, model, args.device, args.precision,
                                 seconds, shape)
    if args.device == "cuda":
        result["eager"]["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    result["compiled"] = None
    if args.no_compile:
        result["compiled_error"] = "--no-compile"
    elif not hasattr(torch, "compile"):
        result["compiled_error"] = f"torch {torch.__version__} has no torch.compile"
    else:
        try:
            # One compilation per block object where this PyTorch keys its
            # cache on the module: room for all, so none falls back to eager.
            dynamo = getattr(getattr(torch, "_dynamo", None), "config", None)
            if dynamo is not None and hasattr(dynamo, "cache_size_limit"):
                dynamo.cache_size_limit = max(dynamo.cache_size_limit, 2 * blocks + 8)
            for i, block in enumerate(model.blocks):
                model.blocks[i] = torch.compile(block)
            result["compiled"] = time_steps(torch, nn, model, args.device,
                                            args.precision, seconds, shape)
        except Exception as e:  # A failed compile is a figure, not a crash.
            result["compiled_error"] = f"{type(e).__name__}: {e}"[:500]
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
