"""What gpu-placement costs kube-scheduler and the API server, side by side in one run.

Scheduling: the same real control plane and nodes, the same GPU pods (created through the chart's
webhooks before any scheduler runs, so admission is not counted), scheduled in rotating batches by
three kube-scheduler processes that serve the same profile name: stock (kube-scheduler's default
profile and configuration, as a cluster runs it without gpu-placement: the adaptive
percentageOfNodesToScore, no plugin arguments; issue 44's baseline), stock-chart (the chart's
configuration without the extender: the same percentageOfNodesToScore and plugin arguments; the
same-configuration line) and gpu-placement (the chart's configuration: the extender's /filter, and
/bind for shares). Both stock configurations pin PodTopologySpread's System defaulting, which leaves
every pod unsignable, so neither batches (opportunistic batching is off for profiles with extenders;
kube-scheduler v1.37.2 framework.go computeBatchablePlugins, podtopologyspread/plugin.go SignPod);
`scheduler_batch_attempts_total` per batch shows it. Only one runs at a
time; each starts after its batch exists and stops once every pod is bound. The extender sidecar
keeps running throughout, so both profiles see the same background (its watch follows every pod).

Per batch: pods/s from the first bind to the last as a watch on the API server sees them; kube-
scheduler's own histograms of the scheduling cycle (`scheduler_scheduling_algorithm_duration_seconds`:
filter and score, the extender's two calls included; kube-scheduler has no extender metric, so the
two profiles' difference is the extender's share) and of the attempt (`scheduler_scheduling_attempt_
duration_seconds`: the cycle plus the bind); the API server's own time for the Binding POST
(`apiserver_request_duration_seconds`, POST pods/binding); the extender's own answer times.

Admission: the same pod creates through the API server with no webhook, with a do-nothing webhook
on the same stack and route (tests/floor_webhook.py behind a Service, the chart's rules and
matchConditions, as many replicas), and with gpu-placement's; creates/s and create latency p50/p99
as the clients see them, in alternating rounds.
"""

from __future__ import annotations

import base64
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.cluster import ADMIN_TOKEN, Proc, free_port, wait_for
from tests.e2e.conftest import E2E
from tests.e2e.deploy import NAMESPACE
from tests.e2e.promtext import EMPTY, Histogram, histogram

__all__ = ["PROFILES", "AdmissionRound", "SchedulingBatch", "admission_side_by_side", "admission_table", "counters",
           "paired_ratios", "scheduling_line", "scheduling_side_by_side", "scheduling_table"]

STOCK, SAME_CONFIG, GPU_PLACEMENT = "stock", "stock-chart", "gpu-placement"
PROFILES = (STOCK, SAME_CONFIG, GPU_PLACEMENT)
_VERBS = ("filter", "prioritize", "bind")
# Pinned in both stock configurations: System defaulting is kube-scheduler's default, and it keeps every pod
# unsignable; a stock that signed pods would batch, which no profile with an extender can.
_PINNED_SPREAD = {"name": "PodTopologySpread", "args": {"defaultingType": "System"}}


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (5 min {five:.1f}), {os.cpu_count()} CPUs"


def make_nodes(e2e: E2E, group: str, count: int, timeout: float = 300) -> list[str]:
    """`count` 8-GPU H100 nodes labelled e2e-group=<group>, each with a Ready validator pod, kept alive
    and schedulable (the not-ready taint lifted by the node lifecycle controller)."""
    names = [f"{group}-{i:04d}" for i in range(count)]

    def add(name: str) -> None:
        e2e.kubelets.add_node(name, "h100x8", labels={"e2e-group": group})
        e2e.kubelets.add_validator(name)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(add, names))
    e2e.kubelets.wait_schedulable(names, timeout=timeout)
    return names


# -- scheduling ---------------------------------------------------------------------------------------

