#!/usr/bin/env bash
# conveyor-coordinator as an operator runs it: --config errors with
# file:line:col (exit 2), flags winning over the file, the ready file, and a
# clean exit 0 on SIGTERM. Needs COORDINATOR (the binary's path).
set -u
bin=${COORDINATOR:?set COORDINATOR to the conveyor-coordinator binary}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0
failed=0
check() {  # check NAME COMMAND...
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $name"; fi
}

printf 'listen: 127.0.0.1:0\nheartbeat_timout: 3\n' >"$dir/bad.yaml"
"$bin" --config "$dir/bad.yaml" >"$dir/out" 2>&1
check "bad config exits 2" test $? -eq 2
check "bad config names file:line:col and the key" \
  grep -q "bad.yaml:2:1: .*unknown key 'heartbeat_timout'" "$dir/out"

"$bin" --heartbeat-timeout -1 >"$dir/out" 2>&1
check "negative heartbeat timeout exits 2" test $? -eq 2

# The file says one address; --listen wins.
printf 'listen: 127.0.0.1:1\nheartbeat_timeout: 3\nstate_file: %s\n' "$dir/state" >"$dir/good.yaml"
"$bin" --config "$dir/good.yaml" --listen 127.0.0.1:0 \
  --metrics-address 127.0.0.1:0 --ready-file "$dir/addr" >"$dir/log" 2>&1 &
pid=$!
for _ in $(seq 100); do [ -s "$dir/addr" ] && break; sleep 0.05; done
check "ready file holds the bound address" grep -Eq '^127\.0\.0\.1:[0-9]+$' <(head -1 "$dir/addr")
# The process gauges are served (their collector once died with its
# temporary shared_ptr, and the coordinator served none).
metrics=$(sed -n 2p "$dir/addr" | cut -d' ' -f2)
python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://$metrics/metrics').read().decode())" \
  >"$dir/metrics" 2>&1
for gauge in resident_memory_bytes threads open_fds max_fds start_time_seconds cpu_seconds_total; do
  check "serves process_$gauge" grep -q "^process_$gauge " "$dir/metrics"
done
check "--listen wins over the file" test "$(head -1 "$dir/addr" | cut -d: -f2)" != 1
check "state_file from the file: written at start" test -s "$dir/state"
# A second coordinator on the same port must not start: with gRPC's default
# SO_REUSEPORT it did, and the kernel split the calls between the two.
timeout -k 2 10 "$bin" --listen "$(head -1 "$dir/addr")" \
  --state-file "$dir/state2" >"$dir/second" 2>&1
check "a second coordinator on a port in use exits 1" test $? -eq 1
check "... saying the address is in use" grep -q "address in use" "$dir/second"
kill -TERM "$pid"
wait "$pid"
check "SIGTERM exits 0" test $? -eq 0

# A state file in a directory that does not exist fails the start.
"$bin" --listen 127.0.0.1:0 --state-file "$dir/missing/state" >"$dir/out" 2>&1
check "unusable state file exits 1" test $? -eq 1
check "unusable state file is named" grep -q "missing/state" "$dir/out"

"$bin" --version >"$dir/out" 2>&1
check "--version names the protocol" grep -q "control protocol" "$dir/out"

echo "$passed passed, $failed failed"
test "$failed" -eq 0
