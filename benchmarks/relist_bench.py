"""What a relist costs the request path: webhook `/mutate` and `/validate` p99 while the view takes a
relist of 5,000 nodes and 150,000 pods, beside the same calls' p99 without one; and the per-event
work the extender's view does under its lock, by how many kinds of pod its verdict cache holds.

    .venv/bin/python benchmarks/relist_bench.py [--nodes 5000] [--pods 150000] [--changed 0.05]
                                               [--seconds 4] [--kinds 300] [--kind-nodes 1000]

Part 1, the webhook as the chart runs it (its own process: the view and the webhook app, no
extender). The view holds the cluster of benchmarks/cache_bench.py; the webhook app listens on
127.0.0.1 with TLS; a client in a child process (its own interpreter, so not this process's GIL) posts
reviews one after another and records each latency with a CLOCK_MONOTONIC stamp. After a quiet
window, a thread plays a relist as `LiveSource._list` feeds it: pages of 500 objects as JSON bytes,
parsed with orjson as they "arrive", into `Ingest.replace` (nodes, then pods), with `--changed` of the
pods modified, 1% deleted and 1% new, and 2% of the nodes relabelled. A probe thread takes the
view's lock every millisecond and records how long it waited: the longest hold the request path can
meet. Latencies are split by when each request started: before the relist, or during it.

Part 2, the extender's view: microseconds to apply one MODIFIED event of a bound GPU pod (the
annotation changes its memory charge) with 0 and with `--kinds` kinds of pod in the verdict cache,
at `--kind-nodes` nodes. The figure with 0 kinds is the floor.

Other engineers' work may share the machine: the script prints the load average with the figures.
Only loopback traffic; every loop and wait is bounded; the client child exits by itself.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GPU = "nvidia.com/gpu"
PAGE = int(os.environ.get("RELIST_PAGE", "500"))
CLIENT_DEADLINE_S = 600


def _cache_bench() -> Any:
    spec = importlib.util.spec_from_file_location("cache_bench", ROOT / "benchmarks" / "cache_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


# -- the client child ------------------------------------------------------------------------------

def client(port: int, ca: str, seconds: float) -> int:
    """Posts a /mutate and a /validate review in turn on one keep-alive connection; prints one line per
    request: verb, start (monotonic ns), latency (ns). Stops after `seconds` or at stdin EOF."""
    import http.client
    import ssl

    from gpu_placement.samples.cluster import make_pod

    pod = make_pod("team-01", "bench", gpus={GPU: 1}, image="nvcr.io/nvidia/pytorch:24.05-py3")
    del pod["status"]

    def review(obj: dict[str, Any]) -> bytes:
        return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "bench", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": "team-01",
            "operation": "CREATE", "object": obj, "dryRun": True}})

    conn = http.client.HTTPSConnection("localhost", port, context=ssl.create_default_context(cafile=ca), timeout=30)

    def post(path: str, body: bytes) -> dict[str, Any]:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            raise SystemExit(f"{path}: HTTP {response.status}: {data[:200]!r}")
        return dict(orjson.loads(data)["response"])

    import base64

    from gpu_placement.web.patching import apply_patch

    answer = post("/mutate", review(pod))
    shaped = apply_patch(pod, orjson.loads(base64.b64decode(answer["patch"])))
    bodies = [("mutate", "/mutate?timeout=10s", review(pod)), ("validate", "/validate?timeout=10s", review(shaped))]
    if not post("/validate", bodies[1][2])["allowed"]:
        raise SystemExit("the shaped pod is not allowed: the benchmark's cluster is not what it expects")
    print("ready", flush=True)
    import select

    deadline = time.monotonic() + min(seconds, CLIENT_DEADLINE_S)
    index = 0
    measured: list[tuple[str, int, int]] = []  # kept here: printing as we go would fill the pipe and stall us
    while time.monotonic() < deadline:
        if index % 16 == 0 and select.select([sys.stdin], [], [], 0)[0] and not sys.stdin.readline():
            break  # the parent closed our stdin: done
        verb, path, body = bodies[index % 2]
        index += 1
        start = time.monotonic_ns()
        post(path, body)
        measured.append((verb, start, time.monotonic_ns() - start))
    print("\n".join(f"{verb} {start} {took}" for verb, start, took in measured), flush=True)
    return 0


# -- part 1: the webhook during a relist -------------------------------------------------------------

def relist_objects(objects: list[dict[str, Any]], changed: float) -> tuple[list[bytes], list[bytes], int]:
    """(node pages, pod pages, records that differ): what a relist after a long outage would list."""
    nodes = [obj for obj in objects if obj["kind"] == "Node"]
    pods = [obj for obj in objects if obj["kind"] == "Pod"]
    differ, version = 0, 10**9  # versions written while the watch was away
    for index, node in enumerate(nodes):
        if index % 50 == 0:  # a driver upgrade finished meanwhile
            node["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-state"] = "upgrade-done"
            node["metadata"]["resourceVersion"] = str(version := version + 1)
            differ += 1
    step = max(1, round(1 / changed)) if changed else 0
    fresh = []
    for index, pod in enumerate(pods):
        if index % 100 == 1:
            differ += 1
            continue  # deleted meanwhile
        if step and index % step == 0 and pod["spec"].get("nodeName"):
            pod = {**pod, "metadata": {**pod["metadata"], "resourceVersion": str(version := version + 1)},
                   "status": {**pod["status"], "phase": "Succeeded"}}
            differ += 1
        fresh.append(pod)
    from gpu_placement.samples.cluster import make_pod

    for index in range(len(pods) // 100):
        pod = make_pod(f"team-{index % 50:02d}", f"new-{index}", gpus={GPU: 1} if index % 6 == 0 else None)
        pod["metadata"]["resourceVersion"] = str(version := version + 1)
        fresh.append(pod)
        differ += 1
    return _pages(nodes), _pages(fresh), differ


def _pages(items: list[dict[str, Any]]) -> list[bytes]:
    return [orjson.dumps({"items": items[i:i + PAGE]}) for i in range(0, len(items), PAGE)]


def _parsed(pages: list[bytes]) -> Iterator[dict[str, Any]]:
    for body in pages:
        yield from orjson.loads(body)["items"]


def part1(args: argparse.Namespace, bench: Any) -> None:
    from gpu_placement.base.config import Config
    from gpu_placement.observe.logs import setup_logging
    from gpu_placement.view.cluster import ClusterView
    from gpu_placement.view.ingest import KINDS, Ingest
    from gpu_placement.web.certs import write_bundle
    from gpu_placement.web.serving import ServerThread
    from gpu_placement.web.tls import ReloadingTLS, make_server
    from webhook.app import create_app

    setup_logging("warning")
    objects = bench.cluster(args.nodes, args.pods)
    for version, obj in enumerate(objects, 1):  # as the API server lists them: each with its resourceVersion
        obj["metadata"]["resourceVersion"] = str(version)
        if obj["kind"] == "Namespace" and obj["metadata"]["name"].startswith("team-"):
            # A quota on the namespaces: /validate takes the view's lock for the usage.
            obj["metadata"]["annotations"]["gpu-placement.io/quota"] = f"{GPU}=100000"
    config = Config()
    view = ClusterView(config)
    ingest = Ingest(config)
    start = time.monotonic()
    relist = getattr(ingest, "relist", ingest.replace)  # a tree from before Ingest.relist: a before/after
    for kind in KINDS:
        relist(view, kind, [obj for obj in objects if Ingest.kind_of(obj) == kind])
    gc.collect()
    gc.freeze()
    print(f"  view: {len(view.nodes)} nodes, {len(view.pods)} pods, listed in {time.monotonic() - start:.1f} s")
    node_pages, pod_pages, differ = relist_objects(objects, args.changed)
    del objects
    app = create_app(view, config, lambda: (True, ""))
    with tempfile.TemporaryDirectory(prefix="relist-bench-") as tmp:
        bundle = write_bundle(Path(tmp), "gpu-placement-webhook", "gpu-placement", ("localhost", "127.0.0.1"))
        tls = ReloadingTLS(bundle.cert, bundle.key)
        with ServerThread(make_server(app, "127.0.0.1", 0, tls=tls)) as server:
            total = 2 * args.seconds + 60
            child = subprocess.Popen([sys.executable, __file__, "--client", str(server.port), str(bundle.ca_cert),
                                      str(total)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
            assert child.stdout is not None and child.stdin is not None
            if child.stdout.readline().strip() != "ready":
                raise SystemExit("the client did not start")
            waits: list[float] = []
            probing = threading.Event()

            def probe() -> None:  # how long the request path waits for the view's lock, once a millisecond
                while not probing.is_set():
                    t = time.perf_counter()
                    with view.lock:
                        waits.append(time.perf_counter() - t)
                    time.sleep(0.001)

            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            time.sleep(args.seconds)  # the quiet window
            quiet_waits = len(waits)
            began = time.monotonic_ns()
            relist(view, "nodes", _parsed(node_pages))  # as LiveSource._list hands them over
            relist(view, "pods", _parsed(pod_pages))
            ended = time.monotonic_ns()
            time.sleep(0.5)
            probing.set()
            prober.join(5)
            child.stdin.close()  # the client stops and flushes what it measured
            lines = child.stdout.read().split("\n")
            child.wait(30)
    during_waits = waits[quiet_waits:]
    rows: dict[tuple[str, str], list[float]] = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 3:
            continue
        verb, at, took = parts[0], int(parts[1]), int(parts[2]) / 1e6
        phase = "quiet" if at < began else "relist" if at < ended else ""
        if phase:
            rows.setdefault((verb, phase), []).append(took)
    seconds = (ended - began) / 1e9
    print(f"  relist: {len(node_pages)} + {len(pod_pages)} pages of {PAGE}, {differ} records differ "
          f"({args.changed:.0%} of the pods modified, 1% deleted, 1% new, 2% of the nodes), took {seconds:.2f} s")
    print(f"  {'call':<9} {'window':<7} {'requests':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for verb in ("mutate", "validate"):
        for phase in ("quiet", "relist"):
            latencies = rows.get((verb, phase), [])
            p50 = statistics.median(latencies) if latencies else 0.0
            print(f"  {verb:<9} {phase:<7} {len(latencies):>8} {p50:>8.2f} {percentile(latencies, 0.99):>8.2f} "
                  f"{max(latencies, default=0):>8.2f}")
    quiet_max = max(waits[:quiet_waits], default=0)
    print(f"  the view's lock, waited for by a probe every ms: quiet max {quiet_max * 1e3:.2f} ms; during the "
          f"relist p99 {percentile(during_waits, 0.99) * 1e3:.2f} ms, max {max(during_waits, default=0) * 1e3:.2f} ms")


# -- part 2: per-event work of the extender's view by cached kinds -------------------------------------

def part2(args: argparse.Namespace, bench: Any) -> None:
    from gpu_placement.base.config import Config
    from gpu_placement.decide.placement import Placement
    from gpu_placement.samples.cluster import make_pod
    from gpu_placement.view.cluster import ClusterView
    from gpu_placement.view.ingest import KINDS, Ingest

    objects = bench.cluster(args.kind_nodes, args.kind_nodes * 30)
    for kinds in (0, args.kinds):
        config = Config()
        view = ClusterView(config)
        ingest = Ingest(config)
        placement = Placement(view, config)
        for kind in KINDS:
            ingest.replace(view, kind, [obj for obj in objects if Ingest.kind_of(obj) == kind])
        gc.collect()
        gc.freeze()  # as the service does once the view is listed; the kinds come later, in the collector's sight
        names = list(view.nodes)
        for index in range(kinds):  # distinct kinds of pod: another memory ask each
            probe = make_pod("team-01", f"kind-{index}", gpus={GPU: 1},
                             annotations={"gpu-placement.io/gpu-memory": f"{index + 1}Mi"})
            placement.filter(placement.requirements(probe), names)
        cached = len(placement._cache)
        pod = next(p for p in view.pods.values() if p.node and p.gpus)
        events = [make_pod(pod.namespace, pod.name, gpus={GPU: 1}, node=pod.node, uid=pod.uid,
                           annotations={"gpu-placement.io/gpu-memory": f"{10 + i}Gi"}) for i in range(2)]
        rounds = 2000
        start = time.perf_counter()
        for i in range(rounds):
            ingest.event(view, "pods", "MODIFIED", events[i % 2])
        per_event = (time.perf_counter() - start) / rounds * 1e6
        t = time.perf_counter()
        placement.filter(placement.requirements(make_pod("team-01", "kind-0", gpus={GPU: 1},
                                                         annotations={"gpu-placement.io/gpu-memory": "1Mi"})), names)
        catch_up = (time.perf_counter() - t) * 1e3
        gc.unfreeze()
        print(f"  {args.kind_nodes} nodes, {cached:>3} kinds cached: {per_event:8.1f} us per GPU pod event "
              f"(MODIFIED, memory charge changed); the next /filter of one kind after {rounds} of them: "
              f"{catch_up:.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--changed", type=float, default=0.05, help="share of the pods modified in the relist")
    parser.add_argument("--seconds", type=float, default=4.0, help="quiet window before the relist")
    parser.add_argument("--kinds", type=int, default=300)
    parser.add_argument("--kind-nodes", type=int, default=1000)
    parser.add_argument("--part", choices=["1", "2", "both"], default="both")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="the GIL switch interval in seconds (default: what `serve` sets, SWITCH_INTERVAL_S)")
    parser.add_argument("--client", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        return client(int(args.client[0]), args.client[1], float(args.client[2]))
    from gpu_placement.app.assembly import SWITCH_INTERVAL_S

    sys.setswitchinterval(args.switch_interval or SWITCH_INTERVAL_S)
    bench = _cache_bench()
    load = os.getloadavg()
    print(f"relist_bench: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs "
          f"(other engineers' work may be running); GIL switch interval {sys.getswitchinterval() * 1e3:g} ms")
    if args.part in ("1", "both"):
        print(f"1. webhook /mutate and /validate while the view takes a relist of {args.nodes} nodes and "
              f"{args.pods} pods")
        part1(args, bench)
    if args.part in ("2", "both"):
        print("2. the extender's view: work per watch event under the lock, by kinds of pod cached")
        part2(args, bench)
    return 0


if __name__ == "__main__":
    sys.exit(main())
