"""`make e2e-churn`: the same seeded churn on a simulated GPU fleet, once with the stock kube-scheduler
and once with gpu-placement installed by the chart, then four lines (docs/performance.md).

Each run gets a fresh control plane (tests/e2e/cluster.py), KWOK with the fleet's Stages, 1,000 fake
8-GPU nodes with validator pods, and the plan's Jobs and faults played in real time. The truth comes from
the harness (tests/e2e/churn/truth.py); the gpu-placement run's own figure from `gpu-placement report`
against a real Prometheus that scraped the webhook and evaluated the chart's recording rules.

    python -m tests.e2e.churn [--seed 45] [--nodes 1000] [--pods 2000] [--minutes 8] [--only stock|gpu-placement]

Exit status 1 when the gpu-placement run misses a goal of issue 45 (each missed goal printed).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import yaml

from gpu_placement.base.timestamps import parse_time
from gpu_placement.facts.launch import classify
from gpu_placement.outcomes.counter import WATERMARK_ANNOTATION
from tests.e2e.churn.fleet import Churn, Kwok, make_fleet
from tests.e2e.churn.schedule import Plan, make_plan
from tests.e2e.churn.truth import Run, four_lines, goals
from tests.e2e.cluster import Kubelets, free_port, start_control_plane, wait_for
from tests.e2e.conftest import E2E, WEBHOOK
from tests.e2e.deploy import GPU_PLACEMENT, NAMESPACE, find, install, render, webhook_port
from tests.prometheus import tool

STOCK, PLACED = "stock", "gpu-placement"


def say(text: str) -> None:
    print(f"[churn {time.strftime('%H:%M:%S')}] {text}", flush=True)


@contextlib.contextmanager
def chart(plane: Any) -> Iterator[E2E]:
    """The chart installed with its defaults, its webhook and scheduler pod running as local processes
    (as `make e2e` runs them), and no emulated kubelet: KWOK is the fleet's."""
    api = plane.api
    docs = render(None)
    env = E2E(plane, api, cast(Kubelets, None), docs)  # env.nodes() is not used: KWOK runs the nodes
    try:
        install(api, docs)
        env.start_webhook(0)
        wait_for("the webhooks written with their caBundle", env.ca_bundle_trusted, timeout=60, interval=0.5)
        env.start_scheduler()
        wait_for("the scheduler's leader Lease", lambda: api.http.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/gpu-placement").status_code == 200,
            timeout=60)
        yield env
    finally:
        env.supervisor.stop()
        for pod in env.chart_pods():
            pod.stop()


