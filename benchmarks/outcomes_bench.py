"""What counting launch outcomes costs the view: parsing, applying events, priming, scrapes, a turn.

    .venv/bin/python benchmarks/outcomes_bench.py [--nodes 5000] [--pods 150000] [--pending 200]

The cluster of benchmarks/cache_bench.py (one GPU pod in six), its bound GPU pods given the status a
running pod has (startTime, PodScheduled, a running container), and `--pending` GPU pods that wait
for 8 GPUs with kube-scheduler's message. Figures, each with and without the outcome tracking:

- parse: microseconds per GPU pod in `Ingest.pod` (the Launch record is built for GPU pods only);
- fill: seconds to put every pod in an empty view (a first list), and the one-off prime after it
  (in slices under the view's lock: a probe thread measures the longest wait a reader meets);
- event: microseconds to apply one MODIFIED event of a bound GPU pod (its status changes), median;
- scrape: milliseconds for the outcome families and for the idle-GPU gauges (5,000 nodes);
- turn: milliseconds of a counter turn (turn, emit, settled) with every bound GPU pod tracked.

In process, no network. Other engineers' work may share the machine: the load average is printed.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_placement.base.config import Config
from gpu_placement.base.timestamps import format_time
from gpu_placement.facts import pods as pods_module
from gpu_placement.outcomes.counter import LocalCounter
from gpu_placement.outcomes.idle import IdleGpus
from gpu_placement.outcomes.record import Outcomes
from gpu_placement.samples.cluster import make_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest

GPU = "nvidia.com/gpu"


def _cache_bench() -> Any:
    spec = importlib.util.spec_from_file_location("cache_bench", Path(__file__).with_name("cache_bench.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cluster(nodes: int, pods: int, pending: int) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = _cache_bench().cluster(nodes, pods)
    now = time.time()
    for obj in objects:
        spec = obj.get("spec") or {}
        asks = any(GPU in ((c.get("resources") or {}).get("limits") or {}) for c in spec.get("containers") or ())
        if obj.get("kind") == "Pod" and asks and spec.get("nodeName"):
            obj["metadata"]["creationTimestamp"] = format_time(now - 3600)
            obj["status"].update({"startTime": format_time(now - 3500), "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": format_time(now - 3500)},
                {"type": "Ready", "status": "True", "lastTransitionTime": format_time(now - 3400)}],
                "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0,
                                       "state": {"running": {"startedAt": format_time(now - 3450)}}}]})
    for i in range(pending):
        pod = make_pod("team-01", f"big-{i}", gpus={GPU: 8})
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "message": f"0/{nodes} nodes are available: {nodes} InsufficientGPU: the pod "
                                                   "needs 8 nvidia.com/gpu free and the node has fewer."}]
        objects.append(pod)
    return objects


def build(objects: list[dict[str, Any]], outcomes: bool
          ) -> tuple[ClusterView, Ingest, Outcomes | None, float, float, float]:
    config = Config()
    view = ClusterView(config)
    ingest = Ingest(config)
    tracker = Outcomes(view, config).start() if outcomes else None
    if tracker is not None:
        tracker.count()  # as in a webhook replica, where a counter counts from the view
    by_kind: dict[str, list[dict[str, Any]]] = {"namespaces": [], "nodes": [], "pods": []}
    for obj in objects:
        by_kind[{"Namespace": "namespaces", "Node": "nodes", "Pod": "pods"}[obj["kind"]]].append(obj)
    started = time.perf_counter()
    for kind in ("namespaces", "nodes", "pods"):
        ingest.replace(view, kind, by_kind[kind])
    fill = time.perf_counter() - started
    started = time.perf_counter()
    waits = probe(view, tracker.prime) if tracker is not None else [0.0]
    return view, ingest, tracker, fill, time.perf_counter() - started, max(waits)


def probe(view: ClusterView, work: Any) -> list[float]:
    """Run `work` while a thread takes the view's lock every millisecond: how long each take waited."""
    import threading

    waits: list[float] = []
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            started = time.perf_counter()
            with view.lock:
                waits.append(time.perf_counter() - started)
            time.sleep(0.001)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        work()
    finally:
        done.set()
        thread.join(timeout=5)
    return waits or [0.0]


