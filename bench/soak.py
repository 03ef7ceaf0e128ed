#!/usr/bin/env python3
"""Soak benchmark: a long-lived cluster under a stream of jobs must not grow.

Starts a coordinator and two workers (real processes on loopback, metrics
served), then runs rounds of a small 2-stage job until at least --steps
training steps have run: even rounds run the job to its end, odd rounds
cancel it halfway, so both ways a job can end are repeated. After two
--warmup-jobs (which fill the coordinator's retention windows) and again at
the end it reads every daemon's /metrics:
resident memory, threads, open file descriptors and the number of metric
series. Threads, descriptors and series must come back to exactly where they
were after the warm-up (nothing of an ended job may stay), and memory may
grow by at most --max-rss-growth (allocator caches settle; a leak per job
would grow with the rounds). Prints a table; exits 1 when a figure grows.

  bench/soak.py [--bin build-bench/bin] [--steps 1000]
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

JOB = """name: soak
model:
  input_shape: [16]
  init: {{seed: 0}}
  layers:
    - dense: {{features: 32}}
    - relu
    - boundary
    - dense: {{features: 8}}
  loss: mse
data: {{source: synthetic-regression, seed: 0}}
training: {{steps: {steps}, batch_size: 8, microbatches: 4}}
optimizer: {{kind: adam, lr: 0.001}}
pipeline: {{schedule: 1f1b}}
checkpoint: {{dir: {dir}}}
"""


def scrape(address):
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    series = [l for l in text.splitlines() if l and not l.startswith("#")]

    def value(name):
        for l in series:
            if l.startswith(name + " ") or l.startswith(name + "{"):
                return float(l.rsplit(" ", 1)[1])
        raise KeyError(f"{name} not served by {address}:\n{text[:2000]}")

    return {
        "rss_bytes": value("process_resident_memory_bytes"),
        "threads": value("process_threads"),
        "open_fds": value("process_open_fds"),
        # Process gauges are always there; what must not grow is the rest
        # (per-job series must be removed when the job ends).
        "series": len(series),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser.add_argument("--bin", default=os.path.join(root, "build-bench", "bin"))
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--steps-per-job", type=int, default=40)
    parser.add_argument("--max-rss-growth", type=float, default=0.05)
    # The coordinator keeps step timelines for its newest 32 ended jobs
    # (JobManagerOptions::trace_finished_jobs): memory is measured from when
    # that window is full.
    parser.add_argument("--warmup-jobs", type=int, default=34)
    args = parser.parse_args()
    ctl = os.path.join(args.bin, "conveyorctl")
    tmp = tempfile.mkdtemp(prefix="conveyor-soak-")
    procs = []

    def run_ctl(*argv, check=True):
        r = subprocess.run([ctl, *argv, "--coordinator", address], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"conveyorctl {' '.join(argv)}: {r.stdout}{r.stderr}")
        return r

    try:
        ready = os.path.join(tmp, "ready")
        procs.append(subprocess.Popen(
            [os.path.join(args.bin, "conveyor-coordinator"), "--listen", "127.0.0.1:0",
             "--metrics-address", "127.0.0.1:0", "--ready-file", ready],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "coordinator.log"), "w")))
        for _ in range(200):
            if os.path.exists(ready) and len(open(ready).read().splitlines()) >= 2:
                break
            time.sleep(0.05)
        lines = open(ready).read().splitlines()
        address, coordinator_metrics = lines[0], lines[1].split()[1]
        for n in range(2):
            procs.append(subprocess.Popen(
                [os.path.join(args.bin, "conveyor-worker"), "--coordinator", address,
                 "--name", f"soak-{n}", "--metrics-address", "127.0.0.1:0"],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, f"worker{n}.log"), "w")))
        daemons = {}
        for _ in range(100):
            table = run_ctl("workers").stdout
            found = re.findall(r"^\S+\s+(soak-\d)\s+IDLE\s.*?(127\.0\.0\.1:\d+)\s*$", table, re.M)
            if len(found) == 2:
                daemons = {"coordinator": coordinator_metrics, **dict(found)}
                break
            time.sleep(0.1)
        if not daemons:
            raise RuntimeError("the workers did not register:\n" + table)

        steps = rounds = 0
        samples = {}
        start = None
        while start is None or steps < args.steps:
            ckpt = os.path.join(tmp, "ckpt")
            job_file = os.path.join(tmp, "job.yaml")
            cancel = rounds % 2 == 1
            with open(job_file, "w") as f:
                # A job to cancel would run for hours.
                f.write(JOB.format(steps=10**6 if cancel else args.steps_per_job,
                                   dir=ckpt))
            job_id = run_ctl("submit", job_file).stdout.split()[0]
            if cancel:
                # Let it run a few steps, then cancel.
                while True:
                    status = run_ctl("status", job_id).stdout
                    m = re.search(r"(\d+)/\d+ steps", status)
                    if m and int(m.group(1)) >= args.steps_per_job // 2:
                        break
                    time.sleep(0.02)
                run_ctl("cancel", job_id)
            r = run_ctl("watch", job_id, check=False)
            status = run_ctl("status", job_id).stdout
            m = re.search(r"(\d+)/\d+ steps", status)
            steps += int(m.group(1)) if m else 0
            want = "CANCELLED" if cancel else "SUCCEEDED"
            if want not in status:
                raise RuntimeError(f"round {rounds}: {status}{r.stdout}{r.stderr}")
            # Every worker idle again before sampling.
            for _ in range(100):
                if run_ctl("workers").stdout.count(" IDLE ") >= 2:
                    break
                time.sleep(0.05)
            subprocess.run(["rm", "-rf", ckpt])
            rounds += 1
            # Warm-up: jobs of each ending, so every bounded label set (job
            # states, RPC methods and codes) has been seen and the retention
            # windows are full; then the measured rounds.
            if rounds == max(2, args.warmup_jobs):
                samples["warm"] = {d: scrape(a) for d, a in daemons.items()}
                start, steps = time.time(), 0
        samples["end"] = {d: scrape(a) for d, a in daemons.items()}
        elapsed = time.time() - start

        measured = rounds - max(2, args.warmup_jobs)
        print(f"soak: after {max(2, args.warmup_jobs)} warm-up jobs, {measured} jobs "
              f"({measured // 2} cancelled halfway) ran {steps} steps in {elapsed:.1f} s")
        print(f"{'daemon':<12} {'figure':<10} {'after warm-up':>14} {'at the end':>14} {'change':>10}  result")
        failed = 0
        for d in daemons:
            for k in ("rss_bytes", "threads", "open_fds", "series"):
                a, b = samples["warm"][d][k], samples["end"][d][k]
                if k == "rss_bytes":
                    ok = b <= a * (1 + args.max_rss_growth)
                    change = f"{(b / a - 1) * 100:+.1f}%"
                    fa, fb = f"{a / 2**20:.1f} MiB", f"{b / 2**20:.1f} MiB"
                else:
                    ok = b <= a
                    change = f"{b - a:+.0f}"
                    fa, fb = f"{a:.0f}", f"{b:.0f}"
                failed += not ok
                print(f"{d:<12} {k:<10} {fa:>14} {fb:>14} {change:>10}  {'ok' if ok else 'GREW'}")
        print(f"(threads, descriptors and series must not grow; memory by at most "
              f"{args.max_rss_growth * 100:.0f}%)")
        return 1 if failed else 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    sys.exit(main())
