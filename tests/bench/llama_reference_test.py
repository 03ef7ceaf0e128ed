#!/usr/bin/env python3
"""The GPU Llama comparison's Python parts, on the CPU: the PyTorch side
(bench/torch_llama_reference.py --device cpu --tiny) trains and reports its
figures, and bench/llama_table.py turns both sides' JSON into the table and
its verdicts (ratio against PyTorch's fastest, MFU) and fails when Conveyor's
run did. Exits 77 (skipped) without PyTorch for the first part's interpreter.

  llama_reference_test.py SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

root = sys.argv[1]
bench = os.path.join(root, "bench")
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print(f"FAILED: {what}")


def table(ours, theirs):
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "ours.json"), os.path.join(d, "theirs.json")
        for path, obj in ((a, ours), (b, theirs)):
            if obj is not None:
                with open(path, "w") as f:
                    json.dump(obj, f)
        r = subprocess.run([sys.executable, os.path.join(bench, "llama_table.py"), a, b],
                           capture_output=True, text=True)
        return r.returncode, r.stdout


def conveyor(ms, flops=6.0e13, peak=989.0):
    return {"benchmarks": [{"run_name": "llama/conveyor_llama_1b_resident/iterations:10",
                            "ms_per_step": ms, "tokens_per_s": 8192 / (ms / 1e3),
                            "blocks": 16, "flops_per_step": flops,
                            "peak_tflops": peak, "peak_GiB": 30.0}]}


# The table: MFU from Conveyor's FLOPs for both sides, the fastest PyTorch
# configuration as the baseline, both targets judged.
torch_side = {"blocks": 16, "eager": {"ms_per_step": 150.0, "tokens_per_s": 54613},
              "compiled": {"ms_per_step": 120.0, "tokens_per_s": 68267}}
rc, out = table(conveyor(110.0), torch_side)
print(out)
check(rc == 0, "a faster Conveyor at 55% MFU passes")
check("PyTorch compiled (the fastest): 0.917" in out, "ratio against the compiled run")
check("55.2%" in out, "Conveyor's MFU: 6e13 / 0.110 s / 989e12")
check("40.4%" in out and "50.6%" in out,
      "PyTorch's MFU (eager, compiled) from the same FLOP count")
rc, out = table(conveyor(130.0), torch_side)
check(rc == 1 and "SLOWER" in out, "slower than the fastest PyTorch fails")
rc, out = table(conveyor(110.0, flops=3.0e13), torch_side)
check(rc == 1 and "BELOW TARGET" in out, "MFU under 45% fails")
rc, out = table({"benchmarks": [{"run_name": "llama/x", "error_occurred": True,
                                 "error_message": "out of memory"}]}, torch_side)
check(rc == 1 and "out of memory" in out, "Conveyor's failure is named and fails")
rc, out = table(conveyor(110.0), {"blocks": 16, "eager": torch_side["eager"],
                                  "compiled": None,
                                  "compiled_error": "torch 1.13 has no torch.compile"})
check(rc == 0 and "has no torch.compile" in out and "PyTorch eager (the fastest)" in out,
      "without a compiled run, eager is the baseline and the reason is shown")

# The PyTorch side itself, on a CPU-sized model.
python = os.environ.get("CONVEYOR_TORCH_PYTHON", "/usr/bin/python3")
env = dict(os.environ, CONVEYOR_BENCH_SECONDS="0.2")
r = subprocess.run([python, os.path.join(bench, "torch_llama_reference.py"),
                    "--device", "cpu", "--tiny", "--precision", "bf16", "--no-compile"],
                   capture_output=True, text=True, env=env, timeout=240)
if r.returncode == 77:
    print(f"skipped the PyTorch part: {r.stderr.strip()}")
    sys.exit(77 if not failures else 1)
check(r.returncode == 0, f"torch_llama_reference.py exits 0 ({r.stderr[-500:]})")
if r.returncode == 0:
    result = json.loads(r.stdout)
    eager = result["eager"]
    check(eager["ms_per_step"] > 0 and eager["steps"] >= 5, "timed steps")
    # Next-token cross-entropy from a 0.02-scale init starts near ln(512).
    check(3.0 < eager["loss"] < 7.0, f"a plausible loss ({eager['loss']})")
    check(result["compiled"] is None and result["compiled_error"] == "--no-compile",
          "--no-compile is reported")
sys.exit(1 if failures else 0)