def parse_us(objects: list[dict[str, Any]], with_launch: bool) -> float:
    ingest = Ingest(Config())
    gpu = [o for o in objects if o["kind"] == "Pod" and ingest.pod(o).gpus]
    original = pods_module.launch_of
    if not with_launch:
        pods_module.launch_of = lambda *_args: None  # type: ignore[assignment]
    try:
        started = time.perf_counter()
        for obj in gpu:
            ingest.pod(obj)
        return (time.perf_counter() - started) / len(gpu) * 1e6
    finally:
        pods_module.launch_of = original


def event_us(view: ClusterView, ingest: Ingest, objects: list[dict[str, Any]], rounds: int = 2000) -> float:
    bound = [o for o in objects if o["kind"] == "Pod" and o["spec"].get("nodeName")
             and ingest.pod(o).gpus][:rounds]
    times = []
    for index, obj in enumerate(bound):
        changed = copy.deepcopy(obj)
        changed["status"]["containerStatuses"][0]["restartCount"] = 1
        changed["status"]["containerStatuses"][0]["lastState"] = {"terminated": {
            "exitCode": 1, "startedAt": format_time(time.time() - 7200), "finishedAt": format_time(time.time() - 60)}}
        changed["metadata"]["resourceVersion"] = str(10_000_000 + index)
        started = time.perf_counter()
        ingest.event(view, "pods", "MODIFIED", changed)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--pending", type=int, default=200)
    parser.add_argument("--fill-only", choices=["plain", "outcomes"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    objects = cluster(args.nodes, args.pods, args.pending)
    if args.fill_only:  # one first list in a fresh process: no other view's garbage in the way
        *_, fill, _, _ = build(objects, outcomes=args.fill_only == "outcomes")
        print(f"{fill:.2f}")
        return 0
    print(f"{args.nodes} nodes, {args.pods} pods (+{args.pending} pending 8-GPU pods); load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"parse: {parse_us(objects, False):.1f} us per GPU pod without the Launch record, "
          f"{parse_us(objects, True):.1f} us with it")
    fills: dict[str, list[str]] = {"plain": [], "outcomes": []}
    for _ in range(2):  # each in its own process, alternating: the machine's load moves between runs
        for mode in fills:
            fills[mode].append(subprocess.run(
                [sys.executable, __file__, "--nodes", str(args.nodes), "--pods", str(args.pods), "--pending",
                 str(args.pending), "--fill-only", mode], capture_output=True, text=True, check=True,
                timeout=600).stdout.strip())
    print(f"fill (first list into an empty view, a fresh process each): {', '.join(fills['plain'])} s without "
          f"outcomes, {', '.join(fills['outcomes'])} s with them")
    view, ingest, _, _, _, _ = build(objects, outcomes=False)
    plain_event = event_us(view, ingest, objects)
    del view, ingest
    view, ingest, tracker, _, prime, longest = build(objects, outcomes=True)
    assert tracker is not None
    print(f"prime after the first list: {prime * 1000:.0f} ms ({len(tracker._launches)} bound GPU pods tracked); the "
          f"longest wait for the view's lock meanwhile {longest * 1000:.1f} ms (a probe taking it every millisecond)")
    tracked_event = event_us(view, ingest, objects)
    print(f"event (MODIFIED bound GPU pod, median): {plain_event:.1f} us without outcomes, {tracked_event:.1f} us "
          "with them")
    idle = IdleGpus(tracker)
    scrapes, idles = [], []
    for _ in range(20):
        started = time.perf_counter()
        tracker.families()
        scrapes.append(time.perf_counter() - started)
        started = time.perf_counter()
        figures = idle.families()
        idles.append(time.perf_counter() - started)
    units = {s.labels["reason"]: s.value for s in figures[0].samples if s.value}
    print(f"scrape: outcome families {statistics.median(scrapes) * 1000:.2f} ms, idle-GPU gauges "
          f"{statistics.median(idles) * 1000:.2f} ms (median of 20; idle units by reason: {units})")
    clock = [time.time()]
    counter = LocalCounter(tracker, lambda: clock[0])
    counter.step()  # counting starts
    turns = []
    for _ in range(20):
        clock[0] += 10
        started = time.perf_counter()
        counter.step()
        turns.append(time.perf_counter() - started)
    print(f"turn (limit, due, settled): {statistics.median(turns) * 1000:.2f} ms median of 20")
    return 0


if __name__ == "__main__":
    sys.exit(main())
