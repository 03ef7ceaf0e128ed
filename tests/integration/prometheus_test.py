#!/usr/bin/env python3
"""Prometheus integration test: the metrics as an operator's Prometheus sees them.

Starts a real coordinator and four workers on loopback, each serving /metrics
on a free port, and a real Prometheus server (Debian's `prometheus`) scraping
them every second. Workers are started with --peak-tflops so that jobs have
an MFU. A short job runs to its end first (for the dashboard's recent-jobs
table); then, while a 4-stage 1f1b job of fixed-time and dense layers runs:
  - `promtool check config` passes on deploy/prometheus/prometheus.yml;
  - `promtool check metrics` passes on each daemon's /metrics;
  - every PromQL expression of deploy/grafana/dashboards/conveyor.json (its
    panels' targets and its variables' label_values queries), with the
    dashboard's variables substituted, returns data through Prometheus' HTTP
    API.
Exits 0 on success, 1 on a failure, 77 (skipped) when prometheus or promtool
is not installed.

Usage: prometheus_test.py BIN_DIR SOURCE_DIR
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

SCRAPE_SECONDS = 1
RATE_INTERVAL = "10s"  # What Grafana's $__rate_interval would be at 1 s.


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def wait_for(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception:  # Not up yet.
            pass
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


class Cluster:
    """The daemons and Prometheus, each in its own process group."""

    def __init__(self, bin_dir, tmp):
        self.bin_dir = bin_dir
        self.tmp = tmp
        self.procs = []

    def spawn(self, name, argv):
        log = open(os.path.join(self.tmp, name + ".log"), "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def log_tail(self, name):
        try:
            with open(os.path.join(self.tmp, name + ".log")) as f:
                return "".join(f.readlines()[-20:])
        except OSError:
            return ""

    def stop(self):
        for _, proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def conveyorctl(bin_dir, *args):
    return subprocess.run([os.path.join(bin_dir, "conveyorctl"), *args],
                          capture_output=True, text=True, timeout=30)


def start_prometheus(cluster, tmp, prometheus, promtool, coordinator_metrics,
                     worker_targets, interval=1, rules_file=None):
    """Starts a Prometheus scraping the daemons every `interval` seconds
    (and evaluating `rules_file`, if given) once promtool accepts its
    configuration; returns its base URL once it is ready."""
    prom_port = free_port()
    config = os.path.join(tmp, "prometheus.yml")
    rules = f"rule_files:\n  - {rules_file}\n" if rules_file else ""
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: {interval}s
  evaluation_interval: {interval}s
{rules}scrape_configs:
  - job_name: conveyor-coordinator
    static_configs:
      - targets: ['{coordinator_metrics}']
  - job_name: conveyor-worker
    static_configs:
      - targets: [{', '.join(repr(w) for w in worker_targets)}]
""")
    subprocess.run([promtool, "check", "config", config], check=True,
                   capture_output=True)
    cluster.spawn("prometheus", [
        prometheus, f"--config.file={config}",
        f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
        f"--web.listen-address=127.0.0.1:{prom_port}"])
    api = f"http://127.0.0.1:{prom_port}"
    wait_for("Prometheus to be ready",
             lambda: http_get(api + "/-/ready"), 60)
    return api


def dashboard_queries(dashboard):
    """(where, expr) for every panel target and variable query."""
    out = []

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dashboard.get("panels", [])):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append((f"panel '{p.get('title')}' {t.get('refId')}",
                            t["expr"]))
    for v in dashboard.get("templating", {}).get("list", []):
        query = v.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if v.get("type") == "query" and query:
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", query)
            if not m:
                raise RuntimeError(f"variable {v['name']}: unexpected query {query}")
            # label_values(selector, label) has data when the selector has.
            out.append((f"variable {v['name']}", m.group(1)))
    return out