@dataclass(slots=True)
class SchedulingBatch:
    profile: str
    pods: int
    seconds: float  # first bind to last, as the watch saw them
    algorithm: Histogram  # scheduler_scheduling_algorithm_duration_seconds
    attempt: Histogram  # scheduler_scheduling_attempt_duration_seconds{result="scheduled"}
    bind_post: Histogram  # the API server's POST pods/binding
    extender: dict[str, Histogram] = field(default_factory=dict)  # verb -> the extender's answer time
    load: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds from the first bind to the last
    limiter: Histogram = field(default_factory=lambda: EMPTY)  # rest_client_rate_limiter_duration_seconds
    qps: str = ""  # the schedulers' client QPS, as Schedulers.label says it
    batching: dict[str, float] = field(default_factory=dict)  # scheduler_batch_attempts_total by result

    @property
    def pods_per_second(self) -> float:
        return (self.pods - 1) / self.seconds if self.seconds > 0 else float("inf")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds each named process spent between `start()` and `stop()`: load-independent cost.
    With `idle` (CPU seconds per second each spends with nothing to schedule: Lease renewals, the
    controllers, watches), what that background would have cost over the window is taken out."""

    def __init__(self, pids: dict[str, int], idle: dict[str, float] | None = None) -> None:
        self.pids, self.idle = pids, idle or {}
        self.spent: dict[str, float] = {}
        self._start: dict[str, float] = {}
        self._started = 0.0

    def start(self) -> None:
        self._start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self._started = time.monotonic()

    def stop(self) -> None:
        if self._start and not self.spent:
            window = time.monotonic() - self._started
            self.spent = {name: cpu_seconds(pid) - self._start[name] - self.idle.get(name, 0.0) * window
                          for name, pid in self.pids.items()}


def idle_rates(pids: dict[str, int], seconds: float = 3.0) -> dict[str, float]:
    """CPU seconds per second each process spends meanwhile, measured over `seconds`."""
    meter = CpuMeter(pids)
    meter.start()
    time.sleep(seconds)
    meter.stop()
    return {name: spent / seconds for name, spent in meter.spent.items()}


class BindWatch:
    """When each pod of a namespace is first seen bound, from a watch that starts at `version`; the
    meter runs from the first bind to the `expected`-th. `wait_open()` before the scheduler starts: a
    watch opened after the first binds would see them all at once and shorten the window."""

    def __init__(self, e2e: E2E, namespace: str, version: str, expected: int, meter: CpuMeter) -> None:
        self.bound: dict[str, float] = {}
        self.expected, self.meter = expected, meter
        self._stop, self._open = threading.Event(), threading.Event()
        self.error = ""  # the last failure of the watch, opened again after it
        self._thread = threading.Thread(target=self._run, args=(e2e, namespace, version), daemon=True,
                                        name="bind-watch")
        self._thread.start()

    def wait_open(self, timeout: float = 30.0) -> None:
        assert self._open.wait(timeout), "the bind watch did not open"

    def _run(self, e2e: E2E, namespace: str, version: str) -> None:
        """Watches until stopped (at most 10 minutes); a watch that ends or fails is opened again from
        the last version seen, a version too old (410) is listed again, so no bind goes unseen."""
        path = f"/api/v1/namespaces/{namespace}/pods"
        deadline = time.monotonic() + 600
        while not self._stop.is_set() and time.monotonic() < deadline:
            params = {"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true",
                      "timeoutSeconds": "600"}
            try:
                with e2e.api.http.stream("GET", path, params=params, timeout=None) as stream:
                    self._open.set()
                    for line in stream.iter_lines():
                        if self._stop.is_set():
                            return
                        if not line:
                            continue
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":  # 410: the version is gone: list again
                            listed = e2e.api.get(path)
                            for pod in listed["items"]:
                                self._seen(pod)
                            version = listed["metadata"]["resourceVersion"]
                            break
                        version = (obj.get("metadata") or {}).get("resourceVersion") or version
                        if event.get("type") in ("ADDED", "MODIFIED"):  # not BOOKMARK (an object with no spec)
                            self._seen(obj)
            except (httpx.HTTPError, ValueError) as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                time.sleep(0.1)

    def _seen(self, pod: dict[str, Any]) -> None:
        name = pod.get("metadata", {}).get("name")
        if (pod.get("spec") or {}).get("nodeName") and name not in self.bound:
            if not self.bound:
                self.meter.start()
            self.bound[name] = time.monotonic()
            if len(self.bound) == self.expected:
                self.meter.stop()

    def stop(self) -> None:
        self._stop.set()


def _scrape(url: str) -> str:
    """A component's /metrics over HTTPS as the e2e admin (kube-scheduler checks the token with the API
    server), or plain HTTP (the extender)."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"} if url.startswith("https") else {}
    response = httpx.get(url, headers=headers, verify=False, timeout=30)
    response.raise_for_status()
    return response.text


def _extender_histograms(e2e: E2E) -> dict[str, Histogram]:
    """The extender's answer time per verb, and ("post") its Binding POSTs as it sees them."""
    page = _scrape(f"{e2e.extender_url()}/metrics")
    return {**{verb: histogram(page, "gpu_placement_request_seconds", component="extender", verb=verb)
               for verb in _VERBS}, "post": histogram(page, "gpu_placement_bind_post_seconds")}


def _bind_post(e2e: E2E) -> Histogram:
    return histogram(e2e.api.http.get("/metrics").text, "apiserver_request_duration_seconds", verb="POST",
                     resource="pods", subresource="binding")


