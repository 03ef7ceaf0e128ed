#!/usr/bin/env bash
# Runs the conveyorctl binary as a user would: exit codes, --help for every
# subcommand, --version, and each output format. Prints "N passed, N failed".
set -u
ctl=${CONVEYORCTL:?set CONVEYORCTL to the conveyorctl binary}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
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
check no_subcommand 2 'subcommand is required' --
check unknown_subcommand 2 '' -- frobnicate
check missing_required 2 '--stages and --microbatches are required' -- schedule -P 4
check bad_kind 2 "allowed: gpipe, 1f1b, interleaved-1f1b, zb-h1" -- \
  schedule --kind zb-v -P 4 -M 8
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
sed "s|^  dir: .*|  dir: $tmp/gpt|; s|path: ../docs/architecture.md|path: $src/docs/architecture.md|" \
  "$src/examples/gpt.yaml" >"$tmp/gpt.yaml"
check steps_override_rescales_cosine 0 '^step 20/20 .* lr 0.000366 ' -- \
  run "$tmp/gpt.yaml" --in-process --steps 20
check run_needs_in_process 2 'pass --in-process' -- run "$tmp/mlp.yaml"
printf 'model:\n  input_shape: [4]\n  init: {seed: 0}\n  layers:\n    - dense: {feature: 2}\n  loss: mse\n' >"$tmp/bad.yaml"
check run_bad_job 2 "bad.yaml:5:15: model.layers\\[0\\].dense: unknown key 'feature'" -- \
  run "$tmp/bad.yaml" --in-process
check run_missing_job 1 'bad-missing.yaml' -- run "$tmp/bad-missing.yaml" --in-process
check unwritable_output 1 'cannot write' -- \
  schedule -P 2 -M 2 -o /nonexistent-dir/out.txt

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
