"""The node writers' CPU per node event at scale: every node judged (as before) against the changed ones (now).

    nice .venv/bin/python benchmarks/node_writers_bench.py [--nodes 5000] [--pods 150000] [--events 400]

The three leader-run node writers (refused nodes, settled drivers, launch fences:
gpu_placement/controllers/node_writer.py) run in the webhook process beside admission, and each pass holds
the view's lock. Before, a pass judged every node, and the refused-node writer passed on every node event;
now a pass judges the nodes marked changed since the last one. This builds the view in-process (the GPU
Operator label sets of gpu_placement/samples/cluster.py, a validator and a driver pod per node, GPU pods up
to --pods), then applies one event at a time through the real ingest (a Node cordoned or uncordoned, or a
validator pod turning Ready or not, on a random node), and after each measures, on this thread's CPU clock,
in the same run and on the same state:

- apply: the event into the view (its listeners included: placement's, the rollout's, the fences', the
  writers' marks), the same before and after;
- after: each writer's `judge()`, what its pass computes now (the nodes marked since its last pass);
- before: each writer's `_due(None)` under the view's lock with the expiry first, which is what its pass
  computed before this change (every node: the code is the same, given every name).

The writers are built without an API server: nothing is written, and judging is all a pass does under the
lock. Before, the refused-node writer woke on every node event; the other two woke when a soak or a fence
changed and every `renew_seconds` (10 s), so for them `before` is the cost of each such pass.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_placement.base.config import parse_config  # noqa: E402
from gpu_placement.controllers.launch_fences import LaunchFenceWriter  # noqa: E402
from gpu_placement.controllers.node_writer import NodeWriter  # noqa: E402
from gpu_placement.controllers.refused_nodes import RefusedNodes  # noqa: E402
from gpu_placement.controllers.settled_drivers import SettledDrivers  # noqa: E402
from gpu_placement.decide.placement import Placement  # noqa: E402
from gpu_placement.samples.cluster import BASES, driver_pod, make_node, make_pod, namespace, validator_pod  # noqa: E402
from gpu_placement.view.cluster import ClusterView  # noqa: E402
from gpu_placement.view.ingest import Ingest  # noqa: E402

GPU = "nvidia.com/gpu"
UPGRADE = "nvidia.com/gpu-driver-upgrade-state"
NAMESPACES = 50
DAY = 86400.0


def cluster(nodes: int, pods: int) -> dict[str, list[dict[str, Any]]]:
    bases = list(BASES)
    now = time.time()
    kinds: dict[str, list[dict[str, Any]]] = {"namespaces": [], "nodes": [], "pods": []}
    kinds["namespaces"] = [namespace(f"team-{i:02d}") for i in range(NAMESPACES)] + [namespace("gpu-operator")]
    per_node = max(2, pods // nodes)
    made = 0
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        labels = {"pool": f"pool-{i % 7}"}
        if i % 50 == 0:
            labels[UPGRADE] = "upgrade-required"
        kinds["nodes"].append(make_node(name, bases[i % len(bases)], labels=labels, ready=i % 97 != 0,
                                        created=now - 90 * DAY))
        kinds["pods"].append(validator_pod(name, ready=i % 89 != 0))
        kinds["pods"].append(driver_pod(name, "550.54.15", now - 40 * DAY))
        made += 2
        for j in range(per_node - 2):
            gpus = {GPU: 1} if j % 6 == 0 else None
            kinds["pods"].append(make_pod(f"team-{(i + j) % NAMESPACES:02d}", f"w-{i:05d}-{j:02d}", gpus=gpus,
                                          node=name, labels={"app": f"app-{j}"}))
            made += 1
    while made < pods:  # the remainder: pending pods, not bound anywhere
        kinds["pods"].append(make_pod("team-00", f"pending-{made}", gpus={GPU: 1}))
        made += 1
    return kinds


def before(writer: NodeWriter) -> None:
    """What the writer's pass computed before: the expiry, then every node judged under the view's lock."""
    writer._expire()
    with writer.view.lock:
        writer._due(None)


def micros(values: list[int]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(values) / 1000:9.1f} {statistics.mean(values) / 1000:9.1f} {p99 / 1000:9.1f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    config = parse_config({"refusedNodeLabel": True})
    start = time.monotonic()
    objects = cluster(args.nodes, args.pods)
    view, ingest = ClusterView(config), Ingest(config)
    for kind in ("namespaces", "nodes", "pods"):
        ingest.replace(view, kind, objects[kind])
    placement = Placement(view, config)
    print(f"view: {len(view.nodes)} nodes, {len(view.pods)} pods, built in {time.monotonic() - start:.1f} s")
    api = cast(Any, None)  # nothing is written: judging is what a pass does under the lock
    writers: dict[str, NodeWriter] = {
        "refused": RefusedNodes(api, view, config, "gpu-placement", "bench"),
        "settled": SettledDrivers(api, placement.rollout, "gpu-placement", "bench"),
        "fences": LaunchFenceWriter(api, placement.fences, "gpu-placement", "bench"),
    }
    for writer in writers.values():
        writer.judge()  # the first pass: every node
    node_objects = {obj["metadata"]["name"]: obj for obj in objects["nodes"]}
    validators = {obj["spec"]["nodeName"]: obj for obj in objects["pods"]
                  if obj["metadata"]["name"].startswith("nvidia-operator-validator-")}
    del objects
    gc.collect()
    gc.freeze()

    rng = random.Random(args.seed)
    names = sorted(node_objects)
    clock = time.thread_time_ns
    results: dict[str, dict[str, list[int]]] = {}
    judged: dict[str, int] = {name: 0 for name in writers}
    for i in range(args.events):
        kind = "node" if i % 2 == 0 else "validator"
        name = rng.choice(names)
        if kind == "node":
            obj = node_objects[name]
            obj["spec"]["unschedulable"] = not obj["spec"].get("unschedulable", False)
            event = ("nodes", obj)
        else:
            obj = validators[name]
            ready = obj["status"]["conditions"][0]["status"] != "True"
            obj = validators[name] = validator_pod(name, ready=ready)
            event = ("pods", obj)
        row = results.setdefault(kind, {})
        t0 = clock()
        ingest.event(view, event[0], "MODIFIED", event[1])
        row.setdefault("apply", []).append(clock() - t0)
        for label, writer in writers.items():
            count = writer.judged
            t0 = clock()
            writer.judge()
            row.setdefault(f"after {label}", []).append(clock() - t0)
            judged[label] += writer.judged - count
            t0 = clock()
            before(writer)
            row.setdefault(f"before {label}", []).append(clock() - t0)
        row.setdefault("after all", []).append(sum(row[f"after {w}"][-1] for w in writers))
        row.setdefault("before all", []).append(sum(row[f"before {w}"][-1] for w in writers))

    print(f"{args.events} events ({args.events // 2} Node, {args.events - args.events // 2} validator pod), "
          f"CPU per event (thread_time), microseconds")
    for kind, row in results.items():
        print(f"\n{kind} event{'':25} {'median':>9} {'mean':>9} {'p99':>9}")
        for label, values in row.items():
            print(f"  {label:30} {micros(values)}")
        ratio = statistics.mean(row["before all"]) / max(1.0, statistics.mean(row["after all"]))
        print(f"  before / after (all writers, mean): {ratio:.0f}x")
    print("\nnodes judged per event by each writer's pass now (mean): "
          + ", ".join(f"{label} {count / args.events:.2f}" for label, count in judged.items())
          + f"; before: {len(view.nodes)} per pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
