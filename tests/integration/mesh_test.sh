#!/usr/bin/env bash
# Stages data parallel over a worker's devices (pipeline.devices_per_stage),
# through the real daemons: `conveyorctl run` starts workers with a CPU mesh
# of two devices each (--devices cpu:1,cpu:1), every microbatch is split
# over them and the gradients summed; the parameters must end allclose to
# the single-device reference (`run --in-process`). Also the errors: a
# devices_per_stage that does not divide the microbatch, and workers with
# fewer devices than the job asks for. Needs WORKER and CONVEYORCTL.
set -u
ctl=${CONVEYORCTL:?}
source "$(dirname "$0")/daemon_test_lib.sh"

job() {  # job CHECKPOINT_DIR DEVICES_PER_STAGE
  cat <<YAML
name: mesh
model:
  input_shape: [32]
  init: {seed: 3}
  layers:
    - dense: {features: 64}
    - gelu
    - boundary
    - layernorm
    - dense: {features: 16}
  loss: mse
data: {source: synthetic-regression, seed: 5}
training: {steps: 8, batch_size: 32, microbatches: 4}
optimizer: {kind: sgd, lr: 0.05, momentum: 0.9}
pipeline: {schedule: 1f1b, devices_per_stage: $2}
checkpoint: {dir: $1}
YAML
}

job "$dir/mesh" 2 >"$dir/mesh.yaml"
job "$dir/ref" 2 >"$dir/ref.yaml"
"$ctl" run "$dir/mesh.yaml" >"$dir/mesh.out" 2>&1
# (The coordinator refuses the job unless the workers have two devices.)
check "2 stages on 2-device CPU meshes succeed" test $? -eq 0
check "... saying so, and that CPU tensors stay on TCP" grep -q \
  "2 devices per stage; data plane: tcp (rank 0 runs on the CPU)" "$dir/mesh.out"
"$ctl" run "$dir/ref.yaml" --in-process >"$dir/ref.out" 2>&1
check "the single-device reference succeeds" test $? -eq 0
"$ctl" export "$dir/mesh" -o "$dir/mesh.safetensors" >/dev/null
check "mesh parameters allclose to the single-device reference" \
  allclose "$dir/mesh.safetensors" "$dir/ref/params.safetensors" 1e-5 1e-6

# 32 / 4 = 8 samples per microbatch: 3 devices cannot share them evenly.
job "$dir/three" 3 >"$dir/three.yaml"
"$ctl" run "$dir/three.yaml" >"$dir/three.out" 2>&1
check "an uneven split is refused" test $? -ne 0
check "... at the setting's position" grep -q \
  "three.yaml:15:47: pipeline.devices_per_stage: each device of a stage takes an equal share" \
  "$dir/three.out"

"$ctl" run "$dir/mesh.yaml" --devices cpu:1 >"$dir/few.out" 2>&1
check "workers with too few devices are refused" test $? -ne 0
check "... naming devices_per_stage" grep -q \
  "gives a worker 1 device(s); the job's pipeline.devices_per_stage" "$dir/few.out"

finish || { tail -n 20 "$dir"/*.out; exit 1; }
