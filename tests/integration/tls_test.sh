#!/usr/bin/env bash
# TLS and mutual TLS for the control plane, with real processes and
# certificates made here by openssl: a coordinator serving TLS that requires
# client certificates (and the auth token) admits conveyorctl and workers
# with the right CA, certificate and token, and refuses plaintext, a wrong
# CA, a client certificate from another CA, no client certificate, and no
# token. Needs COORDINATOR, WORKER and CONVEYORCTL (the binaries' paths).
set -u
coordinator=${COORDINATOR:?}
worker=${WORKER:?}
ctl=${CONVEYORCTL:?}
command -v openssl >/dev/null || { echo "openssl is not installed"; exit 77; }
source "$(dirname "$0")/daemon_test_lib.sh"

# ca NAME: a self-signed CA in $dir/NAME.pem, $dir/NAME.key.
ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/$1.key" -out "$dir/$1.pem" -days 2 -subj "/CN=$1" \
    >/dev/null 2>&1
}
# leaf NAME CA EXTENSIONS: a certificate signed by CA.
leaf() {
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/$1.key" -out "$dir/$1.csr" -subj "/CN=$1" >/dev/null 2>&1
  printf '%s\n' "$3" >"$dir/$1.ext"
  openssl x509 -req -in "$dir/$1.csr" -CA "$dir/$2.pem" -CAkey "$dir/$2.key" \
    -CAcreateserial -out "$dir/$1.pem" -days 2 -extfile "$dir/$1.ext" \
    >/dev/null 2>&1
}
ca ca1
ca ca2
leaf server ca1 "subjectAltName=IP:127.0.0.1,DNS:localhost"
leaf client ca1 "extendedKeyUsage=clientAuth"
leaf stranger ca2 "extendedKeyUsage=clientAuth"
check "certificates made" test -s "$dir/server.pem" -a -s "$dir/client.pem" -a -s "$dir/stranger.pem"
printf 'tls-test-token-0123456789\n' >"$dir/token"
chmod 600 "$dir/token"

"$coordinator" --tls-ca "$dir/ca1.pem" >"$dir/bad-flags.log" 2>&1
check "--tls-ca alone on the coordinator: exit 2" test $? -eq 2

"$coordinator" --listen 127.0.0.1:0 --ready-file "$dir/ready" \
  --tls-cert "$dir/server.pem" --tls-key "$dir/server.key" --tls-ca "$dir/ca1.pem" \
  --auth-token-file "$dir/token" >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 200); do [ -s "$dir/ready" ] && break; sleep 0.05; done
address=$(head -1 "$dir/ready")
check "coordinator is serving" test -n "$address"

right=(--tls-ca "$dir/ca1.pem" --tls-cert "$dir/client.pem" --tls-key "$dir/client.key")
ctl_run() {  # ctl_run NAME EXPECTED_RC ARGS...
  local name=$1 rc=$2
  shift 2
  "$ctl" workers --coordinator "$address" --timeout 5 "$@" >"$dir/$name.out" 2>&1
  local got=$?
  check "$name: exit $rc" test "$got" -eq "$rc"
  [ "$got" -eq "$rc" ] || cat "$dir/$name.out"
}
ctl_run right 0 "${right[@]}" --auth-token-file "$dir/token"
ctl_run plaintext 1 --auth-token-file "$dir/token"
ctl_run wrong_ca 1 --tls-ca "$dir/ca2.pem" --tls-cert "$dir/client.pem" \
  --tls-key "$dir/client.key" --auth-token-file "$dir/token"
ctl_run stranger_cert 1 --tls-ca "$dir/ca1.pem" --tls-cert "$dir/stranger.pem" \
  --tls-key "$dir/stranger.key" --auth-token-file "$dir/token"
ctl_run no_client_cert 1 --tls-ca "$dir/ca1.pem" --auth-token-file "$dir/token"
ctl_run no_token 1 "${right[@]}"
check "no token: refused, not unreachable" grep -q "refused the call" "$dir/no_token.out"
ctl_run half_pair 2 --tls-ca "$dir/ca1.pem" --tls-cert "$dir/client.pem"
check "half a pair: says so" grep -q -- "--tls-cert and --tls-key go together" "$dir/half_pair.out"

# A worker with the wrong CA never gets in; one with the right files does.
"$worker" --coordinator "$address" --name outsider --tls-ca "$dir/ca2.pem" \
  --tls-cert "$dir/client.pem" --tls-key "$dir/client.key" \
  --auth-token-file "$dir/token" >"$dir/outsider.log" 2>&1 &
pids+=($!)
"$worker" --coordinator "$address" --name insider "${right[@]}" \
  --auth-token-file "$dir/token" >"$dir/insider.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  "$ctl" workers --coordinator "$address" "${right[@]}" \
    --auth-token-file "$dir/token" >"$dir/workers.out" 2>&1
  grep -q insider "$dir/workers.out" && break
  sleep 0.1
done
check "the worker with the right files registers" grep -q insider "$dir/workers.out"
check "the worker with the wrong CA does not" bash -c "! grep -q outsider '$dir/workers.out'"

finish
