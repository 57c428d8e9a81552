"""The openb workload families: the task lists the ATC'23 paper (Weng et al., "Beware of Fragmentation")
made from the default trace by its simulator's workload knobs, each varying one thing, all on the same
1,213 nodes. Alibaba publishes them beside the default list (alibaba/clusterdata,
`cluster-trace-gpu-v2023/csv`); data/openb holds them byte for byte (data/openb/README.md).

- `default`: the production trace as submitted (tasks sharing a GPU ask 28.5 % of the GPU milli asked,
  tasks asking several whole GPUs 7.3 %, no GPU-type constraint);
- `gpushareNN`: the GPU tasks resampled so that tasks sharing a GPU ask NN % of the GPU milli (20 to 100);
- `multigpuNN`: tasks asking several GPUs resampled to ask NN % of the GPU milli asked (20 to 50);
- `gpuspecNN`: NN % of the GPU tasks accept only the GPU models they ran on (10 to 33).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_placement.replay.trace import Task, read_tasks_csv

__all__ = ["FAMILIES", "NODES_CSV", "Family", "family", "load"]

NODES_CSV = "openb_node_list_gpu_node.csv"


@dataclass(slots=True, frozen=True)
class Family:
    name: str
    varies: str  # what the family changes against the default trace, in words
    file: str  # the task list's file name in data/openb

    def path(self, folder: str | Path) -> Path:
        return Path(folder) / self.file


def _family(name: str, varies: str) -> Family:
    return Family(name, varies, f"openb_pod_list_{name}.csv")


FAMILIES: dict[str, Family] = {f.name: f for f in (
    _family("default", "the production trace"),
    *(_family(f"multigpu{n}", f"multi-GPU tasks ask {n} % of the GPUs asked") for n in (20, 30, 40, 50)),
    *(_family(f"gpushare{n}", f"GPU-sharing tasks ask {n} % of the GPUs asked") for n in (20, 40, 60, 80, 100)),
    *(_family(f"gpuspec{n}", f"{n} % of the GPU tasks accept only some GPU models") for n in (10, 20, 25, 33)),
)}


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"{name!r}: the openb families are {', '.join(FAMILIES)}") from None


def load(name: str, folder: str | Path) -> list[Task]:
    """The family's task list, read from `folder` (data/openb in a clone)."""
    return read_tasks_csv(family(name).path(folder))