class Schedulers:
    """Three kube-scheduler processes serving one profile name (`PROFILES`): kube-scheduler's default
    configuration (stock), the chart's without the extender (stock-chart), the chart's (gpu-placement);
    each its own secure port, no leader election (only one runs at a time; the chart's own kube-scheduler is
    stopped meanwhile). `qps`: every client's QPS (burst twice that); None keeps kube-scheduler's default
    (50, burst 100), as the chart does."""

    def __init__(self, e2e: E2E, qps: int | None = None) -> None:
        assert e2e.scheduler is not None
        self.e2e, self.pod, self.qps = e2e, e2e.scheduler, qps
        args, self.env = self.pod.command("kube-scheduler")
        flag = next(i for i, a in enumerate(args) if a.startswith("--config="))
        chart = yaml.safe_load(Path(args[flag].split("=", 1)[1]).read_text())
        chart["leaderElection"] = {"leaderElect": False}
        if qps is not None:
            chart["clientConnection"] = {**chart.get("clientConnection", {}), "qps": qps, "burst": 2 * qps}
        self.args: dict[str, list[str]] = {}
        self.ports: dict[str, int] = {}
        for profile in PROFILES:
            config = dict(chart)
            if profile != GPU_PLACEMENT:
                config.pop("extenders", None)
                config["profiles"] = [{**config["profiles"][0], "pluginConfig": [
                    *config["profiles"][0].get("pluginConfig", []), _PINNED_SPREAD]}]
            if profile == STOCK:  # the default profile and configuration: the adaptive sample, no plugin arguments
                config.pop("percentageOfNodesToScore", None)
                config["profiles"] = [{"schedulerName": chart["profiles"][0]["schedulerName"],
                                       "pluginConfig": [_PINNED_SPREAD]}]
            path = self.pod.dir / f"{profile}-scheduler-qps{qps or 'default'}.yaml"
            path.write_text(yaml.safe_dump(config))
            self.ports[profile] = port = free_port()
            self.args[profile] = [f"--config={path}" if a.startswith("--config=") else
                                  f"--secure-port={port}" if a.startswith("--secure-port=") else a for a in args]
        self.running: Proc | None = None

    @property
    def label(self) -> str:
        return f"client QPS {self.qps}, burst {2 * self.qps}" if self.qps else \
            "client QPS 50, burst 100 (kube-scheduler's default, as the chart runs it)"

    def url(self, profile: str) -> str:
        return f"https://127.0.0.1:{self.ports[profile]}"

    def start(self, profile: str) -> int:
        """Start the profile's scheduler: its process id."""
        assert self.running is None
        proc = self.running = Proc(f"{profile}-kube-scheduler", self.args[profile],
                                   self.pod.dir / f"{profile}-kube-scheduler.log", env=self.env).start()
        assert proc.popen is not None
        return proc.popen.pid

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop()
            self.running = None


def _create(e2e: E2E, namespace: str, group: str, names: list[str], create: Callable[..., httpx.Response]
            ) -> None:
    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda name: create(namespace, name, group).status_code, names))
    assert codes == [201] * len(names), {code: codes.count(code) for code in set(codes)}


def _delete_all(e2e: E2E, namespace: str, selector: str | None = None) -> None:
    params = {"gracePeriodSeconds": "0", **({"labelSelector": selector} if selector else {})}
    # A collection delete of hundreds of pods answers when every one is gone: at 5,000 nodes on a loaded
    # machine that can take longer than the client's usual 30 s.
    e2e.api.http.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", params=params,
                         timeout=120).raise_for_status()
    wait_for(f"pods of {namespace} deleted", lambda: not e2e.api.get(
        f"/api/v1/namespaces/{namespace}/pods", **({"labelSelector": selector} if selector else {}))["items"],
        timeout=120, interval=0.5)


def _our_pids(e2e: E2E) -> dict[str, int]:
    """The processes whose CPU the tables show, besides the scheduler: the API server and etcd, the
    extender sidecar, the webhook replicas."""
    procs = {"kube-apiserver": e2e.plane.procs["kube-apiserver"], "etcd": e2e.plane.procs["etcd"]}
    if e2e.scheduler is not None:
        procs["extender"] = e2e.scheduler.procs["extender"]
    for i, pod in enumerate(e2e.webhooks):
        procs[f"webhook-{i}"] = pod.procs["webhook"]
    return {name: pid for name, proc in procs.items() if (pid := proc.service_pid())}


