#!/usr/bin/env bash
# examples/documents/run's steps, shortened, through the real daemons:
# tokenize the Debian license texts with the example's tokenizer into a
# Megatron data set, train the example Llama on packed documents (positions
# reset, attention masked, no loss across a boundary) for a few steps over a
# 2-worker pipeline, and continue a text prompt with the result. Needs
# CONVEYORCTL (the daemons are found beside it).
set -u
ctl=${CONVEYORCTL:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "$0")/daemon_test_lib.sh"
example=$root/examples/documents

if ! ls /usr/share/common-licenses/* >/dev/null 2>&1; then
  echo "SKIPPED: no /usr/share/common-licenses"
  exit 0
fi

"$ctl" tokenize --tokenizer "$example/tokenizer.json" \
  /usr/share/common-licenses/* -o "$dir/licenses" >"$dir/tokenize.out" 2>&1
check "tokenize succeeds" test $? -eq 0
check "... writing the .bin and the .idx" test -s "$dir/licenses.bin" -a -s "$dir/licenses.idx"
check "... with a summary line" grep -qE "documents|tokens" "$dir/tokenize.out"

"$ctl" validate "$example/llama.yaml" --set "data.path=$dir/licenses" \
  --set "checkpoint.dir=$dir/ckpt" >"$dir/validate.out" 2>&1
check "the example job validates against the data" test $? -eq 0

"$ctl" run "$example/llama.yaml" --workers 2 --steps 4 \
  --set "data.path=$dir/licenses" --set "checkpoint.dir=$dir/ckpt" \
  >"$dir/run.out" 2>&1
check "the example trains 4 steps over 2 workers" test $? -eq 0
check "... reporting a finite loss" grep -qE "loss [0-9]+\.[0-9]+" "$dir/run.out"

"$ctl" generate "$dir/ckpt" --tokenizer "$example/tokenizer.json" \
  --prompt "Permission is hereby granted" --tokens 8 --temperature 0 \
  >"$dir/generate.out" 2>"$dir/generate.err"
check "generate continues a text prompt through the tokenizer" test $? -eq 0
check "... printing text" test -s "$dir/generate.out"

# A corrupt data set is refused before training, naming the file.
head -c 100 "$dir/licenses.bin" >"$dir/short.bin"
cp "$dir/licenses.idx" "$dir/short.idx"
"$ctl" run "$example/llama.yaml" --steps 1 --in-process \
  --set "data.path=$dir/short" --set "checkpoint.dir=$dir/ckpt2" \
  >"$dir/short.out" 2>&1
check "a truncated .bin is refused" test $? -ne 0
check "... naming it" grep -q "short" "$dir/short.out"

[ "$failed" -eq 0 ] || { for f in "$dir"/*.out "$dir"/*.err; do echo "== $f"; tail -20 "$f"; done; }
finish
