#!/usr/bin/env bash
# Issue 37 (c): the Llama-3.2-1B-shaped model (bench/gpu_benchmark.cc's
# llama/conveyor_llama_1b_resident) as a 2-stage 1f1b pipeline on two
# workers sharing one device, through the real daemons (`conveyorctl run`),
# in bf16. Prints the last step's line (tokens/s, TFLOP/s, memory) and its
# bubble, measured and simulated at the step's own stage costs (the split
# `conveyorctl trace` makes), and judges the target: within 3 points.
#
#   bench/llama_pipeline.sh CONVEYORCTL WORK_DIR [--tiny]
#
# Devices: CONVEYOR_LLAMA_DEVICES (default cuda:0). Blocks:
# CONVEYOR_GPU_LLAMA_BLOCKS (default 16, cut in the middle). --tiny runs a
# small model of the same shape on the CPU, for tests (which check that
# the figures are printed; a timing is judged only here, on the GPU).
# Exits 1 when the run fails or the bubble misses its target.
set -uo pipefail
ctl=${1:?usage: llama_pipeline.sh CONVEYORCTL WORK_DIR [--tiny]}
work=${2:?usage: llama_pipeline.sh CONVEYORCTL WORK_DIR [--tiny]}
tiny=${3:-}
mkdir -p "$work"
devices=${CONVEYOR_LLAMA_DEVICES:-cuda:0}
blocks=${CONVEYOR_GPU_LLAMA_BLOCKS:-16}
d=2048 heads=32 kv=8 mlp=8192 vocab=128256 seq=2048 steps=6 precision=bf16
if [ "$tiny" = --tiny ]; then
  devices=${CONVEYOR_LLAMA_DEVICES:-cpu}
  blocks=2 d=64 heads=4 kv=2 mlp=128 vocab=512 seq=32 steps=4
fi
half=$(((blocks + 1) / 2))
# Random ids, enough for every step's 4 sequences (and the next tokens).
python3 - "$work/tokens.u32" "$vocab" $((steps * 4 * (seq + 1) + seq)) <<'PY'
import random, struct, sys
path, vocab, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(0)
with open(path, "wb") as f:
    f.write(struct.pack(f"<{n}I", *(rng.randrange(vocab) for _ in range(n))))
PY
cat >"$work/llama_pipeline.yaml" <<YAML
name: llama-pipeline
model:
  input_shape: [$seq]
  init: {seed: 0}
  layers:
    - embedding: {vocab_size: $vocab, features: $d}
    - repeat: $blocks
      boundary_every: $half
      layers:
        - llama_block: {heads: $heads, kv_heads: $kv, mlp_features: $mlp, eps: 1.0e-5, rope_theta: 500000}
    - rmsnorm: {eps: 1.0e-5}
    - lm_head: {vocab_size: $vocab, tied: true}
  loss: cross_entropy
data: {source: tokens, path: $work/tokens.u32, dtype: uint32, seq_len: $seq}
training: {steps: $steps, batch_size: 4, microbatches: 4, precision: $precision}
optimizer: {kind: adamw, lr: 0.0003, weight_decay: 0.1}
pipeline: {schedule: 1f1b}
checkpoint: {dir: $work/checkpoint}
YAML
"$ctl" run "$work/llama_pipeline.yaml" --devices "$devices" --overwrite \
  --log-every 1 >"$work/llama_pipeline.out" 2>&1
rc=$?
if [ "$rc" != 0 ]; then
  echo "(Llama pipeline: conveyorctl run exit $rc; the end of its output:)"
  tail -n 15 "$work/llama_pipeline.out" | sed 's/^/  /'
  exit 1
fi
python3 - "$work/llama_pipeline.out" "$blocks" "$devices" <<'PY'
import re, sys
out, blocks, devices = open(sys.argv[1]).read(), sys.argv[2], sys.argv[3]
steps = [l for l in out.splitlines() if l.startswith("step ")]
m = re.search(r"last step's bubble ([0-9.]+)% measured; simulated for these actions: "
              r"([0-9.]+)% at this step's stage costs", out)
print(f"Llama-3.2-1B-shaped model, {blocks} blocks, 2 stages (1f1b, 4 microbatches, bf16) "
      f"on two workers sharing {devices}:")
print(f"  last step: {steps[-1] if steps else '(no step line)'}")
if m is None:
    print("  no bubble line in the run's output")
    sys.exit(1)
measured, simulated = float(m.group(1)), float(m.group(2))
gap = measured - simulated
ok = abs(gap) <= 3.0
print(f"  bubble {measured:.1f}% measured, {simulated:.1f}% simulated at the step's stage "
      f"costs: {gap:+.1f} points  target within 3  {'ok' if ok else 'OVER TARGET'}")
sys.exit(0 if ok else 2)
PY
verdict=$?
# Exit 2 is the bubble's verdict, which the tiny CPU run does not judge.
if [ "$verdict" = 2 ] && [ "$tiny" = --tiny ]; then exit 0; fi
[ "$verdict" = 0 ]