def _batch(e2e: E2E, schedulers: Schedulers, profile: str, namespace: str, group: str, pods: int,
           serial: int, idle: dict[str, float], profiles: Path | None = None) -> SchedulingBatch:
    names = [f"b{serial:02d}-{i:04d}" for i in range(pods)]
    _create(e2e, namespace, group, names, lambda ns, name, grp: e2e.gpu_pod(ns, name, grp))
    version = e2e.api.get(f"/api/v1/namespaces/{namespace}/pods", limit=1)["metadata"]["resourceVersion"]
    extender_before, post_before = _extender_histograms(e2e), _bind_post(e2e)
    meter = CpuMeter({}, idle)
    watch = BindWatch(e2e, namespace, version, pods, meter)
    watch.wait_open()
    pid = schedulers.start(profile)
    meter.pids = {"kube-scheduler": pid, **_our_pids(e2e)}  # before its first bind: it is still starting
    profiler = Profiler(schedulers.url(profile), pid, _our_pids(e2e).get("extender") if profile == GPU_PLACEMENT
                        else None, profiles / f"{serial:02d}-{profile}" if profiles else None)
    try:
        try:
            wait_for(f"{pods} pods bound by the {profile} scheduler", lambda: len(watch.bound) >= pods, timeout=300,
                     interval=0.05)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; the bind watch saw {len(watch.bound)}, its last failure: "
                               f"{watch.error or 'none'}") from None
        profiler.join()
        page = _scrape(f"{schedulers.url(profile)}/metrics")
    finally:
        schedulers.stop()
        watch.stop()
    extender_after, post_after = _extender_histograms(e2e), _bind_post(e2e)
    times = sorted(watch.bound.values())
    batch = SchedulingBatch(
        profile, pods, times[-1] - times[0],
        histogram(page, "scheduler_scheduling_algorithm_duration_seconds"),
        histogram(page, "scheduler_scheduling_attempt_duration_seconds", result="scheduled"),
        post_after - post_before,
        {verb: extender_after[verb] - extender_before[verb] for verb in extender_after}, os.getloadavg()[0],
        meter.spent, histogram(page, "rest_client_rate_limiter_duration_seconds"),
        batching=counters(page, "scheduler_batch_attempts_total", "result"))
    _delete_all(e2e, namespace)
    return batch


class Profiler:
    """With `out`: kube-scheduler's CPU profile (pprof, its secure port) and the extender's (py-spy,
    raw collapsed stacks) over the first `seconds` of a batch, written as `out`.scheduler.pprof and
    `out`.extender.txt. `join()` before the scheduler stops."""

    def __init__(self, url: str, scheduler: int, extender: int | None, out: Path | None, seconds: int = 4) -> None:
        self.threads: list[threading.Thread] = []
        if out is None:
            return
        out.parent.mkdir(parents=True, exist_ok=True)

        def pprof() -> None:
            wait_for("kube-scheduler serving", lambda: httpx.get(f"{url}/healthz", verify=False, timeout=2)
                     .status_code == 200, timeout=30, interval=0.05)
            answer = httpx.get(f"{url}/debug/pprof/profile", params={"seconds": str(seconds)},
                               headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, verify=False, timeout=seconds + 30)
            answer.raise_for_status()
            out.with_suffix(".scheduler.pprof").write_bytes(answer.content)

        def pyspy() -> None:
            spy = Path(sys.executable).with_name("py-spy")
            # --gil: only the thread holding the GIL is sampled (the one running Python or C under it), so a
            # thread blocked in a read is not counted; a thread preempted while holding it still is.
            subprocess.run([str(spy), "record", "--pid", str(extender), "--duration", str(seconds), "--rate", "250",
                            "--format", "raw", "--gil", "--nonblocking", "-o", str(out.with_suffix(".extender.txt"))],
                           check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=seconds + 30)

        self.threads = [threading.Thread(target=pprof, daemon=True)]
        if extender is not None:
            self.threads.append(threading.Thread(target=pyspy, daemon=True))
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(60)


def scheduling_side_by_side(e2e: E2E, group: str, rounds: int, pods: int, qps: int | None = None,
                            progress: Callable[[str], None] = print, profiles: Path | None = None
                            ) -> list[SchedulingBatch]:
    """`rounds` x (stock, stock-chart, gpu-placement) batches of `pods` one-GPU pods on the nodes of
    `group`; the order rotates every round, so no profile always runs first. Every scheduler's client at
    `qps` (None: kube-scheduler's default). `profiles`: a folder for each batch's CPU profiles."""
    assert e2e.scheduler is not None
    namespace = e2e.namespace("overhead")
    schedulers = Schedulers(e2e, qps)
    e2e.scheduler.stop("kube-scheduler")  # no scheduler runs between batches
    time.sleep(5)  # settled: what every process spends with nothing to schedule (Leases, controllers)
    idle = idle_rates(_our_pids(e2e), 10.0)
    batches: list[SchedulingBatch] = []
    try:
        for r in range(rounds):
            for profile in PROFILES[r % 3:] + PROFILES[:r % 3]:
                batch = _batch(e2e, schedulers, profile, namespace, group, pods, len(batches), idle, profiles)
                batch.qps = schedulers.label
                batches.append(batch)
                progress(f"  round {r + 1} {profile:<13} {batch.pods_per_second:6.0f} pods/s, cycle mean "
                         f"{batch.algorithm.mean * 1e3:.2f} ms, load {batch.load:.1f}")
    finally:
        schedulers.stop()
        e2e.scheduler.start("kube-scheduler")  # as the rest of the suite expects it
    return batches


