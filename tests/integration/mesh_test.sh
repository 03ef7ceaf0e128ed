#!/usr/bin/env bash
# Stages data parallel over a worker's devices (pipeline.devices_per_stage),
# through the real daemons: `conveyorctl run` starts workers with a CPU mesh
# of two devices each (--devices cpu:1,cpu:1), every microbatch is split
# over them and the gradients summed; the parameters must end allclose to
# the single-device reference (`run --in-process`). Also the errors: a
# devices_per_stage that does not divide the microbatch, and workers with
# fewer devices than the job asks for. And tensor parallelism
# (pipeline.tensor_parallel): Llama stages split over the two devices of
# each worker, allclose to the in-process run. Needs WORKER and CONVEYORCTL.
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
  "three.yaml:15:47: pipeline.devices_per_stage: each replica of a stage (devices_per_stage / tensor_parallel = 3) takes an equal share" \
  "$dir/three.out"

"$ctl" run "$dir/mesh.yaml" --devices cpu:1 >"$dir/few.out" 2>&1
check "workers with too few devices are refused" test $? -ne 0
check "... naming devices_per_stage" grep -q \
  "gives a worker 1 device(s); the job's pipeline.devices_per_stage" "$dir/few.out"

# Tensor parallel: each worker's two CPU devices hold one replica of its
# stage split over 2 ranks (4 heads sharing 2 key/value heads, 32 hidden
# units). The split reorders f32 sums only, a few ulps a step.
llama() {  # llama CHECKPOINT_DIR TENSOR_PARALLEL
  cat <<YAML
name: tp
model:
  input_shape: [16]
  init: {seed: 3}
  layers:
    - embedding: {vocab_size: 256, features: 16}
    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 32}
    - boundary
    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 32}
    - rmsnorm
    - lm_head: {vocab_size: 256}
  loss: cross_entropy
data: {source: tokens, path: $dir/text.bin, seq_len: 16}
training: {steps: 6, batch_size: 8, microbatches: 2}
optimizer: {kind: sgd, lr: 0.1, momentum: 0.9}
pipeline: {schedule: 1f1b, devices_per_stage: 2, tensor_parallel: $2}
checkpoint: {dir: $1}
YAML
}
head -c 4000 "$(dirname "$0")/daemon_test_lib.sh" >"$dir/text.bin"
llama "$dir/tp" 2 >"$dir/tp.yaml"
llama "$dir/tp_ref" 2 >"$dir/tp_ref.yaml"
"$ctl" run "$dir/tp.yaml" >"$dir/tp.out" 2>&1
check "Llama stages split over 2 tensor-parallel ranks succeed" test $? -eq 0
"$ctl" run "$dir/tp_ref.yaml" --in-process >"$dir/tp_ref.out" 2>&1
check "the in-process reference succeeds" test $? -eq 0
"$ctl" export "$dir/tp" -o "$dir/tp.safetensors" >/dev/null
check "tensor-parallel parameters allclose to the in-process run" \
  allclose "$dir/tp.safetensors" "$dir/tp_ref/params.safetensors" 1e-4 1e-5
"$ctl" validate "$dir/tp.yaml" >"$dir/tp_validate.out" 2>&1
check "validate shows the layout" grep -q \
  "1 replica(s) (data parallel, each microbatch's rows split over them) x 2 tensor-parallel rank(s)" \
  "$dir/tp_validate.out"
llama "$dir/tp3" 3 | sed 's/devices_per_stage: 2/devices_per_stage: 6/' >"$dir/tp3.yaml"
"$ctl" validate "$dir/tp3.yaml" >"$dir/tp3.out" 2>&1
check "heads that do not split over 3 ranks are refused" test $? -ne 0
check "... at the layer" grep -q "tp3.yaml:7:7: model.layers\[1\]: llama_block (layer 1): heads (4) does not split over 3" "$dir/tp3.out"

finish || { tail -n 20 "$dir"/*.out; exit 1; }
