"""The live cluster view at scale: time to ready, resident memory, and the cost of one watch event.

    .venv/bin/python benchmarks/cache_bench.py [--nodes 5000] [--pods 150000] [--events 200]

The fake API server (tests/fakeapi.py, TLS on loopback) runs in a child process, so the memory
figures are this process's alone: what the service would hold. Time to ready is set against the
floor measured just before and after it in the same run: the same paged lists through the same
client, each page read and parsed with orjson and nothing kept (goal: within 1.5x; RSS <= 400 MB).
The child builds the cluster from the GPU Operator label sets in `gpu_placement/samples/cluster.py`,
bulk-loads it, and patches nodes when asked; this process runs the real `LiveSource` through the
real `kubernetes` client. Everything is bounded: the child is killed when this process ends, and
every wait has a deadline.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_placement.base.config import Config  # noqa: E402
from gpu_placement.decide.placement import Placement  # noqa: E402
from gpu_placement.kube.api import WatchSettings, load_api_client  # noqa: E402
from gpu_placement.samples.cluster import BASES, make_node, make_pod, namespace, validator_pod  # noqa: E402
from gpu_placement.view.cluster import ClusterView  # noqa: E402
from gpu_placement.view.ingest import Ingest  # noqa: E402
from gpu_placement.view.live import LiveSource  # noqa: E402

READY_FLOOR_RATIO = 1.5  # time to ready against the floor (the same lists parsed, nothing kept)
RSS_TARGET_MB = 400.0
UPGRADE = "nvidia.com/gpu-driver-upgrade-state"
GPU = "nvidia.com/gpu"
NAMESPACES = 50


def rss_mb() -> float:
    """VmRSS of this process, from the kernel (psutil is not a dependency)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


# -- the child: a fake API server holding the cluster ------------------------------------------------

def cluster(nodes: int, pods: int) -> list[dict[str, Any]]:
    bases = list(BASES)
    objects: list[dict[str, Any]] = [namespace(f"team-{i:02d}", {"gpu-placement.io/gpu-memory": "10Gi"} if i % 3 == 0
                                               else {}) for i in range(NAMESPACES)]
    objects.append(namespace("gpu-operator"))
    per_node = max(1, pods // nodes)
    made = 0
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        labels = {"pool": f"pool-{i % 7}"}
        if i % 50 == 0:
            labels[UPGRADE] = "upgrade-required"
        objects.append(make_node(name, bases[i % len(bases)], labels=labels, ready=i % 97 != 0))
        objects.append(validator_pod(name, ready=i % 89 != 0))
        made += 1
        for j in range(per_node - 1):
            gpus = {GPU: 1} if j % 6 == 0 else None
            objects.append(make_pod(f"team-{(i + j) % NAMESPACES:02d}", f"w-{i:05d}-{j:02d}", gpus=gpus, node=name,
                                    labels={"app": f"app-{j}", "pool": labels["pool"]}))
            made += 1
    while made < pods:  # the remainder: pending pods, not bound anywhere
        objects.append(make_pod("team-00", f"pending-{made}", gpus={GPU: 1}))
        made += 1
    return objects


def serve_fake(nodes: int, pods: int) -> int:
    sys.path.insert(0, str(ROOT))
    from tests.fakeapi import FakeApiServer

    start = time.monotonic()
    objects = cluster(nodes, pods)
    built = time.monotonic() - start
    fake = FakeApiServer(bookmark_interval=60.0, history_limit=100_000).start()
    folder = tempfile.TemporaryDirectory(prefix="cache-bench-")
    try:
        fake.load(objects, copy=False)
        del objects
        config = fake.write_kubeconfig(Path(folder.name) / "kubeconfig")
        print(orjson.dumps({"kubeconfig": str(config), "build_s": built, "load_s": time.monotonic() - start - built,
                            "rss_mb": rss_mb()}).decode(), flush=True)
        for line in sys.stdin:  # one command a line; EOF (the parent is gone) ends it
            words = line.split()
            if not words or words[0] == "quit":
                break
            if words[0] == "patch":
                fake.patch_labels("Node", words[1], {UPGRADE: words[2]})
                print(time.monotonic_ns(), flush=True)  # CLOCK_MONOTONIC: the same clock in both processes
    finally:
        fake.stop()
        folder.cleanup()
    return 0


# -- the parent: the service's side ------------------------------------------------------------------

class Child:
    def __init__(self, nodes: int, pods: int, timeout: float) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--serve-fake", "--nodes", str(nodes),
                                      "--pods", str(pods)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, cwd=ROOT)
        self.info = orjson.loads(self.readline(timeout))

    def readline(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
        reader.start()
        reader.join(timeout)
        if not result or not result[0]:
            raise RuntimeError(f"the fake API server process did not answer within {timeout:.0f} s")
        return result[0]

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.send("quit")
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
            self.proc.wait(5)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def measure_events(child: Child, view: ClusterView, nodes: int, events: int) -> list[float]:
    """Milliseconds from the fake committing a MODIFIED node to the view holding the change, one at a time."""
    seen: dict[str, int] = {}
    arrived = threading.Event()

    def on_node(name: str | None) -> None:  # called under view.lock by the watch thread
        if name is not None and name not in seen:
            seen[name] = time.monotonic_ns()
            arrived.set()

    view.subscribe(on_node, lambda _name: None)
    latencies = []
    for i in range(events):
        name = f"gpu-{(i * 37 + 1) % nodes:05d}"
        seen.pop(name, None)
        arrived.clear()
        child.send(f"patch {name} {'validation-required' if i % 2 else 'drain-required'}")
        committed = int(child.readline(10))
        deadline = time.monotonic() + 10
        while name not in seen:
            if not arrived.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"the change to {name} did not reach the view within 10 s")
            arrived.clear()
        latencies.append((seen[name] - committed) / 1e6)
    return latencies


