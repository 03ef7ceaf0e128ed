#!/usr/bin/env bash
# Jobs on GPUs through the real daemons. `conveyorctl run --devices cuda:0`
# starts two workers sharing GPU 0 (tensors over TCP): a 2-stage MLP must end
# with parameters allclose to the CPU reference (`run --in-process`), in fp32
# and in bf16 (whose reference is the CPU's bf16 emulation), and
# examples/transformer.yaml and examples/gpt.yaml must train. With two GPUs
# or more, also: one worker per GPU (`--devices cuda:0 --devices cuda:1`),
# whose tensors must go over NCCL, and stages data parallel over a mesh of
# two GPUs (`devices_per_stage: 2`, `--devices cuda:0,1`), both allclose to
# the reference. Skipped (exit 77) where no worker can open cuda:0. Needs
# WORKER and CONVEYORCTL (the binaries' paths).
set -u
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/daemon_test_lib.sh"

# A worker that cannot use the device exits 1 at once, saying why.
timeout -k 5 10 "$worker" --devices cuda:0 --coordinator 127.0.0.1:1 \
  >"$dir/probe.log" 2>&1
if grep -q -- "--devices" "$dir/probe.log"; then
  echo "skipped: $(head -1 "$dir/probe.log")"
  exit 77
fi

mlp() {  # mlp DIR PRECISION [DEVICES_PER_STAGE]
  cat <<YAML
name: gpu-mlp
model:
  input_shape: [128]
  init: {seed: 0}
  layers:
    - dense: {features: 512}
    - gelu
    - boundary
    - layernorm
    - dense: {features: 128}
  loss: mse
data: {source: synthetic-regression, seed: 0}
training: {steps: 10, batch_size: 64, microbatches: 4, precision: $2}
optimizer: {kind: sgd, lr: 0.05}
pipeline: {schedule: 1f1b, devices_per_stage: ${3:-1}}
checkpoint: {dir: $1}
YAML
}

for precision in fp32 bf16; do
  mlp "$dir/gpu-$precision" "$precision" >"$dir/gpu-$precision.yaml"
  mlp "$dir/cpu-$precision" "$precision" >"$dir/cpu-$precision.yaml"
  "$ctl" run "$dir/gpu-$precision.yaml" --devices cuda:0 >"$dir/gpu-$precision.out" 2>&1
  check "$precision: 2 stages on one GPU succeed" test $? -eq 0
  "$ctl" run "$dir/cpu-$precision.yaml" --in-process >"$dir/cpu-$precision.out" 2>&1
  check "$precision: CPU reference succeeds" test $? -eq 0
  "$ctl" export "$dir/gpu-$precision" -o "$dir/gpu-$precision.safetensors" >/dev/null
  check "$precision: GPU parameters allclose to the CPU's" \
    allclose "$dir/gpu-$precision.safetensors" "$dir/cpu-$precision/params.safetensors" 1e-4 1e-5
  # The backend knows the GPU's peak (engine/device_peak.h): MFU without
  # --peak-tflops, in (0, 1].
  check "$precision: GPU steps report an MFU in (0, 1]" python3 - "$dir/gpu-$precision/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert rows and all(0 < r["mfu"] <= 1 for r in rows), rows[-1]
PY
done

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
if [ "${gpus:-0}" -ge 2 ]; then
  # One worker per GPU: the coordinator puts the tensors on NCCL.
  mlp "$dir/nccl" fp32 >"$dir/nccl.yaml"
  "$ctl" run "$dir/nccl.yaml" --devices cuda:0 --devices cuda:1 >"$dir/nccl.out" 2>&1
  check "one worker per GPU succeeds" test $? -eq 0
  check "... with its tensors over NCCL" grep -q "data plane: nccl" "$dir/nccl.out"
  "$ctl" export "$dir/nccl" -o "$dir/nccl.safetensors" >/dev/null
  check "NCCL parameters allclose to the CPU's" \
    allclose "$dir/nccl.safetensors" "$dir/cpu-fp32/params.safetensors" 1e-4 1e-5
  # Each stage data parallel over both GPUs (the workers share the mesh).
  mlp "$dir/mesh" fp32 2 >"$dir/mesh.yaml"
  "$ctl" run "$dir/mesh.yaml" --devices cuda:0,1 >"$dir/mesh.out" 2>&1
  check "stages on a mesh of two GPUs succeed" test $? -eq 0
  "$ctl" export "$dir/mesh" -o "$dir/mesh.safetensors" >/dev/null
  check "mesh parameters allclose to the CPU's" \
    allclose "$dir/mesh.safetensors" "$dir/cpu-fp32/params.safetensors" 1e-4 1e-5
else
  echo "fewer than 2 GPUs: NCCL and mesh runs not tried"
fi

for example in transformer gpt; do
  "$ctl" run "$root/examples/$example.yaml" --devices cuda:0 --steps 20 \
    --set "checkpoint.dir=$dir/$example" >"$dir/$example.out" 2>&1
  check "examples/$example.yaml trains on the GPU" test $? -eq 0
done

finish || { tail -n 20 "$dir"/*.out; exit 1; }