def scheduling_line(batches: list[SchedulingBatch]) -> str:
    """One line: each profile's pods/s (median of its batches) and gpu-placement's ratio to each stock, at the
    batches' QPS."""
    rates = {p: statistics.median(b.pods_per_second for b in batches if b.profile == p) for p in PROFILES}
    each = {p: ", ".join(f"{b.pods_per_second:.0f}" for b in batches if b.profile == p) for p in rates}
    return (f"at {batches[0].qps}: " + ", ".join(f"{p} {rates[p]:.0f} pods/s ({each[p]})" for p in PROFILES)
            + f": {rates[GPU_PLACEMENT] / rates[STOCK]:.2f}x {STOCK}, {rates[GPU_PLACEMENT] / rates[SAME_CONFIG]:.2f}x "
            f"{SAME_CONFIG}; {load()}")


def counters(page: str, name: str, label: str) -> dict[str, float]:
    """A counter's values summed by one label (kube-scheduler's `profile` label is one name here)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == name:
                key = sample.labels.get(label, "")
                values[key] = values.get(key, 0.0) + sample.value
    return values


def _summed(tables: Iterable[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for table in tables:
        for key, value in table.items():
            total[key] = total.get(key, 0.0) + value
    return total


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def scheduling_table(batches: list[SchedulingBatch], nodes: int) -> str:
    by = {p: [b for b in batches if b.profile == p] for p in PROFILES}

    def total(profile: str, what: Callable[[SchedulingBatch], Histogram]) -> Histogram:
        result = EMPTY
        for batch in by[profile]:
            result = result + what(batch)
        return result

    rates = {p: statistics.median(b.pods_per_second for b in by[p]) for p in by}
    algorithm = {p: total(p, lambda b: b.algorithm) for p in by}
    attempt = {p: total(p, lambda b: b.attempt) for p in by}
    pods = by[STOCK][0].pods
    lines = [f"scheduling side by side: {nodes} nodes, {len(by[STOCK])} batches of {pods} one-GPU pods per profile, "
             f"alternating, both schedulers at {batches[0].qps}; {load()}",
             f"{'profile':<14} {'pods/s (median; each batch)':<40} {'cycle mean':>10} {'p50':>6} {'p99':>6}"
             f" {'attempt p50':>11} {'p99':>6}   ms; cycle = scheduler_scheduling_algorithm_duration_seconds"]
    for p in by:
        each = ", ".join(f"{b.pods_per_second:.0f}" for b in by[p])
        lines.append(f"{p:<14} {rates[p]:>6.0f} ({each}){'':<{max(0, 31 - len(each))}} "
                     f"{_ms(algorithm[p].mean):>10} {_ms(algorithm[p].quantile(0.5)):>6} "
                     f"{_ms(algorithm[p].quantile(0.99)):>6} {_ms(attempt[p].quantile(0.5)):>11} "
                     f"{_ms(attempt[p].quantile(0.99)):>6}")
    ratio = rates[GPU_PLACEMENT] / rates[STOCK]
    share = algorithm[GPU_PLACEMENT].mean - algorithm[SAME_CONFIG].mean
    p99 = algorithm[GPU_PLACEMENT].quantile(0.99) - algorithm[SAME_CONFIG].quantile(0.99)
    goal = 1.0 if nodes >= 5000 else 0.9  # issue 44, against kube-scheduler's default profile and configuration
    verdict = "PASS" if ratio >= goal else "MISS"
    lines += [f"throughput gpu-placement / stock (kube-scheduler's default configuration): {ratio:.2f}x "
              f"(goal >= {goal}x: {verdict})",
              f"second line, the same configuration: gpu-placement / stock-chart "
              f"{rates[GPU_PLACEMENT] / rates[SAME_CONFIG]:.2f}x",
              f"extender's share of the cycle (mean difference to stock-chart, the same configuration): "
              f"{_ms(share)} ms per pod (goal < 1 ms: {'PASS' if share < 1e-3 else 'MISS'}); "
              f"p99 difference {p99 * 1e3:+.2f} ms",
              "opportunistic batching (scheduler_batch_attempts_total by result, all batches): " + "; ".join(
                  f"{p} " + (", ".join(f"{result} {n:.0f}" for result, n in sorted(_summed(
                      b.batching for b in by[p]).items())) or "none") for p in by)]
    limiter = {p: total(p, lambda b: b.limiter) for p in by}
    lines.append("kube-scheduler's client rate limiter (rest_client_rate_limiter_duration_seconds), wait per request: "
                 + "; ".join(f"{p} mean {_ms(limiter[p].mean)} ms, p99 {_ms(limiter[p].quantile(0.99))} ms "
                             f"({limiter[p].count:.0f} requests)" for p in by))
    lines.append("CPU per pod, first bind to last (ms; each process's own CPU time, less its idle rate (measured "
                 "over 10 s before the batches) over the same window):")
    for p in by:
        spent: dict[str, float] = {}
        for batch in by[p]:
            for name, seconds in batch.cpu.items():
                spent[name] = spent.get(name, 0.0) + seconds
        count = sum(b.pods for b in by[p])
        lines.append(f"  {p:<14} " + ", ".join(f"{name} {seconds / count * 1e3:.2f}" for name, seconds in spent.items())
                     + f"; total {sum(spent.values()) / count * 1e3:.2f}")
    gpu = by[GPU_PLACEMENT]
    verbs = {verb: EMPTY for verb in (*_VERBS, "post")}
    for batch in gpu:
        for verb in verbs:
            verbs[verb] = verbs[verb] + batch.extender[verb]
    post_seen = verbs.pop("post")
    post = {p: total(p, lambda b: b.bind_post) for p in by}
    lines.append("in the extender (its own histogram, gpu-placement batches): " + ", ".join(
        f"/{verb} mean {_ms(h.mean)} p99 {_ms(h.quantile(0.99))}" for verb, h in verbs.items()))
    binds = verbs["bind"].count
    if binds:
        lines.append(f"Binding POST as the extender sees it (sent to answer read): mean {_ms(post_seen.mean)} p99 "
                     f"{_ms(post_seen.quantile(0.99))}")
    binder = f"{binds:.0f} of {post[GPU_PLACEMENT].count:.0f} sent by the extender" if binds else \
        "sent by kube-scheduler's own binder: whole GPUs are not bound through /bind"
    lines.append(f"Binding POST in the API server (its own histogram): mean {_ms(post[GPU_PLACEMENT].mean)} p99 "
                 f"{_ms(post[GPU_PLACEMENT].quantile(0.99))} in the gpu-placement batches ({binder}), "
                 f"mean {_ms(post[STOCK].mean)} p99 {_ms(post[STOCK].quantile(0.99))} in the stock batches "
                 "(kube-scheduler's own binder)")
    return "\n".join(lines)


# -- admission ----------------------------------------------------------------------------------------

NO_WEBHOOK, FLOOR = "no webhook", "do-nothing"
_FLOOR = "bench-floor-webhook"
_CASE_LABEL = "bench-admission"


@dataclass(slots=True)
class AdmissionRound:
    case: str
    creates: int
    seconds: float
    latencies: list[float]  # seconds per create, as the clients saw them
    cpu: dict[str, float]  # process -> CPU seconds over the round
    load: float
    round: int = 0  # which round of admission_side_by_side: the do-nothing and gpu-placement cases ran back to back

    @property
    def per_second(self) -> float:
        return self.creates / self.seconds


class FloorWebhook:
    """The do-nothing webhook (tests/floor_webhook.py) wired as the chart wires gpu-placement's: as many
    replicas, a Service the API server reaches through the harness's proxy, configurations copied from
    the chart's (rules, matchConditions, timeouts, failure policies) but selecting only pods labelled
    `bench-admission=do-nothing` in kube-system (exempt from gpu-placement's)."""

    def __init__(self, e2e: E2E, replicas: int) -> None:
        from gpu_placement.web.certs import write_bundle

        self.e2e = e2e
        work = e2e.plane.work / "floor-webhook"
        bundle = write_bundle(work / "certs", _FLOOR, NAMESPACE)
        self.ports = [free_port() for _ in range(replicas)]
        root = Path(__file__).resolve().parents[2]
        self.procs = [Proc(f"floor-webhook-{i}", [sys.executable, "-m", "tests.floor_webhook", "--cert-dir",
                                                    str(work / "certs"), "--listen", f"127.0.0.1:{port}"],
                           work / f"floor-{i}.log", env={"PYTHONPATH": str(root)}).start()
                      for i, port in enumerate(self.ports)]
        for port in self.ports:
            wait_for("the do-nothing webhook", lambda port=port: httpx.get(
                f"https://127.0.0.1:{port}/count", verify=False, timeout=2).status_code == 200, timeout=30)
        e2e.api.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": _FLOOR, "namespace": NAMESPACE},
                       "spec": {"ports": [{"port": 443, "targetPort": 9443}]}})
        cluster_ip = e2e.api.get(f"/api/v1/namespaces/{NAMESPACE}/services/{_FLOOR}")["spec"]["clusterIP"]
        assert e2e.plane.proxy is not None
        e2e.plane.proxy.route(cluster_ip, 443, [("127.0.0.1", port) for port in self.ports])
        ca = base64.b64encode(bundle.ca_cert.read_bytes()).decode()
        self.configurations = []
        for doc in e2e.docs:
            if doc["kind"] not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                continue
            # The chart installs them empty; a ready replica writes the webhooks (webhook/registration.py).
            plural = "mutatingwebhookconfigurations" if doc["kind"].startswith("Mutating") else \
                "validatingwebhookconfigurations"
            live = e2e.api.get(f"/apis/admissionregistration.k8s.io/v1/{plural}/{doc['metadata']['name']}")
            copy = {"apiVersion": doc["apiVersion"], "kind": doc["kind"],
                    "webhooks": json.loads(json.dumps(live.get("webhooks") or []))}
            assert copy["webhooks"], f"{doc['metadata']['name']}: no webhooks written yet"
            copy["metadata"] = {"name": _FLOOR}
            for hook in copy["webhooks"]:
                hook["name"] = f"floor-{hook['name']}"
                hook["clientConfig"]["service"]["name"] = _FLOOR
                hook["clientConfig"]["caBundle"] = ca
                hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}
                hook["objectSelector"] = {"matchLabels": {_CASE_LABEL: FLOOR.replace(" ", "-")}}
            e2e.api.apply(copy)
            self.configurations.append(copy)

    def answered(self) -> int:
        return sum(httpx.get(f"https://127.0.0.1:{port}/count", verify=False, timeout=5).json()["answered"]
                   for port in self.ports)

    def pids(self) -> dict[str, int]:
        return {proc.name: proc.popen.pid for proc in self.procs if proc.popen is not None}

    def close(self) -> None:
        for copy in self.configurations:
            plural = "mutatingwebhookconfigurations" if copy["kind"].startswith("Mutating") else \
                "validatingwebhookconfigurations"
            self.e2e.api.delete(f"/apis/admissionregistration.k8s.io/v1/{plural}/{_FLOOR}")
        self.e2e.api.delete(f"/api/v1/namespaces/{NAMESPACE}/services/{_FLOOR}")
        for proc in self.procs:
            proc.stop()


