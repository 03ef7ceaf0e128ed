#!/usr/bin/env bash
# Jobs on a GPU through the real daemons: `conveyorctl run --devices cuda:0`
# starts two workers sharing GPU 0. A 2-stage MLP must end with parameters
# allclose to the CPU reference (`run --in-process`), in fp32 and in bf16
# (whose reference is the CPU's bf16 emulation), and examples/transformer.yaml
# and examples/gpt.yaml must train. Skipped (exit 77) where no worker can
# open cuda:0. Needs WORKER and CONVEYORCTL (the binaries' paths).
set -u
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/daemon_test_lib.sh"

# A worker that cannot use the device exits 1 at once, saying why.
timeout 10 "$worker" --devices cuda:0 --coordinator 127.0.0.1:1 \
  >"$dir/probe.log" 2>&1
if grep -q -- "--devices" "$dir/probe.log"; then
  echo "skipped: $(head -1 "$dir/probe.log")"
  exit 77
fi

mlp() {  # mlp DIR PRECISION
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
pipeline: {schedule: 1f1b}
checkpoint: {dir: $1}
YAML
}
allclose() {  # allclose A B RTOL ATOL: every tensor of two safetensors files
  python3 - "$@" <<'PY'
import json, struct, sys
def tensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = struct.unpack(f"<{(e - b) // 4}f", body[b:e])
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
rtol, atol = float(sys.argv[3]), float(sys.argv[4])
if a.keys() != b.keys() or not a:
    sys.exit(f"different tensors: {sorted(a)} vs {sorted(b)}")
worst = max(abs(x - y) - rtol * abs(y) for k in a for x, y in zip(a[k], b[k]))
print(f"worst excess over rtol {rtol}: {worst:.3g} (atol {atol})")
sys.exit(0 if worst <= atol else 1)
PY
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
done

for example in transformer gpt; do
  "$ctl" run "$root/examples/$example.yaml" --devices cuda:0 --steps 20 \
    --set "checkpoint.dir=$dir/$example" >"$dir/$example.out" 2>&1
  check "examples/$example.yaml trains on the GPU" test $? -eq 0
done

finish || { tail -n 20 "$dir"/*.out; exit 1; }
