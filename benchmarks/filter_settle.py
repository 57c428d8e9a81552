"""What a /filter of a pod that fits nowhere costs kube-scheduler, whose scheduling cycle is serial.

The case of the review's finding 6 (repro_filter_settle_wait.py), scaled to a saturated cluster:
time-sliced T4s whose memory is taken while replicas are free, so kube-scheduler's own filters pass
them and the extender answers InsufficientGPUMemory. `--pods` waiting pods are filtered once (their
first attempt), then retried `--rounds` times each, all of them in turn, as kube-scheduler does when
an event moves every pod the extender rejected back to its active queue (here one the view does not
see: the view never changes, the worst case for the wait), rounds `--pause` seconds apart. A control:
the same number of pods every node refuses for DriverTooOld. The real extender app over HTTP on
loopback, in this process.

Figures: per attempt p50 and p99, and the total per round (the scheduler's time the round holds);
what the service's own accounting says it waited (gpu_placement_filter_settle_seconds, absent before
the budget existed).

Runs against the checkout in the current directory (so the same script measures main and a branch):
    .venv/bin/python benchmarks/filter_settle.py [--pods 200] [--rounds 3] [--nodes 4] [--pause 0.1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import httpx
import orjson

sys.path.insert(0, os.getcwd())

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config
from gpu_placement.samples.cluster import make_node, make_pod, validator_pod
from gpu_placement.web.serving import ServerThread, make_server

IMAGE = "registry.example.com/inference/chat:1.4"  # says nothing about CUDA
SHARED = "nvidia.com/gpu.shared"


def cluster(nodes: int) -> tuple[list[dict[str, Any]], list[str]]:
    objects: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}}]
    names = [f"t4-{i}" for i in range(nodes)]
    for name in names:
        objects += [make_node(name, "t4-timeslicing", labels={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
                              shared_resource=SHARED), validator_pod(name),
                    make_pod("ml", f"running-{name}", gpus={SHARED: 1}, node=name, image=IMAGE,
                             annotations={"gpu-placement.io/gpu-memory": "15Gi"})]
    return objects, names


def settle_figures(http: httpx.Client) -> dict[str, float]:
    figures: dict[str, float] = {}
    for line in http.get("/metrics").text.splitlines():
        for name in ("gpu_placement_filter_settle_seconds_count", "gpu_placement_filter_settle_seconds_sum",
                     "gpu_placement_filter_settle_denied_total", "gpu_placement_filter_settle_skipped_total"):
            if line.startswith(name + "{"):
                figures[name] = figures.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
                if name.endswith("_skipped_total"):  # by cause, as well
                    cause = line.split('cause="', 1)[1].split('"', 1)[0]
                    figures[f"skipped:{cause}"] = figures.get(f"skipped:{cause}", 0.0) + float(line.rsplit(" ", 1)[1])
    return figures


def ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--pause", type=float, default=0.1,
                        help="seconds between rounds (each moved by an event of its own; over the 50 ms wait)")
    args = parser.parse_args()
    objects, names = cluster(args.nodes)
    core = core_from_objects(Config(), objects)
    server = ServerThread(make_server(core.extender_app(), "127.0.0.1", 0)).start()
    try:
        with httpx.Client(base_url=server.url(""), timeout=30) as http:
            def body(name: str, **annotations: str) -> bytes:
                pod = make_pod("ml", name, gpus={SHARED: 1}, image=IMAGE,
                               annotations={"gpu-placement.io/gpu-memory": "4Gi", **annotations})
                return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})

            def attempt(content: bytes) -> float:
                start = time.perf_counter()
                answer = http.post("/filter", content=content).json()
                took = time.perf_counter() - start
                assert not answer["NodeNames"], answer
                return took

            waiting = [body(f"waiting-{i}") for i in range(args.pods)]
            attempt(body("warm-up"))
            before = settle_figures(http)
            first = [attempt(content) for content in waiting]
            print(f"{args.pods} waiting pods on {args.nodes} full T4s, first attempts: p50 {ms(first, 0.5):.2f} ms, "
                  f"p99 {ms(first, 0.99):.2f} ms, total {sum(first):.2f} s")
            for number in range(1, args.rounds + 1):
                time.sleep(args.pause)
                retries = [attempt(content) for content in waiting]
                print(f"  retry round {number} (every waiting pod moved by one event): p50 {ms(retries, 0.5):.2f} ms, "
                      f"p99 {ms(retries, 0.99):.2f} ms, total {sum(retries):.2f} s")
            after = settle_figures(http)
            if after:
                waits = after["gpu_placement_filter_settle_seconds_count"] - before.get(
                    "gpu_placement_filter_settle_seconds_count", 0.0)
                seconds = after["gpu_placement_filter_settle_seconds_sum"] - before.get(
                    "gpu_placement_filter_settle_seconds_sum", 0.0)
                denied = after["gpu_placement_filter_settle_denied_total"] - before.get(
                    "gpu_placement_filter_settle_denied_total", 0.0)
                skipped = {key.split(":", 1)[1]: after[key] - before.get(key, 0.0)
                           for key in after if key.startswith("skipped:")}
                print(f"  settle accounting: {waits:.0f} waits, {seconds * 1000:.1f} ms waited, {denied:.0f} denied "
                      "by the budget" + (", not needed: " + ", ".join(f"{count:.0f} {cause}" for cause, count in
                                                                        sorted(skipped.items())) if skipped else ""))
            else:
                print("  settle accounting: none (this checkout has no gpu_placement_filter_settle_* metrics)")
            control = [attempt(body(f"too-new-{i}", **{"gpu-placement.io/cuda": "13.9"})) for i in range(args.pods)]
            print(f"control, {args.pods} pods refused for DriverTooOld: p50 {ms(control, 0.5):.2f} ms, "
                  f"p99 {ms(control, 0.99):.2f} ms, total {sum(control):.2f} s; "
                  f"median of all waiting attempts / control: "
                  f"{statistics.median(first) / statistics.median(control):.2f}x")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
