#!/usr/bin/env bash
# The README's path, through the real daemons: `conveyorctl run JOB --steps
# N`, then `generate` and `export --format hf` of its checkpoint without
# --job (the manifest records the job), with the job file itself (whose
# training.steps differs: accepted with a note), with a wider model
# (refused, naming the key), with --set; an fp32 HF export generates the
# same tokens as the checkpoint; --overwrite replaces an earlier export and
# nothing else; a model imported from an HF directory exports with its
# tokenizer files, warns when they are gone, and takes --tokenizer. Needs
# CONVEYORCTL (the daemons are found beside it).
set -u
ctl=${CONVEYORCTL:?}
root=$(cd "$(dirname "$0")/../.." && pwd)
source "$root/tests/integration/daemon_test_lib.sh"
cd "$dir" || exit 1

mkdir -p jobs models
head -c 4000 "$root/docs/architecture.md" >text.txt
# A tiny byte-level Llama shaped like examples/llama.yaml, its checkpoints
# in ../build/ckpt as the example's are.
write_job() {  # write_job FILE WIDTH
  cat >"jobs/$1" <<EOF
name: tiny
model:
  input_shape: [16]
  init: {seed: 0}
  layers:
    - embedding: {vocab_size: 256, features: $2}
    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 48}
    - boundary
    - llama_block: {heads: 4, kv_heads: 2, mlp_features: 48}
    - rmsnorm
    - lm_head: {vocab_size: 256}
  loss: cross_entropy
data: {source: tokens, path: ../text.txt, seq_len: 16, shuffle: true, seed: 0}
training: {steps: 400, batch_size: 4, microbatches: 2}
optimizer:
  kind: adamw
  lr: 0.003
  schedule: {kind: cosine, warmup_steps: 10}
checkpoint: {dir: ../build/ckpt}
EOF
}
write_job tiny.yaml 32
write_job wide.yaml 64

"$ctl" run jobs/tiny.yaml --steps 6 >run.out 2>&1
check "the job runs 6 of its 400 steps" grep -q "SUCCEEDED: 6/6 steps" run.out

gen() {  # gen NAME ARGS...: generate greedily from the prompt "The "
  local name=$1
  shift
  "$ctl" generate "$@" --prompt "The " --tokens 12 --temperature 0 \
    >"$name.out" 2>"$name.err"
}
gen recorded build/ckpt
check "generate without --job succeeds" test $? -eq 0
check "... printing the new tokens" test -s recorded.out
gen same_file build/ckpt --job jobs/tiny.yaml
check "generate --job with another training.steps succeeds" test $? -eq 0
check "... with the same tokens" cmp -s recorded.out same_file.out
check "... noting what differs outside the model" grep -q \
  "jobs/tiny.yaml differs from the job that wrote the checkpoint only outside its model (training.steps, optimizer.schedule.warmup_steps)" \
  same_file.err
gen wide build/ckpt --job jobs/wide.yaml
check "generate --job of a wider model is refused" test $? -eq 1
check "... naming the key and both values" grep -q \
  "model.layers\[0\].embedding.features differs (32 in the checkpoint, 64 in this job)" \
  wide.err
check "... printing nothing" test ! -s wide.out
gen set_steps build/ckpt --set training.steps=2 --set optimizer.lr=1
check "generate --set outside the model succeeds" cmp -s recorded.out set_steps.out
gen set_heads build/ckpt --set model.layers.1.llama_block.heads=8
check "generate --set inside the model is refused" test $? -eq 1
check "... naming the key" grep -q -e \
  "--set changes the model of the job recorded in build/ckpt/step-6/manifest.json.*model.layers\[1\].llama_block.heads differs (4 in the checkpoint, 8 in this job)" \
  set_heads.err

export_hf() {  # export_hf NAME ARGS...
  local name=$1
  shift
  "$ctl" export build/ckpt --format hf "$@" >"$name.out" 2>&1
}
export_hf first --dtype fp32 -o out/hf
check "export --format hf without --job succeeds" test $? -eq 0
check "... writing an HF checkpoint" test -s out/hf/config.json -a -s out/hf/model.safetensors
gen from_hf out/hf
check "... that generates the checkpoint's tokens (fp32)" cmp -s recorded.out from_hf.out
export_hf again --job jobs/tiny.yaml -o out/hf
check "a second export into it is refused" test $? -eq 1
check "... saying --overwrite replaces it" grep -q \
  "out/hf already holds an HF checkpoint (config.json); --overwrite replaces it" again.out
