"""`gpu-placement namespaces`: each namespace as gpu-placement treats it: opted in or not, its GPU policy,
its quota used against its limit and whether that quota is enforced at all, and what is wrong with it.

The problems are the sentences the webhook would warn or deny with (gpu_placement/facts/policy.py), plus the ones
nobody sees at admission: a namespace that is not opted in never reaches the webhook, so its annotations
(a quota included) do nothing, and a label `gpu-placement.io/enabled=True` opts nothing in.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import orjson

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.decide.enforcement import quota_enforced, selection_state
from gpu_placement.facts.namespaces import NamespaceRecord
from gpu_placement.report.tables import table

__all__ = ["PROBLEMS", "namespace_record", "policy_problems", "run_namespaces"]

PROBLEMS = 1  # the exit status when a namespace listed has a problem
HEADER = ["NAMESPACE", "SELECTION", "POLICY", "QUOTA used/limit", "ENFORCED", "PROBLEMS"]


def run_namespaces(args: argparse.Namespace, cluster: Callable[..., tuple[Any, Any, list[dict[str, Any]]]]) -> int:
    core, access, _ = cluster(args)
    print(f"configuration: {core.config_source}", file=sys.stderr)
    for line in getattr(access, "unseen", ()) or ():
        print(f"could not see: {line}", file=sys.stderr)
    with core.view.lock:
        records = sorted(core.view.namespaces.values(), key=lambda r: r.name)
        usage = {name: dict(used) for name, used in core.view.namespace_usage.items()}
    rows = [namespace_record(r, core.config, usage.get(r.name, {})) for r in records
            if args.show_all or r.annotations or r.labels]
    # As survey exits 1 on findings: a CI gate fails on a namespace whose settings are wrong.
    status = PROBLEMS if any(r["problems"] for r in rows) else 0
    if args.output == "json":
        print(orjson.dumps({"configuration": core.config_source, "namespaces": rows},
                           option=orjson.OPT_INDENT_2).decode())
        return status
    if not rows:
        print("no namespace has gpu-placement.io/* annotations or labels (-A lists every namespace)", file=sys.stderr)
        return 0
    print(table(HEADER, [[r["namespace"], r["selection"], r["policy"] or "-", _quota(r), _enforced(r),
                          " | ".join(r["problems"]) or "-"] for r in rows]))
    return status


def namespace_record(record: NamespaceRecord, config: Config, used: dict[str, int]) -> dict[str, Any]:
    from gpu_placement.facts.policy import parse_policy

    policy = parse_policy(record, record.name, config)
    enforced, why = quota_enforced(record, config)
    selection = selection_state(record.name, record.labels, config)
    problems = [*policy.errors.values(), *policy.warnings]
    if selection not in ("opted-in", "exempt") and policy.annotated:
        problems.append(f"namespace {record.name} has gpu-placement.io/* annotations but {why}: the webhook never "
                        "sees its pods, so they change nothing")
    parts = [f"sharing {policy.sharing.text}"] if n.ANN_SHARING in record.annotations else []
    parts += [f"pools {','.join(policy.pools)}"] if policy.pools else []
    parts += [f"gpu-memory {policy.gpu_memory}"] if policy.gpu_memory else []
    parts += ["canary"] if record.annotations.get(n.ANN_CANARY) == "true" else []
    parts += [f"allocation {policy.allocation}"] if policy.allocation else []
    quota = dict(policy.quota or {})
    access = "quota" if quota else ("allowed (no quota)" if config.default_namespace_policy == "allow"
                                    else "no GPU access (no quota, default policy deny)")
    return {"namespace": record.name, "selection": selection, "label": record.labels.get(n.LABEL_ENABLED),
            "policy": "; ".join(parts), "access": access,
            "quota": {res: {"limit": limit, "used": used.get(res, 0)} for res, limit in quota.items()},
            "enforced": enforced and bool(quota), "not_enforced_because": "" if enforced else why,
            "problems": problems}


def _quota(row: dict[str, Any]) -> str:
    if not row["quota"]:
        return row["access"] if row["access"] != "quota" else "-"
    return ", ".join(f"{q['used']}/{q['limit']} {res.removeprefix('nvidia.com/')}" for res, q in row["quota"].items())


def _enforced(row: dict[str, Any]) -> str:
    if not row["quota"]:
        return "-"
    return "yes" if row["enforced"] else f"no: {row['not_enforced_because']}"


def policy_problems(record: NamespaceRecord, config: Config) -> dict[str, list[str]]:
    """The namespace's problems by kind, each a list of sentences; empty when none. The kinds are the
    `problem` label of gpu_placement_namespace_policy_problems (unread_annotation, bad_value, not_opted_in,
    label_value: docs/operations.md says what each counts). Cheap enough for every namespace change (the
    metric and the Namespace Events follow it)."""
    from gpu_placement.facts.annotation_keys import unread_namespace_keys
    from gpu_placement.facts.namespaces import label_problem
    from gpu_placement.facts.policy import parse_policy

    found: dict[str, list[str]] = {}
    unread = unread_namespace_keys(record.annotations, record.name)
    if unread:
        found["unread_annotation"] = unread
    selection = selection_state(record.name, record.labels, config)
    policy = parse_policy(record, record.name, config) if record.annotations else None
    if policy is not None and policy.errors and selection == "opted-in":
        found["bad_value"] = list(policy.errors.values())
    if selection in ("not-opted-in", "opted-out") and ((policy is not None and policy.annotated) or unread):
        _, why = quota_enforced(record, config)
        found["not_opted_in"] = [f"namespace {record.name} has gpu-placement.io/* annotations but is {why}: the "
                                 "webhook never sees its pods, so its GPU policy and quota change nothing"]
    label = label_problem(record.name, record.labels, config)
    if label is not None:
        found["label_value"] = [label]
    return found
