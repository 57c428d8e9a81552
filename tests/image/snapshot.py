"""A big cluster snapshot for the image tests and benchmarks/image_bench.py."""

from __future__ import annotations

from pathlib import Path

import orjson

from gpu_placement.samples.cluster import BASES, demo_objects, make_node, make_pod, validator_pod

NODES = 5000


def write_big_snapshot(path: Path, nodes: int = NODES) -> list[str]:
    """A cluster as `kubectl get nodes,pods,namespaces -A -o json` prints it: the demo cluster plus
    `nodes` GPU nodes of every published label set, each with its validator pod, a few of them not
    Ready, a few not validated, and GPU jobs running on a third of them. Returns every node name."""
    objects = demo_objects()
    bases = sorted(BASES)
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        base = bases[i % len(bases)]
        objects.append(make_node(name, base, ready=i % 97 != 5))
        objects.append(validator_pod(name, ready=i % 89 != 3))
        if i % 3 == 0 and base in ("h100", "h100x8"):
            objects.append(make_pod("team-a", f"job-{i}", gpus={"nvidia.com/gpu": 1}, node=name))
    path.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
                                   "items": objects}))
    return [o["metadata"]["name"] for o in objects if o.get("kind") == "Node"]
