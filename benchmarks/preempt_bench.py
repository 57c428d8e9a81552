"""`/preempt` decision cost: kube-scheduler's candidates in, the extender's answer out, in process.

A cluster of time-sliced T4 nodes (8 shares of 15,360 MiB), every share taken by eight pods of
three priorities, as in tests/test_preempt.py: on each node kube-scheduler's unit-counting dry run
proposes the lowest-priority pod (2 GiB), which does not free the 4 GiB the pending pod asks, so the
extender adds one more victim on every candidate node (the expensive path). kube-scheduler's dry run
stops at `max(10% of the nodes, 100)` candidates by default (DefaultPreemptionArgs
minCandidateNodesPercentage / minCandidateNodesAbsolute), and that many is what is sent here unless
`--candidates` says otherwise; the body is the `NodeNameToMetaVictims` form a nodeCacheCapable
extender receives.

Figures per size: best and p50 of parse + decide + encode, the orjson parse alone, and per candidate
node. Bounded: a fixed number of rounds; stops by itself.

    .venv/bin/python benchmarks/preempt_bench.py [--sizes 1000,5000] [--candidates N] [--rounds 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import orjson

from extender.preempt import encode_result, parse_preemption_args
from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config
from gpu_placement.decide.preemption import preempt
from gpu_placement.facts.pods import pod_priority
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod

SHARED = "nvidia.com/gpu.shared"


def cluster(size: int) -> list[dict[str, object]]:
    objects: list[dict[str, object]] = [namespace("inference", {"gpu-placement.io/sharing": "shared"}),
                                        namespace("gpu-operator")]
    for i in range(size):
        node = f"t4-{i}"
        load = [(f"low-{i}", 2048, 5), (f"big-{i}", 6144, 10), *[(f"small-{i}-{j}", 1024, 20) for j in range(6)]]
        objects += [make_node(node, "t4-timeslicing", labels={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
                              shared_resource=SHARED), validator_pod(node),
                    *[make_pod("inference", name, gpus={SHARED: 1}, node=node, priority=priority,
                               annotations={"gpu-placement.io/gpu-memory": f"{mib}Mi"})
                      for name, mib, priority in load]]
    return objects


def run(size: int, candidates: int, rounds: int) -> None:
    core = core_from_objects(Config(), cluster(size))
    pod = make_pod("inference", "chat-hi", gpus={SHARED: 1}, image="registry.example.com/chat:1",
                   annotations={"gpu-placement.io/gpu-memory": "4Gi"})
    pod["spec"]["priority"] = 1000
    body = orjson.dumps({"Pod": pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": {
        f"t4-{i}": {"Pods": [{"UID": f"uid-inference-low-{i}"}], "NumPDBViolations": 0}
        for i in range(min(candidates or max(size // 10, 100), size))}})
    core.placement.filter(core.placement.requirements(pod), list(core.view.nodes))  # /filter came first
    total, parse = [], []
    answer = b""
    for _ in range(rounds):
        start = time.perf_counter()
        args = orjson.loads(body)
        parse.append(time.perf_counter() - start)
        sent, proposals = parse_preemption_args(args)
        answer = encode_result(preempt(core.placement, core.placement.requirements(sent),
                                       pod_priority(sent["spec"]), proposals))
        total.append(time.perf_counter() - start)
    kept = orjson.loads(answer)["NodeNameToMetaVictims"]
    assert len(kept) == len(proposals) and all(len(v["Pods"]) == 2 for v in kept.values()), "unexpected answer"
    per_node = min(total) / len(proposals) * 1e6
    print(f"{size:>6} nodes {len(core.view.pods):>7} pods {len(proposals):>4} candidates: "
          f"best {min(total) * 1e3:.2f} ms, p50 {statistics.median(total) * 1e3:.2f} ms "
          f"(parse {statistics.median(parse) * 1e3:.2f} ms), {per_node:.0f} us a candidate node, "
          f"body {len(body)} B")
    core.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--candidates", type=int, default=0, help="default: kube-scheduler's max(10%% of nodes, 100)")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        run(size, args.candidates, args.rounds)


if __name__ == "__main__":
    main()
