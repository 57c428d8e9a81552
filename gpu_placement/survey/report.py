"""The survey for people: plain text for a terminal, Markdown for a ticket or a wiki (a table per pool)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import orjson

from gpu_placement.report.tables import table
from gpu_placement.survey.inventory import NO_POOL, NodeSurvey
from gpu_placement.survey.run import Survey

__all__ = ["survey_json", "survey_markdown", "survey_text"]

_GROUP_HEADER = ["POOL", "PRODUCT", "NODES", "GPUS", "DRIVERS", "MAX CUDA", "MIG", "SHARING", "ALLOCATION",
                 "MANAGED BY"]
_NODE_HEADER = ["NODE", "POOL", "PRODUCT", "GPUS", "DRIVER", "CUDA", "MANAGED BY", "STATE", "HAND-SET LABELS"]


def _counted(counts: Mapping[str, int]) -> str:
    """`535.129.03 x2, 550.90.07` (a count only where there is more than one kind)."""
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{value} x{count}" for value, count in counts.items())


def _group_rows(survey: Survey) -> list[list[str]]:
    rows = []
    for group in survey.inventory:
        j = group.json()
        rows.append([group.pool, group.product, str(j["nodes"]), str(j["gpus"]), _counted(j["drivers"]),
                     _counted(j["maxCuda"]), _counted(j["mig"]), _counted(j["sharing"]), _counted(j["allocation"]),
                     _counted(j["management"])])
    return rows


def _node_row(node: NodeSurvey) -> list[str]:
    hand = ("-" if node.writers_known else "unknown") if not node.hand_labels else (
        ", ".join(sorted(node.hand_labels)) if len(node.hand_labels) <= 3 else
        f"{len(node.hand_labels)} by {', '.join(sorted(set(node.hand_labels.values())))}")
    state = node.state + (" (cordoned)" if node.cordoned and node.state != "NodeNotReady" else "")
    return [node.name, node.pool, node.product, str(node.gpus), node.driver or "-", node.max_cuda or "-",
            node.management, state, hand]


def _plural(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


def _headline(survey: Survey) -> str:
    """`21 GPU nodes (45 GPUs) in 2 pools and 14 without a pool, 1 other node; 10 findings`: a node
    without a pool is counted as such, not as a pool of its own."""
    pools = {node.pool for node in survey.nodes} - {NO_POOL}
    without = sum(1 for node in survey.nodes if node.pool == NO_POOL)
    where = (f" in {_plural(len(pools), 'pool')}" + (f" and {without} without a pool" if without else "")
             if pools else ", none in a pool" if survey.nodes else "")
    return (f"{_plural(len(survey.nodes), 'GPU node')} ({_plural(sum(node.gpus for node in survey.nodes), 'GPU')})"
            f"{where}, {_plural(survey.cpu_nodes, 'other node')}; {_plural(len(survey.findings), 'finding')}")


def survey_text(survey: Survey) -> str:
    lines = [f"GPU CLUSTER SURVEY: {_headline(survey)}", ""]
    lines += ["INVENTORY (per pool and GPU product)", table(_GROUP_HEADER, _group_rows(survey)) if survey.inventory
              else "no GPU nodes", ""]
    lines += ["NODES", table(_NODE_HEADER, [_node_row(node) for node in survey.nodes]) if survey.nodes else "none", ""]
    lines.append(f"FINDINGS ({len(survey.findings)}; docs/survey.md says what each code means)")
    for finding in survey.findings:
        lines.append(f"- {finding.code}: {finding.what}")
        if finding.nodes:
            lines.append(f"    nodes: {', '.join(finding.nodes)}")
        if finding.workloads:
            lines.append(f"    workloads: {', '.join(finding.workloads)}")
        lines.append(f"    fix: {finding.fix}")
    if not survey.findings:
        lines.append("  none")
    lines += [f"note: {note}" for note in survey.notes]
    if survey.configuration:
        lines.append(f"Configuration: {survey.configuration}")
    return "\n".join(lines)


def _md(cell: str) -> str:
    return cell.replace("|", "\\|").replace("\n", " ")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_md(str(cell)) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def survey_markdown(survey: Survey) -> str:
    lines = ["# GPU cluster survey", "", _headline(survey) + ".", ""]
    lines += ["## Inventory", "", _md_table(_GROUP_HEADER, _group_rows(survey)), ""]
    pools: dict[str, list[NodeSurvey]] = {}
    for node in survey.nodes:
        pools.setdefault(node.pool, []).append(node)
    for pool, nodes in sorted(pools.items(), key=lambda item: (item[0] == "-", item[0])):
        lines += [f"## Pool {pool}" if pool != "-" else "## Nodes without a pool", "",
                  _md_table(_NODE_HEADER, [_node_row(node) for node in nodes]), ""]
    lines += [f"## Findings ({len(survey.findings)})", ""]
    if survey.findings:
        lines.append(_md_table(["CODE", "NODES", "WORKLOADS", "WHAT", "FIX"],
                               [[f"`{f.code}`", ", ".join(f.nodes) or "-", ", ".join(f.workloads) or "-", f.what, f.fix]
                                for f in survey.findings]))
    else:
        lines.append("None.")
    if survey.notes:
        lines += ["", *(f"- Note: {note}" for note in survey.notes)]
    if survey.configuration:
        lines += ["", f"Configuration: {survey.configuration}"]
    return "\n".join(lines)


def survey_json(survey: Survey) -> str:
    return orjson.dumps(survey.json(), option=orjson.OPT_INDENT_2).decode()
