#!/usr/bin/env bash
# Runs the conveyorctl binary as a user would: exit codes, --help for every
# subcommand, --version, and each output format. With CONVEYOR_FAKE_BIN_DIR
# (stand-ins for conveyor-coordinator and conveyor-worker, built from
# tests/cli/fake_*_main.cc), also the commands that talk to a coordinator and
# `run` on a local cluster, interruption included. Prints "N passed, N failed".
set -u
ctl=${CONVEYORCTL:?set CONVEYORCTL to the conveyorctl binary}
tmp=$(mktemp -d)
fake_pids=()
cleanup() {
  for pid in "${fake_pids[@]}"; do kill "$pid" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
# The local clusters' log directories go here, not to /tmp.
export TMPDIR=$tmp
passed=0 failed=0

check() {  # check NAME EXPECTED_RC GREP_PATTERN -- ARGS...
  local name=$1 want_rc=$2 pattern=$3
  shift 4
  local out rc
  out=$("$ctl" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want_rc" ]; then
    echo "FAIL $name: exit $rc, want $want_rc"; echo "$out" | head -5
    failed=$((failed + 1)); return
  fi
  if [ -n "$pattern" ] && ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL $name: output lacks /$pattern/"; echo "$out" | head -5
    failed=$((failed + 1)); return
  fi
  passed=$((passed + 1))
}

check version 0 '^conveyorctl [0-9]+\.[0-9]+\.[0-9]+ \(revision' -- --version
check help 0 'schedule' -- --help
check schedule_help 0 '--microbatches' -- schedule --help
check run_help 0 '--workers' -- run --help
check submit_help 0 '--set' -- submit --help
check status_help 0 '--coordinator' -- status --help
check watch_help 0 '--log-every' -- watch --help
check cancel_help 0 '--timeout' -- cancel --help
check jobs_help 0 '--coordinator' -- jobs --help
check workers_help 0 '--coordinator' -- workers --help
check validate_help 0 '--set' -- validate --help
check export_help 0 '--output' -- export --help
check no_arguments 2 '^Usage: conveyorctl \[OPTIONS\] SUBCOMMAND' --
check no_arguments_lists_commands 2 '^  drain  ' --
check no_subcommand 2 'subcommand is required' -- --log-level warn
check drain_help 0 '--no-wait' -- drain --help
check global_flag_after_subcommand 0 'Usage: .*conveyorctl jobs' -- \
  jobs --help --log-level warn
check unknown_subcommand 2 '' -- frobnicate
check missing_required 2 '--stages and --microbatches are required' -- schedule -P 4
check bad_kind 2 "allowed: gpipe, 1f1b, interleaved-1f1b, zb-h1" -- \
  schedule --kind zb-w -P 4 -M 8
check bad_format 2 'allowed: text, json, svg' -- schedule -P 2 -M 2 --format png
check bad_costs 2 'expected F,B or F,BI,BW' -- schedule -P 2 -M 2 --costs 1
check zb_needs_split_costs 2 'give --costs F,BI,BW' -- \
  schedule --kind zb-h1 -P 2 -M 2 --costs 1,2
check negative_cost 2 'must be >= 0' -- schedule -P 2 -M 2 --costs 1,-2
check interleaved_needs_multiple 2 'must be a multiple of ranks' -- \
  schedule --kind interleaved-1f1b -P 4 -M 6 -V 2
check bad_log_level 2 'allowed: trace' -- --log-level loud schedule -P 1 -M 1
check jaxpp_vector 0 '^rank 2: F2.0 F2.1 F2.2 B2.0 F2.3 B2.1 B2.2 B2.3$' -- \
  schedule --kind interleaved-1f1b -P 4 -M 4
check closed_form 0 'closed form: 0.2727 = 3/11' -- schedule -P 4 -M 8
check fractional_costs 0 'idle time per rank: 10.5' -- \
  schedule -P 4 -M 8 --costs 1.5,2
check json 0 '"bubble_fraction"' -- schedule --kind zb-h1 -P 4 -M 8 --format json

# Output files: JSON parses and has the documented shape; SVG is a document.
if "$ctl" schedule -P 4 -M 8 --format json -o "$tmp/s.json" &&
   python3 - "$tmp/s.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
assert j["kind"] == "1f1b" and j["ranks"] == 4 and j["virtual"] == 1
assert j["microbatches"] == 8 and len(j["schedule"]) == 4
assert j["schedule"][3]["actions"][0] == {"op": "F", "stage": 3, "microbatch": 0}
assert j["simulation"]["makespan"] == 33
assert j["simulation"]["peak_inflight"] == [4, 3, 2, 1]
assert abs(j["simulation"]["bubble_fraction"] - 3 / 11) < 1e-12
PY
then passed=$((passed + 1)); else echo "FAIL json_file"; failed=$((failed + 1)); fi

if "$ctl" schedule --kind zb-h1 -P 4 -M 8 --format svg -o "$tmp/s.svg" &&
   head -c 200 "$tmp/s.svg" | grep -q '<svg' && tail -c 20 "$tmp/s.svg" | grep -q '</svg>'; then
  passed=$((passed + 1)); else echo "FAIL svg_file"; failed=$((failed + 1)); fi

check too_large_to_render 2 'renders at most 1048576' -- \
  schedule -P 1024 -M 4096 --format json
check int_overflow 2 'overflows 64-bit integer' -- \
  schedule -P 2 -M 2 --costs 9223372036854775807,1
# --from: a hand-edited schedule is validated, simulated and rendered.
"$ctl" schedule -P 2 -M 2 --format json -o "$tmp/good.json"
check from_file 0 '^makespan: 9$' -- schedule --from "$tmp/good.json"
# The file records the costs it was simulated with; flags override them.
"$ctl" schedule -P 2 -M 2 --costs 1,2 --latency 1 --format json -o "$tmp/costed.json"
check from_file_costs 0 '^makespan: 11$' -- schedule --from "$tmp/costed.json"
check from_file_costs_overridden 0 '^makespan: 9$' -- \
  schedule --from "$tmp/costed.json" --latency 0
python3 - "$tmp/costed.json" "$tmp/badcost.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["costs"]["latency"] = "fast"
json.dump(j, open(sys.argv[2], "w"))
PY
check from_file_bad_costs 2 'costs.latency: expected a number >= 0, got "fast"' -- \
  schedule --from "$tmp/badcost.json"
python3 - "$tmp/good.json" "$tmp/bad.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
a = j["schedule"][1]["actions"]
a[0], a[1] = a[1], a[0]  # B1.0 before F1.0
json.dump(j, open(sys.argv[2], "w"))
PY
check from_invalid_schedule 2 'rank 1, action #0 \(B1.0\): runs before its forward F1.0' -- \
  schedule --from "$tmp/bad.json"
echo '{"kind": "1f1b",' >"$tmp/truncated.json"
check from_bad_json 2 'parse error at line 2' -- schedule --from "$tmp/truncated.json"
check from_excludes_generation 2 'excludes' -- schedule --from "$tmp/good.json" -P 3
check from_missing_file 1 'cannot read' -- schedule --from "$tmp/missing.json"
# run --in-process: the examples train, and their loss falls.
src=${CONVEYOR_SOURCE_DIR:?set CONVEYOR_SOURCE_DIR to the source tree}
for example in mlp transformer; do
  sed "s|^  dir: .*|  dir: $tmp/$example|" "$src/examples/$example.yaml" >"$tmp/$example.yaml"
  if out=$("$ctl" run "$tmp/$example.yaml" --in-process --steps 40 2>&1) &&
     awk '/^step/ { if (!first) first = $4; last = $4 }
          END { exit !(first > 0 && last < 0.9 * first) }' <<<"$out" &&
     [ -s "$tmp/$example/params.safetensors" ]; then
    passed=$((passed + 1))
  else
    echo "FAIL run_$example"; echo "$out" | tail -5; failed=$((failed + 1))
  fi
done
# --steps with a cosine schedule that leaves total_steps to training.steps:
# the decay follows the overridden length. With 20 steps (10 of warmup) the
# last step's lr is 0.0003 + 0.00135 (1 + cos(0.9 pi)) = 0.000366; with the
# job's 150 it would still be 0.00297.
sed "s|^  dir: .*|  dir: $tmp/gpt|; s|path: ../docs/architecture.md|path: $src/docs/architecture.md|; s|path: ../docs/jobs.md|path: $src/docs/jobs.md|" \
  "$src/examples/gpt.yaml" >"$tmp/gpt.yaml"
check steps_override_rescales_cosine 0 '^step 20/20 .* lr 0.000366 ' -- \
  run "$tmp/gpt.yaml" --in-process --steps 20
mkdir -p "$tmp/nobin"
CONVEYOR_BIN_DIR=$tmp/nobin check run_missing_daemons 1 \
  "conveyor-coordinator: no executable at $tmp/nobin/conveyor-coordinator" -- \
  run "$tmp/mlp.yaml"
check run_in_process_with_workers 2 'does not go with --in-process' -- \
  run "$tmp/mlp.yaml" --in-process --workers 2
printf 'model:\n  input_shape: [4]\n  init: {seed: 0}\n  layers:\n    - dense: {feature: 2}\n  loss: mse\n' >"$tmp/bad.yaml"
check run_bad_job 2 "bad.yaml:5:15: model.layers\\[0\\].dense: unknown key 'feature'" -- \
  run "$tmp/bad.yaml" --in-process
check run_missing_job 1 'bad-missing.yaml' -- run "$tmp/bad-missing.yaml" --in-process
check unwritable_output 1 'cannot write' -- \
  schedule -P 2 -M 2 -o /nonexistent-dir/out.txt

# validate: the examples plan; a bad job says where.
for example in mlp transformer gpt uneven; do
  check "validate_$example" 0 "examples/$example.yaml: valid; needs [0-9]+ worker\(s\)" -- \
    validate "$src/examples/$example.yaml"
done
check validate_plan 0 '^1      1      4-6 ' -- validate "$src/examples/mlp.yaml"
# completion: a real bash, given the generated script, completes a subcommand
# and a flag (after a global flag with its value, too).
check completion_bash 0 '^complete -o default -F _conveyorctl conveyorctl$' -- \
  completion bash
check completion_bad_shell 2 'fish not in \{bash,zsh\}' -- completion fish
completions() {  # completions WORD...: what bash offers for the last word
  bash -c 'source <("$0" completion bash) || exit 1
    COMP_WORDS=("$@"); COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    _conveyorctl; echo "${COMPREPLY[*]}"' "$ctl" "$@"
}
expect_completion() {  # expect_completion NAME WANT WORD...
  local name=$1 want=$2 got
  shift 2
  got=$(completions "$@")
  if [ "$got" = "$want" ]; then
    passed=$((passed + 1))
  else
    echo "FAIL $name: '$*' completes to '$got', want '$want'"
    failed=$((failed + 1))
  fi
}
expect_completion complete_subcommand drain conveyorctl dr
expect_completion complete_flag --no-wait conveyorctl drain --no
expect_completion complete_after_global_flag jobs conveyorctl --log-level warn jo
expect_completion complete_after_a_global_switch jobs conveyorctl --version jo
expect_completion complete_flag_once --keep-logs conveyorctl run --keep
expect_completion complete_file_position '' conveyorctl validate exa
if command -v zsh >/dev/null; then
  out=$(zsh -c 'source <("$0" completion zsh) && whence -w _conveyorctl' "$ctl" 2>&1)
  if [[ $out == *"function"* ]]; then passed=$((passed + 1)); else
    echo "FAIL completion_zsh: $out"; failed=$((failed + 1)); fi
else
  echo "SKIP completion_zsh: zsh is not installed"
fi

# --steps below a cosine schedule's warmup: the warmup scales, with a note.
check run_steps_scale_warmup 0 \
  'note: --steps 2: optimizer.schedule.warmup_steps scaled from 10 \(of 150 steps\) to 0' -- \
  run "$src/examples/gpt.yaml" --in-process --steps 2 --set "checkpoint.dir=$tmp/gpt"

check validate_json 0 '^  "workers": 2$' -- validate "$src/examples/mlp.yaml" -o json
check validate_bad_output 2 'yaml not in \{table,json\}' -- \
  validate "$src/examples/mlp.yaml" -o yaml
# stages: auto profiles here and prints the split against the even one.
check validate_auto 0 'stages: auto from a profile on this machine.s CPU' -- \
  validate "$src/examples/uneven.yaml" --profile-repetitions 1
check validate_auto_even 0 'even split \(4,3,3,3 layers\): predicted step' -- \
  validate "$src/examples/uneven.yaml"
check validate_auto_budget 2 'uneven.yaml \(with --set\):[0-9]+:[0-9]+: pipeline.memory_budget: no split of 13 layers into 4 stages fits 1000 bytes' -- \
  validate "$src/examples/uneven.yaml" --set pipeline.memory_budget=1KB
check validate_auto_too_many 2 'pipeline.num_stages: 14 stages need at least 14 layers; the model has 13' -- \
  validate "$src/examples/uneven.yaml" --set pipeline.num_stages=14
check validate_bad_job 2 "bad.yaml:5:15: model.layers\[0\].dense: unknown key 'feature'" -- \
  validate "$tmp/bad.yaml"
check validate_missing 1 'missing.yaml' -- validate "$tmp/missing.yaml"
check validate_set 0 '200 steps of batch 64 in 4 microbatches of 16' -- \
  validate "$src/examples/mlp.yaml" --set training.batch_size=64
check validate_set_position 2 'mlp.yaml \(with --set\):[0-9]+:[0-9]+: training.steps: must be a positive integer' -- \
  validate "$src/examples/mlp.yaml" --set training.steps=many
# validate reads what the daemons would only meet once the job runs: the
# data, model.init.from and checkpoint.dir (a read-only one once failed a job
# after 2 of 3 steps).
: >"$tmp/not-a-dir"
check validate_checkpoint_dir 1 "checkpoint.dir $tmp/not-a-dir cannot be written \(.*\): the job would fail at its first checkpoint" -- \
  validate "$src/examples/mlp.yaml" --set "checkpoint.dir=$tmp/not-a-dir"
check validate_init_from 1 "$tmp/no-init.safetensors" -- \
  validate "$src/examples/mlp.yaml" --set "model.init={from: $tmp/no-init.safetensors}"
# A synthetic W of 1 GiB (input and output widths 16384) is sized, not
# drawn: validate of a 4 GB one once ran past a minute and took 3.9 GB.
cat >"$tmp/wide.yaml" <<'YAML'
model:
  input_shape: [16384]
  init: {seed: 0}
  layers: [{dense: {features: 8}}, boundary, {dense: {features: 16384}}]
  loss: mse
data: {source: synthetic-regression}
training: {steps: 1, batch_size: 2}
optimizer: {kind: sgd, lr: 0.1}
YAML
wide_peak_kib=$(python3 -c '
import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$ctl" validate "$tmp/wide.yaml")
if [ -n "$wide_peak_kib" ] && [ "$wide_peak_kib" -lt 262144 ]; then
  passed=$((passed + 1))
else
  echo "FAIL validate_wide_synthetic: peak RSS ${wide_peak_kib:-?} KiB (W is 1 GiB)"
  failed=$((failed + 1))
fi
mkfifo "$tmp/fifo"
check validate_data_fifo 2 "$tmp/fifo: not a regular file" -- \
  validate "$src/examples/gpt.yaml" --set "data.path=$tmp/fifo"
check set_no_equals 2 "--set needs key.path=value; got 'training.steps'" -- \
  validate "$src/examples/mlp.yaml" --set training.steps
check set_empty_key 2 '--set needs key.path=value with non-empty keys' -- \
  validate "$src/examples/mlp.yaml" --set training..steps=3
check set_through_scalar 2 '--set name.x=1: name is' -- \
  validate "$src/examples/mlp.yaml" --set name.x=1
check set_bad_index 2 'model.layers is a list of 8 item\(s\)' -- \
  validate "$src/examples/mlp.yaml" --set model.layers.8=relu

# export: a two-stage checkpoint written as the workers write it, gathered.
python3 - "$tmp/ckpt" <<'PY'
import json, os, struct, sys
def write(path, tensors, meta):
    header, data = {"__metadata__": meta}, b""
    for name, values in tensors.items():
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": [len(values)],
                        "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF
root = sys.argv[1]
# Steps 10 and 20 are complete (the coordinator wrote their manifests);
# step 30 has one stage file and no manifest, as after a crash mid-write.
for step, stages in ((10, (0, 1)), (20, (0, 1)), (30, (0,))):
    d = os.path.join(root, "step-%d" % step)
    os.makedirs(d)
    files = []
    for s in stages:
        meta = {"format": "conveyor-stage-v1", "job": "job-3", "stage": str(s),
                "num_stages": "2", "step": str(step),
                "optimizer_step": str(step)}
        path = os.path.join(d, "stage-%d.safetensors" % s)
        write(path, {"layers.%d.weight" % s: [s + step, 2.0],
                     "layers.%d.bias" % s: [0.5],
                     "optimizer/exp_avg/layers.%d.bias" % s: [9.0]}, meta)
        data = open(path, "rb").read()
        files.append({"stage": s, "file": "stage-%d.safetensors" % s,
                      "bytes": len(data), "crc32c": "%08x" % crc32c(data)})
    if len(stages) == 2:
        manifest = {"format": "conveyor-checkpoint-v1", "job": "mlp",
                    "job_id": "job-3", "step": step,
                    "config_hash": "0123456789abcdef", "num_stages": 2,
                    "stage_begin": [0, 1], "stages": files,
                    "created_unix_ms": 1700000000000}
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(manifest, f)
PY
check export_latest 0 'exported step 20 of job job-3: 2 stage\(s\), 4 tensors, 6 parameters' -- \
  export "$tmp/ckpt" -o "$tmp/export.safetensors"
check export_skips_incomplete 0 'note: skipped .*step-30: step 30 is incomplete: no manifest' -- \
  export "$tmp/ckpt" -o "$tmp/export.safetensors"
if python3 - "$tmp/export.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
assert h["__metadata__"]["step"] == "20" and h["__metadata__"]["format"] == "pt"
names = sorted(k for k in h if k != "__metadata__")
assert names == ["layers.0.bias", "layers.0.weight", "layers.1.bias", "layers.1.weight"], names
o = h["layers.1.weight"]["data_offsets"]
assert struct.unpack("<2f", b[8 + n + o[0]:8 + n + o[1]]) == (21.0, 2.0)
PY
then passed=$((passed + 1)); else echo "FAIL export_content"; failed=$((failed + 1)); fi
check export_step 0 'exported step 10 ' -- export "$tmp/ckpt" --step 10 -o "$tmp/e10.safetensors"
check export_incomplete_step 1 'step 30 is incomplete: no manifest' -- \
  export "$tmp/ckpt" --step 30 -o "$tmp/e30.safetensors"
check export_unknown_step 1 'no step-7; steps: 10, 20, 30' -- \
  export "$tmp/ckpt" --step 7 -o "$tmp/e7.safetensors"
check export_negative_step 2 '--step must be >= 0' -- \
  export "$tmp/ckpt" --step -3 -o "$tmp/e.safetensors"
check export_missing_dir 1 'no such checkpoint directory' -- \
  export "$tmp/nockpt" -o "$tmp/e.safetensors"
check export_no_steps 1 'no step-<N> directories' -- export "$tmp/nobin" -o "$tmp/e.safetensors"
check export_needs_output 2 '--output is required' -- export "$tmp/ckpt"

# The coordinator's commands, with nobody listening.
check jobs_unreachable 1 'cannot reach the coordinator at 127.0.0.1:1 ' -- \
  jobs --coordinator 127.0.0.1:1
CONVEYOR_COORDINATOR=127.0.0.1:1 check env_coordinator 1 'cannot reach the coordinator at 127.0.0.1:1 ' -- \
  workers
check bad_timeout 2 '--timeout must be positive' -- status job-1 --timeout 0
check trace_help 0 'ui.perfetto.dev' -- trace --help
check trace_bad_format 2 'format' -- trace job-1 --format bmp
check trace_unreachable 1 'cannot reach the coordinator at 127.0.0.1:1 ' -- \
  trace job-1 --coordinator 127.0.0.1:1 -o "$tmp/t.json"

fake=${CONVEYOR_FAKE_BIN_DIR:-}
running() {  # running PID: exists and is not a zombie
  [ -r "/proc/$1/stat" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]
}
if [ -n "$fake" ] && [ -x "$fake/conveyor-coordinator" ]; then
  # The commands against a (fake) coordinator started by hand.
  "$fake/conveyor-coordinator" --listen 127.0.0.1:0 --ready-file "$tmp/coord.addr" \
    >"$tmp/coord.log" 2>&1 &
  fake_pids+=($!)
  for _ in $(seq 100); do [ -s "$tmp/coord.addr" ] && break; sleep 0.1; done
  addr=$(cat "$tmp/coord.addr")
  for i in 0 1; do
    "$fake/conveyor-worker" --coordinator "$addr" --name "hand-$i" >"$tmp/w$i.log" 2>&1 &
    fake_pids+=($!)
  done
  for _ in $(seq 100); do
    [ "$("$ctl" workers --coordinator "$addr" 2>/dev/null | grep -c IDLE)" = 2 ] && break
    sleep 0.1
  done
  export CONVEYOR_COORDINATOR=$addr
  check workers 0 '^worker-[12] +hand-[01] +IDLE +- +- +0\.[0-9] s ago' -- workers
  check submit 0 '^job-1 QUEUED$' -- submit "$tmp/mlp.yaml" --set training.steps=5
  check submit_bad_job 2 "bad.yaml:5:15: model.layers\[0\].dense: unknown key 'feature'" -- \
    submit "$tmp/bad.yaml"
  check submit_bad_set 2 '--set needs key.path=value' -- submit "$tmp/mlp.yaml" --set x
  check watch 0 '^SUCCEEDED: 5/5 steps in .*, final loss 0.200000$' -- watch job-1
  check status 0 '^1      1     4-6     328320      worker-[12]$' -- status job-1
  check jobs 0 '^job-1  mlp   SUCCEEDED  5/5 ' -- jobs
  check watch_unknown 1 "unknown job 'job-9'" -- watch job-9
  check submit_watch 0 '^step 2/3  loss 0.500000  lr 0.003' -- \
    submit "$tmp/mlp.yaml" --set training.steps=3 --watch --log-every 1
  check submit_cancel 0 '^job-3 QUEUED$' -- submit "$tmp/mlp.yaml"
  check cancel 0 '^job-3 CANCELLED: cancelled by user$' -- cancel job-3
  check watch_cancelled 1 '^CANCELLED: cancelled by user' -- watch job-3
  unset CONVEYOR_COORDINATOR

  # run on a local cluster of the fake daemons.
  export CONVEYOR_BIN_DIR=$fake
  check run_cluster 0 '^SUCCEEDED: 30/30 steps' -- run "$tmp/mlp.yaml" --steps 30
  check run_cluster_lines 0 '^step 10/30  loss 0.100000' -- run "$tmp/mlp.yaml" --steps 30
  check run_cluster_workers 0 '3 worker\(s\) idle' -- run "$tmp/mlp.yaml" --steps 2 --workers 3
  check run_too_few_workers 2 "--workers 1: the job's pipeline needs 2 workers" -- \
    run "$tmp/mlp.yaml" --workers 1
  check run_bad_job 2 "bad.yaml:5:15: model.layers\[0\].dense: unknown key 'feature'" -- \
    run "$tmp/bad.yaml"
  CONVEYOR_FAKE_OUTCOME=FAILED check run_failed 1 '^FAILED: worker-2 lost' -- \
    run "$tmp/mlp.yaml" --steps 10
  CONVEYOR_FAKE_COORDINATOR_EXIT=1 check run_coordinator_dies 1 \
    'conveyor-coordinator \(pid [0-9]+\) exited with status 3 before writing its address' -- \
    run "$tmp/mlp.yaml"
  CONVEYOR_FAKE_WORKER_EXIT=1 check run_worker_dies 1 \
    'conveyor-worker \(pid [0-9]+\) exited with status 3' -- run "$tmp/mlp.yaml"
  # The successful runs left no log directory behind.
  n=$(ls -d "$tmp"/conveyorctl-* 2>/dev/null | wc -l)
  if [ "$n" -eq 3 ]; then passed=$((passed + 1)); else
    echo "FAIL run_logs_kept_on_failure_only: $n log directories"; failed=$((failed + 1)); fi
  # --keep-logs keeps them after a success too, and says where.
  check run_keep_logs 0 "the daemons' logs: $tmp/conveyorctl-" -- \
    run "$tmp/mlp.yaml" --steps 2 --keep-logs
  n=$(ls -d "$tmp"/conveyorctl-* 2>/dev/null | wc -l)
  if [ "$n" -eq 4 ]; then passed=$((passed + 1)); else
    echo "FAIL run_keep_logs_kept: $n log directories"; failed=$((failed + 1)); fi

  # SIGINT cancels the job, stops the daemons and exits 130.
  for sig in INT TERM; do
    CONVEYOR_FAKE_STEP_DELAY_MS=100 "$ctl" run "$tmp/mlp.yaml" >"$tmp/sig.out" 2>&1 &
    pid=$!
    # Up to 30 s: a loaded CI machine once took over 10 s to start it.
    for _ in $(seq 300); do grep -q '^step' "$tmp/sig.out" && break; sleep 0.1; done
    started=$(ps -o stat=,etime= -p "$pid" 2>/dev/null)
    children=$(pgrep -P "$pid" | tr '\n' ' ')
    kill -"$sig" "$pid"
    wait "$pid"
    rc=$?
    want=$([ "$sig" = INT ] && echo 130 || echo 143)
    alive=""
    for c in $children; do running "$c" && alive="$alive $c"; done
    if [ "$rc" -eq "$want" ] && [ -n "$children" ] && [ -z "$alive" ] &&
       grep -q '^CANCELLED: cancelled by user' "$tmp/sig.out" &&
       grep -q "interrupted by SIG$sig" "$tmp/sig.out"; then
      passed=$((passed + 1))
    else
      echo "FAIL run_sig$sig: exit $rc (want $want), children '$children', alive '$alive'," \
        "conveyorctl when signalled: '$started', its output:"
      tail -5 "$tmp/sig.out"; failed=$((failed + 1))
    fi
  done
  # SIGKILL leaves conveyorctl no say: the daemons go anyway (PR_SET_PDEATHSIG).
  # They become zombies of init until it reaps them: dead, which is the point.
  CONVEYOR_FAKE_STEP_DELAY_MS=100 "$ctl" run "$tmp/mlp.yaml" >"$tmp/kill.out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q '^step' "$tmp/kill.out" && break; sleep 0.1; done
  children=$(pgrep -P "$pid" | tr '\n' ' ')
  kill -KILL "$pid"
  wait "$pid" 2>/dev/null
  for _ in $(seq 100); do  # The coordinator takes up to 1 s to shut down.
    alive=""
    for c in $children; do running "$c" && alive="$alive $c"; done
    [ -z "$alive" ] && break
    sleep 0.1
  done
  if [ -n "$children" ] && [ -z "$alive" ]; then passed=$((passed + 1)); else
    echo "FAIL run_sigkill: children '$children', alive '$alive'"; failed=$((failed + 1)); fi
  unset CONVEYOR_BIN_DIR
else
  echo "note: CONVEYOR_FAKE_BIN_DIR not set: skipping the coordinator and local-cluster tests"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
