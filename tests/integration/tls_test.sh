#!/usr/bin/env bash
# TLS and mutual TLS for the control plane, with real processes and
# certificates made here by openssl: a coordinator serving TLS that requires
# client certificates (and the auth token) admits conveyorctl and workers
# with the right CA, certificate and token, and refuses plaintext, a wrong
# CA, a client certificate from another CA, no client certificate, and no
# token, each client naming the likely cause and the coordinator logging
# it. Bad files (a key that is not the certificate's, an expired
# certificate, no subjectAltName on the server's) stop every program at
# start with exit 2, naming the files. The certificates' expiry is a
# metric. Needs COORDINATOR, WORKER and CONVEYORCTL (the binaries' paths).
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
leaf bare ca1 "extendedKeyUsage=serverAuth"
leaf client ca1 "extendedKeyUsage=clientAuth"
leaf stranger ca2 "extendedKeyUsage=clientAuth"
check "certificates made" test -s "$dir/server.pem" -a -s "$dir/client.pem" -a -s "$dir/stranger.pem"
printf 'tls-test-token-0123456789\n' >"$dir/token"
chmod 600 "$dir/token"

"$coordinator" --tls-ca "$dir/ca1.pem" >"$dir/bad-flags.log" 2>&1
check "--tls-ca alone on the coordinator: exit 2" test $? -eq 2

# Bad files: exit 2 at start, naming them (a key that is not the
# certificate's once read "cannot listen ... (address in use)" on the
# coordinator, and kept a worker retrying "empty address list" forever).
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca1.pem" -CAkey "$dir/ca1.key" \
  -CAcreateserial -out "$dir/expired.pem" -days -1 -extfile "$dir/server.ext" \
  >/dev/null 2>&1
check "an expired certificate made" test -s "$dir/expired.pem"
mismatch="does not belong to --tls-cert $dir/server.pem"
"$coordinator" --listen 127.0.0.1:0 --tls-cert "$dir/server.pem" \
  --tls-key "$dir/client.key" >"$dir/mismatch-coordinator.log" 2>&1
check "coordinator with another certificate's key: exit 2" test $? -eq 2
check "... naming both files" grep -qF -- "--tls-key $dir/client.key $mismatch" "$dir/mismatch-coordinator.log"
timeout 10 "$worker" --coordinator 127.0.0.1:1 --tls-ca "$dir/ca1.pem" \
  --tls-cert "$dir/server.pem" --tls-key "$dir/client.key" >"$dir/mismatch-worker.log" 2>&1
check "worker with another certificate's key: exit 2" test $? -eq 2
check "... naming both files" grep -qF -- "$mismatch" "$dir/mismatch-worker.log"
"$ctl" workers --coordinator 127.0.0.1:1 --tls-ca "$dir/ca1.pem" \
  --tls-cert "$dir/server.pem" --tls-key "$dir/client.key" >"$dir/mismatch-ctl.out" 2>&1
check "conveyorctl with another certificate's key: exit 2" test $? -eq 2
check "... naming both files" grep -qF -- "$mismatch" "$dir/mismatch-ctl.out"
"$coordinator" --listen 127.0.0.1:0 --tls-cert "$dir/expired.pem" \
  --tls-key "$dir/server.key" >"$dir/expired.log" 2>&1
check "coordinator with an expired certificate: exit 2" test $? -eq 2
check "... saying when it expired" grep -q "expired on .* UTC" "$dir/expired.log"
"$coordinator" --listen 127.0.0.1:0 --tls-cert "$dir/bare.pem" \
  --tls-key "$dir/bare.key" >"$dir/bare.log" 2>&1
check "coordinator certificate without subjectAltName: exit 2" test $? -eq 2
check "... saying so" grep -q "has no subjectAltName" "$dir/bare.log"

"$coordinator" --listen 127.0.0.1:0 --ready-file "$dir/ready" \
  --metrics-address 127.0.0.1:0 \
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
# Each refusal names its likely cause, not the address ("Socket closed ...
# (set --coordinator ...)" once).
check "plaintext: the coordinator probably serves TLS" grep -q "probably serves TLS" "$dir/plaintext.out"
check "wrong CA: the coordinator's certificate is not trusted" grep -q "certificate is not trusted" "$dir/wrong_ca.out"
check "stranger: this client certificate is not accepted" grep -q "does not accept this client certificate" "$dir/stranger_cert.out"
check "no client certificate: one is required" grep -q "requires a client certificate" "$dir/no_client_cert.out"
for f in plaintext wrong_ca stranger_cert no_client_cert; do
  check "$f: not blaming --coordinator" bash -c "! grep -q 'set --coordinator' '$dir/$f.out'"
done
check "the coordinator logs why it refused a plaintext client" grep -q "refused a TLS handshake: a client spoke plaintext" "$dir/coordinator.log"
check "... a client without a certificate" grep -q "refused a TLS handshake: a client presented no certificate" "$dir/coordinator.log"
check "... as warnings, not raw gRPC lines" bash -c "! grep -q '^E[0-9]' '$dir/coordinator.log'"
check "the coordinator warns of certificates that expire within 30 days" \
  grep -q "the certificate CN=server expires on .* renew it" "$dir/coordinator.log"
metrics=$(sed -n 2p "$dir/ready" | cut -d' ' -f2)
python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen('http://$metrics/metrics').read().decode())" \
  >"$dir/metrics" 2>&1
check "the certificates' expiry is a metric" grep -q \
  "^conveyor_tls_certificate_expiry_timestamp_seconds{.*flag=\"--tls-cert\".*} [0-9.e+]*$" "$dir/metrics"

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
