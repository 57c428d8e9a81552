"""CPU per /filter call, in process, on the request shape kube-scheduler v1.37 sends with the chart's defaults.

kube-scheduler's adaptive sample: it walks its node list from where the last cycle stopped and sends the
extender the first N feasible nodes it finds (about 420 of 1,000 nodes, 500 of 5,000), `NodeNames` only
(the chart's extender is nodeCacheCapable), one-GPU pods of one ReplicaSet in a burst; between two calls
the pod the last one chose is bound there (one node's GPUs change per pod). The real app is called
through ASGI in this process (no sockets), the handler's CPU taken with `time.thread_time`.

    .venv/bin/python benchmarks/filter_cpu_bench.py [--nodes 1000] [--calls 400] [--digest] [--profile]

`--digest` prints the SHA-256 of every answer in order (the tier's draw is seeded): run it on two trees
(`PYTHONPATH=tree`) to show that a change answers the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import hashlib
import pstats
import random
import statistics
import sys
import time
from typing import Any

import orjson

from benchmarks.extender_bench import Cluster, _request_pod
from extender.app import create_app
from extender.binding import SnapshotBinder
from gpu_placement.base.config import Config, Scoring
from gpu_placement.samples.cluster import make_pod

SAMPLE = {500: 230, 1000: 420, 5000: 500}


def sample_size(nodes: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with percentageOfNodesToScore unset (adaptive)."""
    if nodes < 100:
        return nodes
    percentage = max(5, 50 - nodes // 125)
    return max(100, nodes * percentage // 100)


class Burst:
    def __init__(self, nodes: int, seed: int = 7) -> None:
        config = Config(scoring=Scoring(strategy="fragmentation", tier_size=8))
        self.cluster = Cluster(nodes, config)
        self.cluster.placement.random = random.Random(seed)
        self.view = self.cluster.view
        self.app = create_app(self.view, self.cluster.placement, SnapshotBinder(self.view), lambda: (True, ""))
        self.rng = random.Random(seed)
        self.start = 0
        self.find = sample_size(nodes)
        self.serial = 0
        # kube-scheduler's own filters drop what is not Ready or cordoned before the extender is asked
        self.schedulable = [n for n in self.cluster.names if self._schedulable(n)]

    def _schedulable(self, name: str) -> bool:
        facts = self.view.nodes[name]
        return bool(getattr(facts, "ready", True)) and not getattr(facts, "unschedulable", False)

    def names(self) -> list[str]:
        """The next cycle's sample: from where the last stopped, in node-list order, a little shuffled
        among kube-scheduler's 16 parallel filter workers."""
        names = self.cluster.names
        n = len(names)
        found: list[str] = []
        processed = 0
        while len(found) < self.find and processed < n:
            name = names[(self.start + processed) % n]
            processed += 1
            if self._schedulable(name):
                found.append(name)
        self.start = (self.start + processed) % n
        for i in range(0, len(found), 16):  # workers finishing out of order within a chunk
            chunk = found[i:i + 16]
            self.rng.shuffle(chunk)
            found[i:i + 16] = chunk
        return found

    def body(self) -> bytes:
        self.serial += 1
        pod = _request_pod(f"train-7f9c-{self.serial}")
        pod["metadata"]["labels"]["pod-template-hash"] = "7f9c"
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-7f9c",
                                               "uid": "rs-uid", "controller": True}]
        return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": self.names()})

    def bind(self, answer: bytes) -> None:
        """kube-scheduler binds the pod to a node of the answer (its own scoring: the first here)."""
        chosen = orjson.loads(answer).get("NodeNames") or []
        if not chosen:
            return
        pod = make_pod("ml", f"train-7f9c-{self.serial}", gpus={"nvidia.com/gpu": 1}, node=chosen[0],
                       uid=f"uid-train-7f9c-{self.serial}")
        pod["metadata"]["namespace"] = "ml"
        self.view.upsert_pod(self.cluster.ingest.pod(pod))


async def call(app: Any, path: str, body: bytes) -> tuple[float, bytes]:
    sent = False
    out: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            out.append(message.get("body", b""))

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "state": {}}
    start = time.thread_time()
    await app(scope, receive, send)
    return time.thread_time() - start, b"".join(out)


async def run(args: argparse.Namespace) -> None:
    burst = Burst(args.nodes)
    await call(burst.app, "/filter", burst.body())  # the kind's cache, cold
    for _ in range(20):
        _, answer = await call(burst.app, "/filter", burst.body())
        burst.bind(answer)
    digest = hashlib.sha256()
    samples: list[float] = []
    profiler = cProfile.Profile() if args.profile else None
    for _ in range(args.calls):
        body = burst.body()
        if profiler:
            profiler.enable()
        cpu, answer = await call(burst.app, "/filter", body)
        if profiler:
            profiler.disable()
        samples.append(cpu)
        digest.update(answer)
        burst.bind(answer)
    ordered = sorted(samples)
    print(f"nodes {args.nodes} names {burst.find} calls {args.calls}: /filter CPU mean "
          f"{statistics.fmean(samples) * 1e3:.3f} ms p50 {ordered[len(ordered) // 2] * 1e3:.3f} "
          f"p99 {ordered[int(len(ordered) * 0.99)] * 1e3:.3f} max {ordered[-1] * 1e3:.3f}"
          + (f" digest {digest.hexdigest()[:16]}" if args.digest else ""), flush=True)
    if profiler:
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--digest", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sort", default="tottime")
    asyncio.run(run(parser.parse_args()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
