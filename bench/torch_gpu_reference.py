#!/usr/bin/env python3
"""The GPU counterpart of bench/gpu_benchmark.cc in PyTorch, for the
Conveyor/PyTorch step-time ratio in scripts/bench (bench/README-gpu.md).

The JaxPP notebook's transformer: 8 post-norm blocks (nn.TransformerEncoderLayer,
norm_first=False: x = norm1(x + attn(x)); x = norm2(x + mlp(x))), d_model 1024,
8 heads, MLP 4096 with exact (erf) GELU, biases everywhere, layernorm eps 1e-5,
no dropout; sequence 2048, batch 8 in 4 microbatches (loss / 4, gradients
accumulated), MSE loss, AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
weight decay 0.01): what Conveyor's transformer_block and adamw compute.

Precision (--precision, default fp32) matches CONVEYOR_GPU_PRECISION:
  fp32  TF32 off for matmuls (Conveyor's default: CUBLAS_COMPUTE_32F)
  tf32  TF32 on (Conveyor's allow_tf32: CUBLAS_COMPUTE_32F_FAST_TF32)
  bf16  autocast to bfloat16, the nearest PyTorch analogue of Conveyor's bf16
        GEMMs (which keep activations fp32, so not like for like)

Timed, each as the mean of CUDA-synchronized steps after 3 warm-up steps (the
mean, as gpu_benchmark.cc's manual time is, so the ratio compares like with
like):
  ms_per_step            data already on the GPU; attention as PyTorch picks it
                         (scaled_dot_product_attention: a fused kernel that
                         never materializes the [B, H, S, S] scores)
  ms_per_step_host_data  each microbatch copied from pageable host memory, as
                         Conveyor's InProcessTrainer uploads its data
  ms_per_step_math_attention  data on the GPU, attention forced to the math
                         backend (scores materialized, as Conveyor does); null
                         where this PyTorch cannot choose
and the GEMMs of gpu_benchmark.cc (same names) through torch.matmul, as
TFLOP/s, for context.

Prints one JSON object on stdout. Exits 77 (skip) without torch or CUDA.
Environment: CONVEYOR_BENCH_SECONDS (per timed case, default 5).
"""
import argparse
import contextlib
import inspect
import json
import os
import statistics
import sys
import time

SEQ, D_MODEL, HEADS, MLP, BLOCKS, BATCH, MICROBATCHES = 2048, 1024, 8, 4096, 8, 8, 4
TOKENS = BATCH // MICROBATCHES * SEQ
HEAD_DIM = D_MODEL // HEADS
BH = BATCH // MICROBATCHES * HEADS

# (name, trans_a, trans_b, batch, m, n, k, beta), as in gpu_benchmark.cc.
GEMMS = [
    ("qkv_fwd", False, True, 1, TOKENS, 3 * D_MODEL, D_MODEL, 0),
    ("out_fwd", False, True, 1, TOKENS, D_MODEL, D_MODEL, 0),
    ("mlp_up_fwd", False, True, 1, TOKENS, MLP, D_MODEL, 0),
    ("mlp_down_fwd", False, True, 1, TOKENS, D_MODEL, MLP, 0),
    ("qkv_dx", False, False, 1, TOKENS, D_MODEL, 3 * D_MODEL, 0),
    ("out_dx", False, False, 1, TOKENS, D_MODEL, D_MODEL, 0),
    ("mlp_up_dx", False, False, 1, TOKENS, D_MODEL, MLP, 0),
    ("mlp_down_dx", False, False, 1, TOKENS, MLP, D_MODEL, 0),
    ("qkv_dw", True, False, 1, 3 * D_MODEL, D_MODEL, TOKENS, 1),
    ("out_dw", True, False, 1, D_MODEL, D_MODEL, TOKENS, 1),
    ("mlp_up_dw", True, False, 1, MLP, D_MODEL, TOKENS, 1),
    ("mlp_down_dw", True, False, 1, D_MODEL, MLP, TOKENS, 1),
    ("scores", False, True, BH, SEQ, SEQ, HEAD_DIM, 0),
    ("context", False, False, BH, SEQ, HEAD_DIM, SEQ, 0),
    ("attn_dvdk", True, False, BH, SEQ, HEAD_DIM, SEQ, 0),
]


def shape_name(name, ta, tb, batch, m, n, k):
    ops = ("T" if ta else "N") + ("T" if tb else "N")
    dims = (f"{batch}x" if batch > 1 else "") + f"{m}x{n}x{k}"
    return f"{name}_{ops}_{dims}"


