"""How much kube-scheduler has to decode from the extender a pod, during a burst, per scoring strategy.

The burst of `benchmarks/scheduler_bench.py` (and `make e2e-scale`), in process: `--nodes` verified
8-GPU H100 nodes, then `--pods` one-GPU pods one after the other, each filtered over every node,
prioritized over the nodes that passed, and bound to a node of the top score (as kube-scheduler
would when its own plugins tie). The real `Placement` answers; nothing is sent over HTTP. Printed per
strategy: the `/filter` answer's passing names and bytes, the `/prioritize` answer's entries and bytes
(mean over the burst, first and last pod). kube-scheduler decodes both with Go's encoding/json, and its
garbage collector collects what that allocates: docs/performance.md, "What the answers' size costs".

    .venv/bin/python benchmarks/answer_sizes.py [--nodes 500] [--pods 300]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpu_placement.base.config import Config
from gpu_placement.decide.placement import Placement
from gpu_placement.samples.cluster import make_node, make_pod, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest

STRATEGIES = ("fragmentation", "binpack", "spread")


def burst(strategy: str, nodes: int, pods: int) -> dict[str, list[int]]:
    base = Config()
    config = dataclasses.replace(base, scoring=dataclasses.replace(base.scoring, strategy=strategy))
    view, ingest = ClusterView(config), Ingest(config)
    placement = Placement(view, config)
    names = [f"bench-{i:04d}" for i in range(nodes)]
    with view.lock:
        for name in names:
            view.upsert_node(ingest.node(make_node(name, "h100x8")))
            view.upsert_pod(ingest.pod(validator_pod(name)))
        view.listed.update(("nodes", "pods", "namespaces"))
    sizes: dict[str, list[int]] = {"filter names": [], "filter bytes": [], "prioritize entries": [],
                                   "prioritize bytes": []}
    for i in range(pods):
        pod = make_pod("bench", f"b-{i:04d}", gpus={"nvidia.com/gpu": 1}, uid=f"uid-{i}")
        req = placement.requirements(pod)
        result = placement.filter(req, names)
        passed = list(result.passed)
        answer = placement.scores_json(req, passed)
        scores = orjson.loads(answer)
        sizes["filter names"].append(len(passed))
        sizes["filter bytes"].append(len(orjson.dumps(passed)))
        sizes["prioritize entries"].append(len(scores))
        sizes["prioritize bytes"].append(len(answer))
        top = max(scores, key=lambda s: s["Score"])["Host"] if scores else passed[0]
        pod["spec"]["nodeName"] = top
        pod["status"]["phase"] = "Running"
        with view.lock:
            view.upsert_pod(ingest.pod(pod))
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=300)
    args = parser.parse_args(argv)
    print(f"a burst of {args.pods} one-GPU pods on {args.nodes} empty 8-GPU nodes; per pod, mean (first, last):")
    for strategy in STRATEGIES:
        sizes = burst(strategy, args.nodes, args.pods)
        figures = ", ".join(f"{what} {statistics.fmean(values):.0f} ({values[0]}, {values[-1]})"
                            for what, values in sizes.items())
        print(f"  {strategy:<13} {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
