# Sourced by the shell tests that run real daemons: a scratch directory
# ($dir), background processes to stop at exit (append their pids to
# `pids`), and `check NAME COMMAND...`, which counts; `finish` prints the
# counts and fails when a check did. Helpers for jobs: `wait_for`, `field`
# and `job_ended` (these two need $ctl and $address), `same_tensors`,
# `allclose`.
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
passed=0
failed=0
check() {  # check NAME COMMAND...
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $name"; fi
}
finish() {
  echo "$passed passed, $failed failed"
  test "$failed" -eq 0
}
wait_for() {  # wait_for SECONDS COMMAND...: polls until COMMAND succeeds.
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.05
  done
}
field() {  # field JOB NAME: what `conveyorctl status` shows for NAME.
  local out
  out=$("$ctl" status "$1" --coordinator "$address" 2>/dev/null)
  if [ "$2" = state ]; then  # The first line: "job-1 (name): STATE".
    head -1 <<<"$out" | sed 's/^.*): //'
  else
    sed -n "s/^  $2  *//p" <<<"$out" | head -1
  fi
}
idle_workers() {  # idle_workers N: at least N workers are IDLE
  test "$("$ctl" workers --coordinator "$address" 2>/dev/null | grep -c IDLE)" -ge "$1"
}
job_ended() {  # job_ended JOB
  case "$(field "$1" state)" in SUCCEEDED* | FAILED* | CANCELLED*) return 0 ;; esac
  return 1
}
same_tensors() {  # same_tensors A B: equal tensor bytes by name (metadata aside)
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def tensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    return {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
sys.exit(0 if a == b and a else 1)
PY
}
allclose() {  # allclose A B RTOL ATOL: every f32 tensor of two safetensors files
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