def measure_ingest(view: ClusterView, ingest: Ingest, rounds: int = 2000) -> tuple[float, float, float]:
    """Microseconds per event inside this process (watch thread stopped): parse one line, apply it."""
    node_name = next(iter(view.nodes))
    pod = next(p for p in view.pods.values() if p.node and p.gpus)
    lines = []
    for i in range(2):
        node = make_node(node_name, "h100x8", labels={UPGRADE: "drain-required" if i else "upgrade-done"})
        lines.append(("nodes", orjson.dumps({"type": "MODIFIED", "object": node})))
    for i in range(2):
        obj = make_pod(pod.namespace, pod.name, gpus={GPU: 1}, node=pod.node,
                       annotations={"gpu-placement.io/gpu-memory": f"{10 + i}Gi"})
        lines.append(("pods", orjson.dumps({"type": "MODIFIED", "object": obj})))
    parse = timed(lambda: [orjson.loads(line) for _, line in lines], rounds) / len(lines)
    events = [(kind, orjson.loads(line)["object"]) for kind, line in lines]
    node_cost = timed(lambda: [ingest.event(view, k, "MODIFIED", o) for k, o in events[:2]], rounds) / 2
    pod_cost = timed(lambda: [ingest.event(view, k, "MODIFIED", o) for k, o in events[2:]], rounds) / 2
    return parse, node_cost, pod_cost