class Prometheus:
    """A real Prometheus scraping the webhook's /metrics every 5 s, as the chart's ServiceMonitor asks
    (HTTPS, verified with the webhook's CA against the Service's name), and evaluating the chart's
    recording rules (its PrometheusRule) every 5 s."""

    def __init__(self, work: Path, env: E2E) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        args = find(env.docs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"][0]["args"]
        name = args[args.index("--cert-secret") + 1]  # the Secret --manage-certs keeps the CA in
        data = env.api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{name}")["data"]
        (work / "ca.crt").write_bytes(base64.b64decode(data["ca.crt"]))
        [rule] = [d for d in render({"serviceMonitor": {"enabled": True}}) if d["kind"] == "PrometheusRule"]
        (work / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        targets = [f"127.0.0.1:{webhook_port(pod, env.docs)}" for pod in env.webhooks]
        (work / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
            "rule_files": [str(work / "rules.yaml")],
            "scrape_configs": [{"job_name": "gpu-placement", "scheme": "https", "metrics_path": "/metrics",
                                "tls_config": {"ca_file": str(work / "ca.crt"),
                                               "server_name": f"{WEBHOOK}.{NAMESPACE}.svc"},
                                "static_configs": [{"targets": targets}]}]}))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (work / "prometheus.log").open("ab")
        self.process = subprocess.Popen(
            [tool("prometheus"), f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=self.log, stderr=subprocess.STDOUT)
        wait_for("prometheus ready", lambda: httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200,
                 timeout=60, interval=0.5)

    def value(self, promql: str) -> float | None:
        result = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10).json()["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def launches_exported(env: E2E) -> float:
    """The cluster's counted launches, as the webhook exports them (the leader's totals)."""
    text = httpx.get(env.webhook_url(env.webhooks[0], "/metrics"), verify=False, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("gpu_placement_gpu_pod_starts_total{"))


def report(env: E2E, prometheus: Prometheus, ended: float) -> float | None:
    """`gpu-placement report` for the run, once the counter's watermark passed every launch and
    Prometheus has scraped and recorded the final totals: its launch success in percent."""
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{NAMESPACE}-outcomes"

    def counted() -> bool:
        annotations = env.api.get(lease)["metadata"].get("annotations") or {}
        return (parse_time(annotations.get(WATERMARK_ANNOTATION)) or 0.0) >= ended

    wait_for("the outcome counter's watermark past the run's last launch", counted, timeout=400, interval=5.0)
    total = launches_exported(env)
    wait_for(f"Prometheus recording the {total:.0f} launches counted", lambda: prometheus.value(
        "sum(gpu_placement:gpu_pod_starts:total)") == total, timeout=120, interval=2.0)
    # The report's window ends on a whole minute (Window.ending): the next one, once it has passed.
    time.sleep(math.ceil(time.time() / 60) * 60 + 1 - time.time())
    run = subprocess.run([GPU_PLACEMENT, "report", "--prometheus", prometheus.url, "--since", "120m", "-o", "json"],
                         capture_output=True, text=True, timeout=120, check=False)
    if run.returncode != 0:
        say(f"gpu-placement report failed ({run.returncode}): {run.stderr.strip()[-500:]}")
        return None
    figures = json.loads(run.stdout)["figures"]["launches"]
    say(f"report: {figures['started']} of {figures['total']} launches started, failed {figures['failed']}")
    success = figures.get("success")
    return None if success is None else 100.0 * float(success)


def run_one(plan: Plan, mode: str, keep: bool) -> tuple[Run, float | None, list[str]]:
    """One run of the plan: (the truth, the report's launch success or None, problems)."""
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"gpu-placement-churn-{mode}-"))
    plane = start_control_plane(work)
    assert plane.api is not None
    kwok = Kwok(plane)
    problems: list[str] = []
    figure = None
    try:
        kwok.install()
        kwok.start()
        with contextlib.ExitStack() as stack:
            env = stack.enter_context(chart(plane)) if mode == PLACED else None
            prometheus = Prometheus(work / "prometheus", env) if env else None
            if prometheus:
                stack.callback(prometheus.stop)
            took = make_fleet(plane.api, plan.nodes)
            say(f"{mode}: {len(plan.nodes)} nodes with validators Ready and schedulable in {took:.0f} s "
                f"(control plane and chart in {time.monotonic() - t0 - took:.0f} s)")
            churn = Churn(plane.api, kwok, plan)

            def stop_schedulers() -> None:
                if env is not None and env.scheduler is not None:
                    env.scheduler.stop("kube-scheduler")
                plane.procs["kube-scheduler"].stop()

            say(f"{mode}: churn for {plan.seconds / 60:.1f} minutes: {len(plan.jobs)} Jobs, {plan.pods} GPU pods "
                f"({plan.residents} of them resident), {len(plan.faults)} faults")
            churn.run(stop_schedulers)
            ended = time.time()
            truth = churn.ledger.run()
            problems += churn.errors + [f"truth: {line}" for line in churn.ledger.check()]
            problems += [f"gpu-placement's classify reads {n} launches otherwise: {what}"
                         for what, n in churn.ledger.readings(classify).items()]
            say(f"{mode}: {truth.started} of {truth.launches} launches started ({truth.success:.1f} %), failed by "
                f"fault: {truth.by_state}; wall time so far {time.monotonic() - t0:.0f} s")
            if env is not None and prometheus is not None:
                figure = report(env, prometheus, ended)
        (work / "churn.log").write_text("\n".join(churn.log) + "\n")
    finally:
        kwok.stop()
        plane.stop()
        if keep or problems:
            say(f"{mode}: logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    say(f"{mode}: done in {time.monotonic() - t0:.0f} s")
    return truth, figure, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e.churn", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=45)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--only", choices=(STOCK, PLACED))
    parser.add_argument("--keep", action="store_true", help="keep every process's log")
    args = parser.parse_args(argv)
    plan = make_plan(args.seed, args.nodes, args.minutes, args.pods)
    started = time.monotonic()
    runs: dict[str, Run] = {}
    figure = None
    problems: list[str] = []
    for mode in (STOCK, PLACED):
        if args.only in (None, mode):
            runs[mode], got, found = run_one(plan, mode, args.keep)
            figure = got if mode == PLACED else figure
            problems += [f"{mode}: {p}" for p in found]
    say(f"both runs in {(time.monotonic() - started) / 60:.1f} minutes")
    for problem in problems[:20]:
        say(f"problem: {problem}")
    empty = Run(0, 0, 0)
    for line in four_lines(len(plan.nodes), plan.pods, len(plan.faults), plan.silent, plan.seconds / 60,
                           runs.get(STOCK, empty), runs.get(PLACED, empty), figure):
        print(line, flush=True)
    if PLACED not in runs:
        return 0
    missed = goals(runs[PLACED], plan.silent, figure)
    for goal in missed:
        print(f"churn: goal missed: {goal}", flush=True)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