def math_attention(torch):
    """A context that forces scaled_dot_product_attention onto its math
    backend, or None where this PyTorch has no such switch (before 2.0,
    attention is always plain matmuls)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel  # 2.3+
        return lambda: sdpa_kernel(SDPBackend.MATH)
    except ImportError:
        pass
    kernel = getattr(torch.backends.cuda, "sdp_kernel", None)  # 2.0 - 2.2
    if kernel is None:
        return None
    params = inspect.signature(kernel).parameters
    if "enable_mem_efficient" not in params:
        return None  # 1.13's prototype: multi-head attention never uses it
    return lambda: kernel(enable_flash=False, enable_math=True,
                          enable_mem_efficient=False)


def build_model(torch, nn):
    torch.manual_seed(0)
    layers = [nn.TransformerEncoderLayer(
        d_model=D_MODEL, nhead=HEADS, dim_feedforward=MLP, dropout=0.0,
        activation="gelu", layer_norm_eps=1e-5, batch_first=True,
        norm_first=False) for _ in range(BLOCKS)]
    return nn.Sequential(*layers).cuda()


def time_steps(torch, nn, precision, seconds, host_data=False, context=None):
    model = build_model(torch, nn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999),
                            eps=1e-8, weight_decay=0.01)
    mb = BATCH // MICROBATCHES
    device = "cpu" if host_data else "cuda"
    xs = [torch.randn(mb, SEQ, D_MODEL, device=device) for _ in range(MICROBATCHES)]
    ys = [torch.randn(mb, SEQ, D_MODEL, device=device) for _ in range(MICROBATCHES)]
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) \
        if precision == "bf16" else contextlib.nullcontext

    def step():
        opt.zero_grad(set_to_none=False)
        for x, y in zip(xs, ys):
            if host_data:
                x, y = x.to("cuda"), y.to("cuda")
            with autocast():
                out = model(x)
            loss = nn.functional.mse_loss(out.float(), y) / MICROBATCHES
            loss.backward()
        opt.step()

    with (context() if context else contextlib.nullcontext()):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        times = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(times) < 10:
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)
    del model, opt, xs, ys
    torch.cuda.empty_cache()
    return statistics.fmean(times), len(times)


def time_gemms(torch, precision, seconds):
    """torch.matmul (mm/addmm/bmm with out=) on gpu_benchmark.cc's shapes,
    transposes as strided views: TFLOP/s from CUDA events."""
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    results = {}
    for name, ta, tb, batch, m, n, k, beta in GEMMS:
        def operand(rows, cols, trans):
            shape = (batch, cols, rows) if trans else (batch, rows, cols)
            t = torch.rand(*shape, device="cuda", dtype=dtype) * 2 - 1
            t = t.transpose(1, 2) if trans else t
            return t if batch > 1 else t[0]
        a, b = operand(m, k, ta), operand(k, n, tb)
        c = torch.rand(*((batch, m, n) if batch > 1 else (m, n)), device="cuda",
                       dtype=dtype if precision == "bf16" else torch.float32)

        def call():
            if batch > 1:
                torch.bmm(a, b, out=c)
            elif beta:
                c.addmm_(a, b)
            else:
                torch.mm(a, b, out=c)

        for _ in range(5):
            call()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        calls, ms = 0, 0.0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or calls < 20:
            start.record()
            for _ in range(10):
                call()
            stop.record()
            stop.synchronize()
            ms += start.elapsed_time(stop)
            calls += 10
        flops = 2.0 * batch * m * n * k
        results[shape_name(name, ta, tb, batch, m, n, k)] = {
            "tflops": flops * calls / (ms / 1e3) / 1e12,
            "us_per_call": ms * 1e3 / calls,
        }
        del a, b, c
    torch.cuda.empty_cache()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=["fp32", "tf32", "bf16"],
                        default=os.environ.get("CONVEYOR_GPU_PRECISION") or "fp32")
    parser.add_argument("--no-gemm", action="store_true", help="skip the GEMM section")
    parser.add_argument("--no-variants", action="store_true",
                        help="time only ms_per_step (no host-data or math-attention runs)")
    args = parser.parse_args()
    seconds = float(os.environ.get("CONVEYOR_BENCH_SECONDS", "5"))
    try:
        import torch
        from torch import nn
    except ImportError as e:
        print(f"torch_gpu_reference: PyTorch is not installed ({e}); skipping",
              file=sys.stderr)
        sys.exit(77)
    if not torch.cuda.is_available():
        print(f"torch_gpu_reference: torch {torch.__version__} sees no CUDA GPU "
              f"(built with CUDA {torch.version.cuda}); skipping", file=sys.stderr)
        sys.exit(77)

    tf32 = args.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if hasattr(torch, "set_float32_matmul_precision"):
        torch.set_float32_matmul_precision("high" if tf32 else "highest")

    result = {
        "gpu": torch.cuda.get_device_name(0),
        "torch_version": torch.__version__,
        "cuda": torch.version.cuda,
        "precision": args.precision,
    }
    ms, steps = time_steps(torch, nn, args.precision, seconds)
    result.update({"ms_per_step": ms, "steps": steps,
                   "tokens_per_s": BATCH * SEQ / (ms / 1e3)})
    if not args.no_variants:
        result["ms_per_step_host_data"], _ = time_steps(
            torch, nn, args.precision, seconds, host_data=True)
        math = math_attention(torch)
        result["ms_per_step_math_attention"] = None if math is None else time_steps(
            torch, nn, args.precision, seconds, context=math)[0]
    if not args.no_gemm:
        result["gemm"] = time_gemms(torch, args.precision, min(seconds, 0.5))
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