def floor_lists(api: Any, page_size: int) -> float:
    """The floor of time to ready: the same paged lists (a thread per kind, as LiveSource runs them)
    through the same client, each page read and parsed with orjson and nothing kept. Seconds until
    the last kind's last page is parsed."""
    from gpu_placement.kube.api import request

    def list_all(path: str) -> None:
        token = None
        while True:
            query: list[tuple[str, str | int | bool]] = [("limit", page_size)]
            if token:
                query.append(("continue", token))
            response = request(api, "GET", path, query=query, timeout=(5.0, 60.0))
            body = response.read()
            response.release_conn()
            page = orjson.loads(body)
            del body
            token = (page.get("metadata") or {}).get("continue") or None
            del page
            if token is None:
                return

    start = time.monotonic()
    threads = [threading.Thread(target=list_all, args=(path,), daemon=True)
               for path in ("/api/v1/namespaces", "/api/v1/nodes", "/api/v1/pods")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - start


def timed(fn: Any, rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        fn()
    return (time.perf_counter() - start) / rounds * 1e6


def run(args: argparse.Namespace) -> int:
    print(f"cache_bench: {args.nodes} nodes, {args.pods} pods, {args.events} watch events "
          f"(fake API server in a child process, TLS on loopback); load average {os.getloadavg()[0]:.1f}", flush=True)
    child = Child(args.nodes, args.pods, timeout=300)
    source: LiveSource | None = None
    try:
        info = child.info
        print(f"  fake API server: built the objects in {info['build_s']:.1f} s, loaded in {info['load_s']:.1f} s "
              f"(its own RSS {info['rss_mb']:.0f} MB, not counted below)")
        config = Config()
        gc.collect()
        rss_before = rss_mb()
        view = ClusterView(config)
        ingest = Ingest(config)
        placement = Placement(view, config)  # subscribed as in the service: its listeners are part of each event
        api = load_api_client(info["kubeconfig"])
        floors = [floor_lists(api, args.page_size)]  # before and after ours: the same machine around it
        gc.collect()
        source = LiveSource(view, ingest, api, WatchSettings(page_size=args.page_size))
        start = time.monotonic()
        source.start()
        deadline = start + args.ready_timeout
        while not source.ready:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not ready within {args.ready_timeout:.0f} s: {source.readiness()[1]}")
            time.sleep(0.01)
        ready_s = time.monotonic() - start
        while gc.get_freeze_count() == 0 and time.monotonic() < deadline:  # the freeze follows ready
            time.sleep(0.01)
        gc.collect()
        rss_after = rss_mb()
        floors.append(floor_lists(api, args.page_size))
        floor = min(floors)
        ratio = ready_s / floor
        print(f"  in the view: {len(view.nodes)} nodes, {len(view.pods)} pods, {len(view.namespaces)} namespaces")
        print(f"  floor: the same lists read and parsed with orjson, nothing kept: "
              f"{' s, '.join(f'{f:.2f}' for f in floors)} s (before and after; the lower counts)")
        print(f"  time to ready (all three kinds listed, page size {args.page_size}): {ready_s:6.2f} s = {ratio:.2f}x "
              f"the floor   goal <= {READY_FLOOR_RATIO:g}x   {verdict(ratio <= READY_FLOOR_RATIO)}")
        print(f"  resident memory before / after: {rss_before:6.0f} MB / {rss_after:.0f} MB   "
              f"goal <= {RSS_TARGET_MB:.0f} MB   {verdict(rss_after <= RSS_TARGET_MB)}")
        print(f"  the view's share (after - before): {rss_after - rss_before:6.0f} MB  "
              f"({(rss_after - rss_before) * 2**20 / max(1, len(view.pods) + len(view.nodes)):.0f} bytes an object)")
        req = placement.requirements(make_pod("team-01", "probe", gpus={GPU: 1}))
        names = list(view.nodes)
        placement.filter(req, names)
        t = time.perf_counter()
        result = placement.filter(req, names)
        print(f"  a filter over all {len(names)} nodes on the live view: {(time.perf_counter() - t) * 1e3:.2f} ms "
              f"({len(result.passed)} pass)")
        latencies = measure_events(child, view, args.nodes, args.events)
        p50, p99 = statistics.median(latencies), percentile(latencies, 0.99)
        print(f"  watch event, fake commit -> visible in the view ({len(latencies)} MODIFIED): "
              f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max(latencies):.2f} ms")
        source.stop()
        source = None
        parse, node_cost, pod_cost = measure_ingest(view, ingest)
        print(f"  in-process cost per event: orjson parse {parse:.1f} us, ingest.event node {node_cost:.1f} us, "
              f"pod {pod_cost:.1f} us")
        api.close()
        return 0 if ratio <= READY_FLOOR_RATIO and rss_after <= RSS_TARGET_MB else 1
    finally:
        if source is not None:
            source.stop()
        child.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--page-size", type=int, default=WatchSettings().page_size)
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    parser.add_argument("--serve-fake", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_fake:
        return serve_fake(args.nodes, args.pods)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