def _admission_pod(name: str, case: str) -> dict[str, Any]:
    """One GPU pod, the same for every case but its label; it selects no node and names the gpu-placement
    scheduler (which is stopped meanwhile), so nothing schedules it in any case."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {_CASE_LABEL: case.replace(" ", "-"), "app": "bench"}},
            "spec": {"schedulerName": "gpu-placement", "nodeSelector": {"e2e-group": "nowhere"},
                     "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"},
                                                   "requests": {"cpu": "100m", "memory": "128Mi"}}}]}}


def _admission_round(e2e: E2E, case: str, namespace: str, creates: int, clients: int, serial: int,
                     pids: dict[str, int], idle: dict[str, float] | None = None) -> AdmissionRound:
    latencies: list[float] = []
    codes: list[int] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        for i in range(index, creates, clients):
            body = _admission_pod(f"a{serial:02d}-{i:04d}", case)
            start = time.perf_counter()
            code = e2e.api.create(f"/api/v1/namespaces/{namespace}/pods", body).status_code
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                codes.append(code)

    meter = CpuMeter(pids, idle)
    meter.start()
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    seconds = time.perf_counter() - start
    meter.stop()
    assert codes == [201] * creates, {code: codes.count(code) for code in set(codes)}
    return AdmissionRound(case, creates, seconds, latencies, meter.spent, os.getloadavg()[0])


def admission_side_by_side(e2e: E2E, rounds: int, creates: int, clients: int = 8,
                           progress: Callable[[str], None] = print) -> list[AdmissionRound]:
    """`rounds` x (no webhook, do-nothing, gpu-placement) rounds of `creates` pod creates by `clients`
    threads; each round's pods are deleted before the next. The do-nothing webhook and gpu-placement run
    back to back in every round (the machine's load drifts over seconds: a pair sees the same load), each
    first in half the rounds, and no webhook before or after the pair in turn (`_ORDERS`)."""
    assert e2e.scheduler is not None
    floor = FloorWebhook(e2e, replicas=len(e2e.webhooks))
    e2e.scheduler.stop("kube-scheduler")  # nothing schedules the pods: the creates alone are measured
    ours = e2e.namespace("admission")
    where = {NO_WEBHOOK: "kube-system", FLOOR: "kube-system", GPU_PLACEMENT: ours}
    pids = {**_our_pids(e2e), **floor.pids()}
    pids.pop("extender", None)
    results: list[AdmissionRound] = []
    try:
        for case in (NO_WEBHOOK, FLOOR, GPU_PLACEMENT):  # warm-up, not counted: connections, caches
            _admission_round(e2e, case, where[case], 2 * clients, clients, 99, pids)
            _delete_all(e2e, where[case], f"{_CASE_LABEL}={case.replace(' ', '-')}")
        time.sleep(5)  # settled after the warm-up's deletions
        idle = idle_rates(pids, 10.0)
        for r in range(rounds):
            for case in _ORDERS[r % len(_ORDERS)]:
                floor_before, ours_before = floor.answered(), e2e.webhook_requests()
                result = _admission_round(e2e, case, where[case], creates, clients, r, pids, idle)
                result.round = r
                results.append(result)
                floor_calls = floor.answered() - floor_before
                ours_after = e2e.webhook_requests()
                our_calls = sum(ours_after.values()) - sum(ours_before.values())
                # Each case reached exactly the webhooks it should: the API server called them per create.
                assert floor_calls == (2 * creates if case == FLOOR else 0), (case, floor_calls)
                assert our_calls == (2 * creates if case == GPU_PLACEMENT else 0), (case, our_calls)
                progress(f"  round {r + 1} {case:<13} {result.per_second:6.0f} creates/s, "
                         f"p50 {statistics.median(result.latencies) * 1e3:.1f} ms, load {result.load:.1f}")
                _delete_all(e2e, where[case], f"{_CASE_LABEL}={case.replace(' ', '-')}")
    finally:
        floor.close()
        e2e.scheduler.start("kube-scheduler")
    return results


# The cases' order, round by round: the do-nothing webhook and gpu-placement adjacent in each, each first in
# half of them; no webhook first or last.
_ORDERS = ((NO_WEBHOOK, FLOOR, GPU_PLACEMENT), (GPU_PLACEMENT, FLOOR, NO_WEBHOOK),
           (NO_WEBHOOK, GPU_PLACEMENT, FLOOR), (FLOOR, GPU_PLACEMENT, NO_WEBHOOK))


def paired_ratios(results: list[AdmissionRound]) -> list[float]:
    """Per round, the do-nothing webhook's creates/s over gpu-placement's: the two ran back to back."""
    rates: dict[tuple[int, str], float] = {(r.round, r.case): r.per_second for r in results}
    rounds = sorted({r.round for r in results})
    return [rates[(n, FLOOR)] / rates[(n, GPU_PLACEMENT)] for n in rounds
            if (n, FLOOR) in rates and (n, GPU_PLACEMENT) in rates]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def admission_table(results: list[AdmissionRound]) -> str:
    cases = [NO_WEBHOOK, FLOOR, GPU_PLACEMENT]
    by = {c: [r for r in results if r.case == c] for c in cases}
    rate = {c: sum(r.creates for r in by[c]) / sum(r.seconds for r in by[c]) for c in cases}
    lat = {c: [x for r in by[c] for x in r.latencies] for c in cases}
    creates = by[NO_WEBHOOK][0].creates
    lines = [f"admission side by side: {len(by[NO_WEBHOOK])} rounds of {creates} one-GPU pod creates per case, "
             f"8 clients, the do-nothing webhook and gpu-placement back to back in each round; {load()}",
             f"{'case':<14} {'creates/s (all; each round)':<36} {'p50 ms':>7} {'p99 ms':>7}  CPU ms per create (less "
             "each process's idle rate)"]
    for c in cases:
        each = ", ".join(f"{r.per_second:.0f}" for r in by[c])
        spent: dict[str, float] = {}
        for r in by[c]:
            for name, seconds in r.cpu.items():
                spent[name] = spent.get(name, 0.0) + seconds
        count = sum(r.creates for r in by[c])
        cpu = ", ".join(f"{name} {seconds / count * 1e3:.2f}" for name, seconds in spent.items()
                        if abs(seconds / count) > 5e-5)
        lines.append(f"{c:<14} {rate[c]:>6.0f} ({each}){'':<{max(0, 27 - len(each))}} "
                     f"{_quantile(lat[c], 0.5) * 1e3:>7.1f} {_quantile(lat[c], 0.99) * 1e3:>7.1f}  {cpu}")
    vs_floor = rate[FLOOR] / rate[GPU_PLACEMENT]
    p50 = _quantile(lat[GPU_PLACEMENT], 0.5) / _quantile(lat[FLOOR], 0.5)
    p99 = _quantile(lat[GPU_PLACEMENT], 0.99) / _quantile(lat[FLOOR], 0.99)
    lines.append(f"gpu-placement against the do-nothing webhook: {vs_floor:.2f}x slower in creates/s (goal <= 1.2x: "
                 f"{'PASS' if vs_floor <= 1.2 else 'MISS'}); p50 {p50:.2f}x, p99 {p99:.2f}x; against no webhook: "
                 f"{rate[NO_WEBHOOK] / rate[GPU_PLACEMENT]:.2f}x")
    paired = paired_ratios(results)
    if paired:
        median = statistics.median(paired)
        lines.append(f"the same, round by round (the two back to back): median {median:.2f}x "
                     f"({'PASS' if median <= 1.2 else 'MISS'}), {min(paired):.2f}-{max(paired):.2f}x over "
                     f"{len(paired)} rounds ({', '.join(f'{x:.2f}' for x in paired)})")
    return "\n".join(lines)