def substitute(expr, job_id):
    for name, value in (("$__rate_interval", RATE_INTERVAL),
                        ("${job_id}", job_id), ("$job_id", job_id),
                        ("${stage}", ".*"), ("$stage", ".*")):
        expr = expr.replace(name, value)
    if "$" in expr:
        raise RuntimeError(f"unknown variable left in: {expr}")
    return expr


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
    subprocess.run([promtool, "check", "config",
                    os.path.join(source_dir, "deploy/prometheus/prometheus.yml")],
                   check=True, capture_output=True)
    print("promtool check config deploy/prometheus/prometheus.yml: ok")

    tmp = tempfile.mkdtemp(prefix="conveyor-prometheus-test-")
    cluster = Cluster(bin_dir, tmp)
    try:
        ready = os.path.join(tmp, "coordinator.ready")
        cluster.spawn("coordinator", [
            os.path.join(bin_dir, "conveyor-coordinator"), "--listen",
            "127.0.0.1:0", "--metrics-address", "127.0.0.1:0", "--ready-file",
            ready, "--heartbeat-timeout", "5"])
        lines = wait_for("the coordinator's ready file",
                         lambda: open(ready).read().splitlines(), 20)
        address = lines[0]
        coordinator_metrics = lines[1].split()[1]
        for i in range(4):
            cluster.spawn(f"worker-{i}", [
                os.path.join(bin_dir, "conveyor-worker"), "--coordinator",
                address, "--data-address", "127.0.0.1:0", "--metrics-address",
                "127.0.0.1:0", "--name", f"prom-{i}",
                # Any peak: conveyor_job_mfu_ratio exists only when every
                # worker of a job knows its device's.
                "--peak-tflops", "1"])

        def worker_metrics():
            out = conveyorctl(bin_dir, "workers", "--coordinator", address)
            found = re.findall(r"prom-\d\s+IDLE.*?(127\.0\.0\.1:(?:\d+|\*))\s+"
                               r"(127\.0\.0\.1:\d+)", out.stdout)
            return [m[1] for m in found] if len(found) == 4 else None

        workers = wait_for("4 idle workers with metrics", worker_metrics, 30)
        targets = [coordinator_metrics] + workers

        api = start_prometheus(cluster, tmp, prometheus, promtool,
                               coordinator_metrics, workers,
                               interval=SCRAPE_SECONDS)

        # Dense layers give the model FLOPs, hence an MFU; the delays make
        # the steps long enough to see the pipeline's gauges.
        layers = "".join(
            ("    - boundary\n" if s else "") +
            "    - dense: {features: 1}\n"
            "    - delay: {forward_ms: 2, backward_ms: 4}\n" for s in range(4))

        def submit(name, steps):
            job_file = os.path.join(tmp, name + ".yaml")
            with open(job_file, "w") as f:
                f.write(f"name: {name}\nmodel:\n  input_shape: [1]\n"
                        "  init: {seed: 0}\n  layers:\n" + layers +
                        "  loss: mse\ndata: {source: synthetic-regression}\n"
                        f"training: {{steps: {steps}, batch_size: 8, "
                        "microbatches: 8}\n"
                        "optimizer: {kind: sgd, lr: 0.001}\n"
                        "pipeline: {schedule: 1f1b}\n")
            submitted = conveyorctl(bin_dir, "submit", job_file,
                                    "--coordinator", address)
            if submitted.returncode != 0:
                raise RuntimeError(f"submit failed: {submitted.stderr}")
            return submitted.stdout.split()[0]

        # conveyor_recent_job_* has only ended jobs.
        short_id = submit("prometheus-test-short", 3)
        watched = conveyorctl(bin_dir, "watch", short_id, "--coordinator",
                              address)
        if watched.returncode != 0:
            raise RuntimeError(f"{short_id} did not succeed: {watched.stdout}"
                               f"{watched.stderr}")
        job_id = submit("prometheus-test", 100000)
        print(f"submitted {job_id}; Prometheus on {api}, scraping "
              f"{len(targets)} daemons every {SCRAPE_SECONDS} s")

        for target in targets:
            text = http_get(f"http://{target}/metrics")
            check = subprocess.run([promtool, "check", "metrics"], input=text,
                                   capture_output=True, text=True)
            if check.returncode != 0:
                failures.append(f"promtool check metrics {target}: "
                                f"{check.stdout}{check.stderr}")
        print(f"promtool check metrics on {len(targets)} daemons: "
              f"{'ok' if not failures else 'FAILED'}")

        def query(expr):
            url = api + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            answer = json.loads(http_get(url))
            if answer.get("status") != "success":
                raise RuntimeError(answer.get("error", answer))
            return answer["data"]["result"]

        # Rates need two scrapes of a running job within the rate interval.
        wait_for("step rates in Prometheus", lambda: query(
            f'rate(conveyor_job_steps_completed_total{{job_id="{job_id}"}}'
            f'[{RATE_INTERVAL}]) > 0'), 60)
        wait_for("data-plane rates in Prometheus", lambda: query(
            f'rate(conveyor_dataplane_transfer_duration_seconds_count'
            f'{{job_id="{job_id}"}}[{RATE_INTERVAL}]) > 0'), 30)

        with open(os.path.join(
                source_dir, "deploy/grafana/dashboards/conveyor.json")) as f:
            dashboard = json.load(f)
        queries = dashboard_queries(dashboard)
        empty = []
        for where, expr in queries:
            for job_value in (job_id, ".*"):
                promql = substitute(expr, job_value)
                try:
                    result = query(promql)
                except Exception as e:  # Bad PromQL: a failure, not a crash.
                    failures.append(f"{where}: {promql}: {e}")
                    continue
                if not result:
                    empty.append(f"{where}: {promql}")
        for e in empty:
            failures.append(f"no data: {e}")
        print(f"dashboard: {len(queries)} expressions x 2 variable settings, "
              f"{len(empty)} without data")

        conveyorctl(bin_dir, "cancel", job_id, "--coordinator", address)
        for name, proc in cluster.procs:
            if proc.poll() is not None:
                failures.append(f"{name} exited early ({proc.returncode}):\n"
                                f"{cluster.log_tail(name)}")
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