touch out/hf/stale
export_hf overwrite --job jobs/tiny.yaml -o out/hf --overwrite
check "--overwrite replaces it" grep -q "to out/hf (replacing the export there)" overwrite.out
check "... whole" test ! -e out/hf/stale
check "... in bf16 now: half the bytes" test \
  "$(stat -c %s out/hf/model.safetensors)" -lt 70000
check "... leaving nothing beside it" test "$(ls -A out)" = hf
touch out/file
export_hf file -o out/file --overwrite
check "a file at the output is refused" grep -q "out/file exists and is not a directory" file.out
mkdir -p out/notes && echo mine >out/notes/todo
export_hf notes -o out/notes --overwrite
check "a directory of other files is refused" grep -q \
  "out/notes is not empty and is not an HF checkpoint" notes.out
check "... and left alone" grep -q mine out/notes/todo
export_hf itself -o build --overwrite
check "the directory holding the checkpoint is refused" test $? -eq 1

# A model imported from an HF directory, with its tokenizer files.
cp -r out/hf models/tiny
echo '{"version": "1.0", "model": {"type": "BPE"}}' >models/tiny/tokenizer.json
echo '{"bos_token": "<s>"}' >models/tiny/tokenizer_config.json
echo '{"eos_token": "</s>"}' >models/tiny/special_tokens_map.json
echo '{"bos_token_id": 1}' >models/tiny/generation_config.json
cat >jobs/imported.yaml <<'EOF'
model: {from_hf: ../models/tiny, input_shape: [16], boundaries: [1]}
data: {source: tokens, path: ../text.txt, seq_len: 16}
training: {steps: 40, batch_size: 4, microbatches: 2}
optimizer: {kind: adamw, lr: 0.001}
checkpoint: {dir: ../build/imported}
EOF
"$ctl" run jobs/imported.yaml --steps 2 >imported_run.out 2>&1
check "a job imported from HF runs" grep -q "SUCCEEDED: 2/2 steps" imported_run.out
"$ctl" export build/imported --format hf -o out/imported >imported.out 2>&1
check "its export succeeds without --job" test $? -eq 0
check "... copying the import's tokenizer files" grep -q \
  "copied tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json from $dir/models/tiny" \
  imported.out
for f in tokenizer.json tokenizer_config.json special_tokens_map.json generation_config.json; do
  check "... $f byte for byte" cmp -s "models/tiny/$f" "out/imported/$f"
done
gen imported build/imported
check "generate without --job of the imported model succeeds" test $? -eq 0

# The import moves and loses its tokenizer: the recorded job names where
# it was; --set names where it is; the export warns that it has no
# tokenizer, and --tokenizer names one.
mv models/tiny models/moved
rm models/moved/tokenizer.json
"$ctl" export build/imported --format hf -o out/imported --overwrite >moved.out 2>&1
check "an export whose import moved is refused" test $? -eq 2
check "... saying how to name it" grep -q "\-\-set model.from_hf=DIR" moved.out
"$ctl" export build/imported --format hf -o out/imported --overwrite \
  --set model.from_hf=../models/moved >warned.out 2>&1
check "with --set model.from_hf it succeeds" test $? -eq 0
check "... warning that the import has no tokenizer" grep -q \
  "^warning: $dir/models/moved, which the model was imported from, holds neither tokenizer.json nor tokenizer.model" \
  warned.out
check "... and the export has none" test ! -e out/imported/tokenizer.json
echo '{"model": {"type": "Unigram"}}' >tokenizer.json
"$ctl" export build/imported --format hf -o out/imported --overwrite \
  --set model.from_hf=../models/moved --tokenizer tokenizer.json >named.out 2>&1
check "--tokenizer names the file instead" cmp -s tokenizer.json out/imported/tokenizer.json
"$ctl" export build/imported --format hf -o out/x --tokenizer nothing.json >absent.out 2>&1
check "--tokenizer of a missing file is refused" grep -q \
  "\-\-tokenizer nothing.json: no such file or directory" absent.out
check "... before anything is written" test ! -e out/x

finish || { tail -n 5 ./*.out ./*.err; exit 1; }
