#!/usr/bin/env python3
"""The Llama-3.2-1B-shaped stage's table for bench/gpu_section.sh: Conveyor's
step (bench/gpu_benchmark.cc, llama/conveyor_llama_1b_resident) against
PyTorch's eager and compiled ones (bench/torch_llama_reference.py), in ms,
tokens/s and MFU. Both sides' MFU use the Conveyor benchmark's model FLOPs
per step and the GPU's dense peak (engine/device_peak.h), so one formula
counts for both. Targets (issue 37): Conveyor / PyTorch's fastest <= 1.0,
MFU >= 0.45. Exits 1 when a figure misses its target or Conveyor's run
failed.

  llama_table.py GPU_LLAMA_JSON TORCH_LLAMA_JSON
"""
import json
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"({path}: {e})")
        return None


def main():
    ours, theirs = load(sys.argv[1]), load(sys.argv[2]) or {}
    runs = [b for b in (ours or {}).get("benchmarks", [])
            if b["run_name"].startswith("llama/")]
    if not runs or runs[0].get("error_occurred"):
        why = runs[0].get("error_message", "?") if runs else "no result"
        print(f"Llama stage: Conveyor's run failed: {why}")
        return 1
    b = runs[0]
    flops, peak = b.get("flops_per_step"), b.get("peak_tflops")
    blocks = int(b.get("blocks", 0))

    def mfu(ms):
        if not flops or not peak or not ms:
            return None
        return flops / (ms / 1e3) / (peak * 1e12)

    rows = [("Conveyor", b["ms_per_step"], b.get("tokens_per_s"))]
    for kind in ("eager", "compiled"):
        r = theirs.get(kind)
        if r:
            rows.append((f"PyTorch {kind}", r["ms_per_step"], r["tokens_per_s"]))
        elif theirs:
            why = theirs.get("compiled_error", "not run") if kind == "compiled" else "failed"
            print(f"(PyTorch {kind}: {why})")
    if theirs.get("blocks") not in (None, blocks):
        print(f"WARNING: PyTorch ran {theirs['blocks']} blocks, Conveyor {blocks}")
    print()
    print(f"{'Llama-3.2-1B-shaped stage, bf16':<34} {'ms/step':>9} {'tokens/s':>10} {'MFU':>7}")
    for name, ms, tps in rows:
        m = mfu(ms)
        print(f"{name:<34} {ms:>9.1f} {tps:>10.0f} "
              f"{'n/a' if m is None else f'{100 * m:.1f}%':>7}")
    failed = 0
    torch_rows = rows[1:]
    if torch_rows:
        fastest = min(torch_rows, key=lambda r: r[1])
        ratio = rows[0][1] / fastest[1]
        ok = ratio <= 1.0
        failed += not ok
        print(f"Conveyor / {fastest[0]} (the fastest): {ratio:.3f}  target <= 1.0 "
              f"(stretch 0.85)  {'ok' if ok else 'SLOWER'}")
    m = mfu(rows[0][1])
    if m is not None:
        ok = m >= 0.45
        failed += not ok
        print(f"Conveyor MFU {100 * m:.1f}% of {peak:.0f} TFLOP/s  target >= 45%  "
              f"{'ok' if ok else 'BELOW TARGET'}")
    print(f"({blocks} blocks of d 2048, 32/8 heads, SwiGLU 8192, vocabulary 128256 "
          f"tied, sequence 2048, 4 sequences in 4 microbatches, AdamW; peak memory "
          f"Conveyor {b.get('peak_GiB', float('nan')):.1f} GiB, PyTorch eager "
          f"{theirs.get('eager', {}).get('peak_gib', float('nan')):.1f} GiB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
