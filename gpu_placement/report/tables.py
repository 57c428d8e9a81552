"""Plain-text tables for people: `nodes`, `explain` and `demo`."""

from __future__ import annotations

from collections.abc import Sequence

from gpu_placement.base.cuda import format_version
from gpu_placement.decide.placement import NodeVerdict
from gpu_placement.decide.rules import node_readiness
from gpu_placement.view.cluster import ClusterView

__all__ = ["node_rows", "table", "verdict_rows"]


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last column is left free (it holds the sentences)."""
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths, strict=False)]
        lines.append("  ".join([*cells, str(row[-1])]).rstrip())
    return "\n".join(lines)


def node_rows(view: ClusterView) -> list[list[str]]:
    rows = []
    with view.lock:
        for name in sorted(view.nodes):
            facts = view.nodes[name]
            rejection = node_readiness(facts, view.validator_state(name), view.config)
            resources = sorted(facts.capacity.keys() | facts.allocatable.keys())
            gpus = ", ".join(f"{facts.allocatable.get(res, 0)}/{facts.capacity.get(res, 0)} "
                             f"{res.removeprefix('nvidia.com/')}" for res in resources) or "-"
            total = sum(v or 0 for v in (view.capacity_mib.get(res, {}).get(name) for res in resources))
            free = sum(v or 0 for v in (view.free_mib.get(res, {}).get(name) for res in resources))
            verdict, why = ("ready", "") if rejection is None else (rejection.code, rejection.message.split(": ", 1)[1])
            if rejection is None and facts.problems:
                verdict, why = "BadLabel", "; ".join(sorted(facts.problems.values()))
            rows.append([
                name,
                verdict,
                facts.product or "-",
                gpus,
                format_version(facts.driver) if facts.driver else "-",
                format_version(facts.max_cuda) if facts.max_cuda else "-",
                f"{total}/{free}" if total else "-",
                why,
            ])
    return rows


NODE_HEADER = ["NODE", "VERDICT", "PRODUCT", "GPUS (alloc/cap)", "DRIVER", "MAX CUDA", "MEM MiB total/free", "WHY"]


def verdict_rows(verdicts: Sequence[NodeVerdict]) -> list[list[str]]:
    """Passing nodes first, best score first, then rejections grouped by reason code."""
    ordered = sorted(verdicts, key=lambda v: (not v.passed, -v.score, v.reason.split(":", 1)[0], v.node))
    return [[v.node, "pass" if v.passed else v.reason.split(":", 1)[0], str(v.score) if v.passed else "-",
             v.detail if v.passed else _why(v)] for v in ordered]


def _why(verdict: NodeVerdict) -> str:
    """The reason kube-scheduler sees, then this node's own figures (which the reason never holds)."""
    sentence = verdict.reason.split(": ", 1)[-1]
    return f"{sentence} [{verdict.detail}]" if verdict.detail else sentence


VERDICT_HEADER = ["NODE", "VERDICT", "SCORE", "WHY / FIGURES"]
