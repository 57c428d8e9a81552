"""docs/architecture.md names things as the cluster and the code name them: the labels, the
validator pods and DCGM series the code reads, every node reason code, and it is linked from the README."""

from __future__ import annotations

import re
from pathlib import Path

from gpu_placement.base import names as n
from gpu_placement.base.config import Validator
from gpu_placement.decide.rules import CODES, UNKNOWN_NODE
from gpu_placement.view.telemetry import FB_FREE, XID

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text()


def diagrams() -> list[str]:
    return re.findall(r"```mermaid\n(.*?)```", DOC, re.DOTALL)


def test_the_pod_path_and_the_operator_objects_are_drawn() -> None:
    kinds = [block.split("\n", 1)[0].strip() for block in diagrams()]
    assert kinds[0] == "flowchart TB" and "gpu_placement/decide/" in diagrams()[0]  # the folders come first
    assert kinds[1] == "sequenceDiagram" and "flowchart LR" in kinds[2:]
    path = diagrams()[1]
    for step in ("/mutate", "/validate", "ResourceQuota", "kube-scheduler", "/filter", "/prioritize", "/bind"):
        assert step in path, step
    assert path.index("/mutate") < path.index("/validate") < path.index("ResourceQuota admission")


def test_operator_objects_are_named_as_in_the_cluster() -> None:
    operator = diagrams()[-1]
    for label in (n.GPU_PRESENT, n.GPU_PRODUCT, n.GPU_MEMORY, n.GPU_REPLICAS, n.MIG_CONFIG_STATE,
                  n.DRIVER_UPGRADE_STATE, n.COMPUTE_MAJOR, FB_FREE, XID, Validator().selector.text):
        assert label in operator, label
    for code in CODES:
        if code not in (UNKNOWN_NODE, "BadAnnotation", "BadLabel"):  # not about the node / told in the text
            assert code in operator, f"draw {code} in the last diagram of docs/architecture.md: what feeds it"


def test_linked_from_the_readme() -> None:
    assert "(docs/architecture.md)" in (ROOT / "README.md").read_text()
