#!/usr/bin/env python3
"""Alerting integration test: deploy/prometheus/alerts.yml on real daemons.

Starts a real coordinator and two workers on loopback and a real Prometheus
(Debian's `prometheus`) that scrapes them every second and evaluates a copy
of deploy/prometheus/alerts.yml every second. Then:
  - every rule evaluates without error (/api/v1/rules health "ok");
  - while a 2-stage job with checkpoints runs, no alert is pending or
    firing, and ConveyorJobStalled and ConveyorCheckpointStale with their
    thresholds set to 0 (extra rules of the copy) fire for the job, so their
    expressions, joins included, match the coordinator's real series;
  - after kill -9 of one worker (the job has no restart policy, so it fails
    and the worker is LOST), ConveyorJobFailed and ConveyorWorkerLost fire
    through /api/v1/alerts, their descriptions naming the job and the worker.
Exits 0 on success, 1 on a failure, 77 (skipped) when prometheus or promtool
is not installed.

Usage: prometheus_alerts_test.py BIN_DIR SOURCE_DIR
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse

# No __pycache__ in the source tree from importing the sibling test.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prometheus_test import (Cluster, conveyorctl, http_get,  # noqa: E402
                             start_prometheus, wait_for)


def test_rules(source_dir):
    """The text of alerts.yml for a test that must finish in seconds.

    Every `for:` becomes 0s: the real durations (minutes) only delay firing
    and are covered by alerts_test.yml's `promtool test rules` cases. Two
    extra rules are the stall and checkpoint alerts with their factors,
    floors and fallback set to 0, so that they fire on a healthy job: that
    shows their expressions select the real series. Plain text edits (no
    YAML library needed): the rules are the file's last list, one
    `      - alert:` item each.
    """
    with open(os.path.join(source_dir, "deploy/prometheus/alerts.yml")) as f:
        text = f.read()
    text = re.sub(r"^(\s+)for: \S+$", r"\1for: 0s", text, flags=re.M)
    extra = []
    for name in ("ConveyorJobStalled", "ConveyorCheckpointStale"):
        m = re.search(r"^      - alert: " + name + r"\n.*?(?=^      [-#]|\Z)",
                      text, flags=re.M | re.S)
        if not m:
            raise RuntimeError(f"no rule {name} in alerts.yml")
        rule = m.group(0).replace(f"alert: {name}",
                                  f"alert: TestZeroThreshold{name}")
        zero = rule
        for factor in ("10 * (", "3 * conveyor_"):
            zero = zero.replace(factor, "0 * " + factor)
        zero = zero.replace("300)", "0)").replace("+ 1800", "+ 0")
        if zero == rule:
            raise RuntimeError(f"could not zero the thresholds of {name}")
        extra.append(zero)
    return text.rstrip("\n") + "\n" + "".join(extra)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    bin_dir, source_dir = sys.argv[1], sys.argv[2]
    prometheus = shutil.which("prometheus")
    promtool = shutil.which("promtool")
    if not prometheus or not promtool:
        print("SKIP: prometheus and promtool are not installed "
              "(scripts/install-deps installs them)")
        return 77

    failures = []
    tmp = tempfile.mkdtemp(prefix="conveyor-alerts-test-")
    cluster = Cluster(bin_dir, tmp)
    try:
        rules_file = os.path.join(tmp, "alerts.yml")
        with open(rules_file, "w") as f:
            f.write(test_rules(source_dir))
        subprocess.run([promtool, "check", "rules", rules_file], check=True,
                       capture_output=True)

        ready = os.path.join(tmp, "coordinator.ready")
        # A short heartbeat timeout: a killed worker is LOST in seconds even
        # where its closed connection is noticed late.
        cluster.spawn("coordinator", [
            os.path.join(bin_dir, "conveyor-coordinator"), "--listen",
            "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--ready-file",
            ready, "--heartbeat-timeout", "3"])
        lines = wait_for("the coordinator's ready file",
                         lambda: open(ready).read().splitlines(), 20)
        address = lines[0]
        coordinator_metrics = lines[1].split()[1]
        workers = {}
        for i in range(2):
            workers[f"alert-{i}"] = cluster.spawn(f"worker-{i}", [
                os.path.join(bin_dir, "conveyor-worker"), "--coordinator",
                address, "--data-address", "127.0.0.1:0", "--metrics-address",
                "127.0.0.1:0", "--name", f"alert-{i}"])

        def worker_metrics():
            out = conveyorctl(bin_dir, "workers", "--coordinator", address)
            found = re.findall(r"alert-\d\s+IDLE.*?(127\.0\.0\.1:(?:\d+|\*))\s+"
                               r"(127\.0\.0\.1:\d+)", out.stdout)
            return [m[1] for m in found] if len(found) == 2 else None

        worker_targets = wait_for("2 idle workers with metrics",
                                  worker_metrics, 30)

        api = start_prometheus(cluster, tmp, prometheus, promtool,
                               coordinator_metrics, worker_targets,
                               rules_file=rules_file)

        def api_get(path, **params):
            url = api + path
            if params:
                url += "?" + urllib.parse.urlencode(params)
            answer = json.loads(http_get(url))
            if answer.get("status") != "success":
                raise RuntimeError(answer.get("error", answer))
            return answer["data"]

        def alerts(state="firing"):
            return [a for a in api_get("/api/v1/alerts")["alerts"]
                    if a["state"] == state]

        def named(name, state="firing"):
            return [a for a in alerts(state)
                    if a["labels"]["alertname"] == name]

        # No restart policy: losing a worker fails the job.
        job_file = os.path.join(tmp, "job.yaml")
        with open(job_file, "w") as f:
            f.write("name: alerts-test\nmodel:\n  input_shape: [1]\n"
                    "  init: {seed: 0}\n  layers:\n"
                    "    - delay: {forward_ms: 2, backward_ms: 4}\n"
                    "    - boundary\n"
                    "    - delay: {forward_ms: 2, backward_ms: 4}\n"
                    "  loss: mse\ndata: {source: synthetic-regression}\n"
                    "training: {steps: 100000, batch_size: 8, microbatches: 4}\n"
                    "optimizer: {kind: sgd, lr: 0.001}\n"
                    "pipeline: {schedule: 1f1b}\n"
                    f"checkpoint: {{dir: {tmp}/ckpt, every: 50}}\n")
        submitted = conveyorctl(bin_dir, "submit", job_file, "--coordinator",
                                address)
        if submitted.returncode != 0:
            raise RuntimeError(f"submit failed: {submitted.stderr}")
        job_id = submitted.stdout.split()[0]
        print(f"submitted {job_id}; Prometheus on {api}")

        def query(expr):
            return api_get("/api/v1/query", query=expr)["result"]

        wait_for("step rates in Prometheus", lambda: query(
            f'rate(conveyor_job_steps_completed_total{{job_id="{job_id}"}}'
            f'[10s]) > 0'), 60)

        # Healthy: the zeroed copies fire for this job, the real alerts stay
        # silent.
        for name in ("TestZeroThresholdConveyorJobStalled",
                     "TestZeroThresholdConveyorCheckpointStale"):
            try:
                fired = wait_for(f"{name} for {job_id}", lambda: [
                    a for a in named(name)
                    if a["labels"].get("job_id") == job_id], 20)
                if fired[0]["labels"].get("name") != "alerts-test":
                    failures.append(f"{name}: no job name: {fired[0]}")
                print(f"{name} fires on the running job: ok")
            except RuntimeError as e:
                failures.append(f"{e} (the expression selects no series; "
                                "are the job's gauges exported?)")
        healthy = [a["labels"]["alertname"] for a in
                   alerts("firing") + alerts("pending")
                   if not a["labels"]["alertname"].startswith("Test")]
        if healthy:
            failures.append(f"alerts with a healthy job: {healthy}")
        print(f"alerts with a healthy job: {healthy or 'none'}")

        unhealthy = [f"{r['name']}: {r.get('lastError')}"
                     for g in api_get("/api/v1/rules")["groups"]
                     for r in g["rules"] if r.get("health") != "ok"]
        if unhealthy:
            failures.append(f"rules that fail to evaluate: {unhealthy}")
        print(f"rules evaluating without error: "
              f"{'all' if not unhealthy else unhealthy}")

        # One kill gives both alerts: the job fails (no restarts) and the
        # worker is LOST.
        victim = "alert-1"
        os.killpg(workers[victim].pid, signal.SIGKILL)
        workers[victim].wait()
        print(f"killed {victim} (kill -9)")

        try:
            failed = wait_for("ConveyorJobFailed", lambda: named(
                "ConveyorJobFailed"), 40)[0]
            print("ConveyorJobFailed: firing:",
                  failed["annotations"]["description"])
            if failed["labels"].get("severity") != "warning":
                failures.append(f"ConveyorJobFailed severity: {failed}")
            # The job's id comes from conveyor_recent_job_end_timestamp_seconds.
            if job_id not in failed["annotations"]["description"]:
                failures.append(f"ConveyorJobFailed does not name {job_id}: "
                                f"{failed['annotations']['description']}")
        except RuntimeError as e:
            failures.append(str(e))
        try:
            lost = wait_for("ConveyorWorkerLost", lambda: named(
                "ConveyorWorkerLost"), 30)[0]
            print("ConveyorWorkerLost: firing:",
                  lost["annotations"]["description"])
            if victim not in lost["annotations"]["description"]:
                failures.append(f"ConveyorWorkerLost does not name {victim}: "
                                f"{lost['annotations']['description']}")
        except RuntimeError as e:
            failures.append(str(e))
        status = conveyorctl(bin_dir, "status", job_id, "--coordinator",
                             address)
        if "FAILED" not in status.stdout.upper():
            failures.append(f"{job_id} did not fail:\n{status.stdout}")
        others = sorted({a["labels"]["alertname"] for a in alerts()})
        print(f"firing after the kill: {', '.join(others)}")
    except Exception as e:
        failures.append(f"{type(e).__name__}: {e}")
        for name, _ in cluster.procs:
            print(f"--- {name} log:\n{cluster.log_tail(name)}")
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    for f in failures:
        print("FAIL:", f)
    print("PASS" if not failures else f"{len(failures)} failure(s)")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
