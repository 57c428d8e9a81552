"""The pure parts of `make e2e-churn` (tests/e2e/churn): the seeded plan and its timeline, the Stages'
node sets, the failures it plays as gpu-placement classifies them, the truth's accounting and the four
lines it prints."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from gpu_placement.facts.launch import CONTAINER_TOOLKIT, CUDA_INIT, DEVICE_PLUGIN, FAILED, NODE_CAUSES, classify
from tests.e2e.churn.schedule import (
    CUDA,
    DOWN,
    GPU_STATES,
    KERNEL,
    NOT_READY,
    OK,
    PLUGIN,
    SILENT,
    TOOLKIT,
    UPGRADE,
    make_plan,
    timeline,
)
from tests.e2e.churn.stages import CUDA_MESSAGE, GPU_STAGES, PLUGIN_MESSAGE, TOOLKIT_MESSAGE, gpu_pod_stages
from tests.e2e.churn.truth import STARTED, Ledger, Run, four_lines, goals, played


def test_the_plan_is_the_seeds_and_keeps_its_counts() -> None:
    plan = make_plan(45)
    assert plan == make_plan(45)
    assert plan != make_plan(46)
    assert (len(plan.nodes), plan.seconds) == (1000, 480.0)
    residents = [j for j in plan.jobs if j.name.startswith("resident")]
    assert plan.pods - plan.residents == 2000 and plan.residents == len(residents)
    assert 0.6 <= sum(j.gpus for j in residents) / 8000 < 0.61  # the fleet 60 % busy with them
    assert all(j.arrival <= 60 and j.runtime > plan.seconds for j in residents)
    kinds = Counter(f.kind for f in plan.faults)
    assert kinds[KERNEL] == kinds[NOT_READY] == 6 and kinds[UPGRADE] == 16
    assert plan.silent == sum(kinds[k] for k in SILENT) == 6
    assert len({f.node for f in plan.faults}) == len(plan.faults)  # one fault per node: states never overlap
    assert all(0.1 * plan.seconds <= f.start < f.end <= plan.seconds - 15 for f in plan.faults)
    assert {f.wave for f in plan.faults if f.kind == UPGRADE} == {1, 2}
    assert all(0 <= j.arrival <= plan.seconds - 30 and j.gpus in (1, 2, 4, 8) for j in plan.jobs)
    assert len({j.name for j in plan.jobs}) == len(plan.jobs)
    assert [j.arrival for j in plan.jobs] == sorted(j.arrival for j in plan.jobs)


def test_too_short_or_too_small_is_refused() -> None:
    with pytest.raises(ValueError, match="too short"):
        make_plan(minutes=3)
    with pytest.raises(ValueError, match="too few"):
        make_plan(nodes=20)


def test_every_fault_heals_in_its_timeline() -> None:
    plan = make_plan(7)
    state: dict[str, dict[str, str]] = {}
    for action in timeline(plan):
        state.setdefault(action.node, {})[action.op] = action.value
    for node, last in state.items():
        assert last.get("gpu", OK) == OK and last.get("kubelet", "up") == "up", node
        assert last.get("validator", "passing") == "passing" and last.get("cordon", "off") == "off", node
        assert last.get("upgrade", "upgrade-done") == "upgrade-done", node


def test_a_silent_fault_leaves_labels_validator_and_node_alone_until_its_reboot() -> None:
    plan = make_plan(45)
    fault = next(f for f in plan.faults if f.kind in SILENT)
    during = [a for a in timeline(plan) if a.node == fault.node and fault.start <= a.at < fault.end - 20]
    assert [(a.op, a.value) for a in during] == [("gpu", PLUGIN if fault.kind == "silent-plugin" else CUDA)]


def _matches(stage: dict[str, Any], node: str) -> bool:
    [expr] = [e for e in stage["spec"]["selector"]["matchExpressions"] if e["key"] == ".spec.nodeName"]
    return (node in expr["values"]) == (expr["operator"] == "In")


@pytest.mark.parametrize("state", GPU_STATES)
def test_exactly_one_gpu_pod_stage_plays_a_pod_that_waits_on_a_node_none_while_its_kubelet_is_down(state: str) -> None:
    states = {"gpu-0001": state, "gpu-0002": CUDA, "gpu-0003": DOWN, "gpu-0004": OK}
    stages = {s["metadata"]["name"]: s for s in gpu_pod_stages(states)}
    assert tuple(stages) == GPU_STAGES
    played_by = [name for name, stage in stages.items() if _matches(stage, "gpu-0001")]
    expected = {OK: "churn-gpu-pod-start", PLUGIN: "churn-gpu-pod-plugin", CUDA: "churn-gpu-pod-cuda",
                TOOLKIT: "churn-gpu-pod-toolkit"}
    assert played_by == ([expected[state]] if state != DOWN else [])
    assert [n for n, s in stages.items() if _matches(s, "gpu-0999")] == ["churn-gpu-pod-start"]  # never faulty


def test_the_failures_played_are_the_nodes_causes_as_gpu_placement_reads_them() -> None:
    """The statuses the Stages write (tests/e2e/churn/stages.py), with the messages they carry."""
    rejected = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": PLUGIN_MESSAGE,
                "startTime": "2026-12-07T10:00:00Z"}
    cuda = {"phase": "Failed", "startTime": "2026-12-07T10:00:00Z", "containerStatuses": [{
        "name": "train", "ready": False, "state": {"terminated": {
            "exitCode": 1, "reason": "Error", "message": CUDA_MESSAGE, "startedAt": "2026-12-07T10:00:00Z",
            "finishedAt": "2026-12-07T10:00:03Z"}}}]}
    toolkit = {"phase": "Failed", "startTime": "2026-12-07T10:00:00Z", "containerStatuses": [{
        "name": "train", "ready": False, "state": {"terminated": {
            "exitCode": 128, "reason": "StartError", "message": TOOLKIT_MESSAGE, "startedAt": "1970-01-01T00:00:00Z",
            "finishedAt": "2026-12-07T10:00:02Z"}}}]}
    running = {"phase": "Running", "startTime": "2026-12-07T10:00:00Z", "containerStatuses": [{
        "name": "train", "ready": True, "state": {"running": {"startedAt": "2026-12-07T10:00:01Z"}}}]}
    evicted = {"phase": "Failed", "containerStatuses": [{"name": "train", "state": {"terminated": {
        "exitCode": 143, "reason": "Error", "startedAt": "2026-12-07T10:00:01Z",
        "finishedAt": "2026-12-07T10:01:30Z"}}}]}
    assert classify(rejected) == (FAILED, DEVICE_PLUGIN)
    assert classify(cuda) == (FAILED, CUDA_INIT)
    assert classify(toolkit) == (FAILED, CONTAINER_TOOLKIT)
    assert {DEVICE_PLUGIN, CUDA_INIT, CONTAINER_TOOLKIT} <= set(NODE_CAUSES)
    assert classify(running)[0] == classify(evicted)[0] == "started"
    assert [played(s) for s in (rejected, cuda, toolkit, running, evicted, {"phase": "Pending"})] == [
        PLUGIN, CUDA, TOOLKIT, STARTED, STARTED, None]


def test_the_ledger_counts_the_first_verdict_and_checks_it_against_the_nodes_state() -> None:
    ledger = Ledger()
    ledger.set_state("a", 10.0, PLUGIN)
    ledger.set_state("a", 50.0, OK)
    failed = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": PLUGIN_MESSAGE}
    ledger.saw("p1", "a", 20.0, {"phase": "Pending"})  # bound, not played yet
    ledger.saw("p1", "a", 21.0, failed)
    ledger.saw("p1", "a", 22.0, {"phase": "Running"})  # a later status never changes the verdict
    ledger.saw("p2", "a", 60.0, {"phase": "Running"})
    ledger.saw("p3", "b", 5.0, {"phase": "Succeeded"})
    ledger.saw("p4", "b", 6.0, {"phase": "Pending"})  # never played: no launch
    assert ledger.pods["p1"] == ("a", 20.0, PLUGIN)
    assert ledger.check() == []
    assert ledger.run() == Run(started=2, failed=1, silent_failed=1, by_state={PLUGIN: 1})
    ledger.saw("p5", "a", 30.0, {"phase": "Running"})  # started on a node that was broken all around its bind
    ledger.saw("p6", "b", 30.0, failed)  # failed on a node never broken
    assert [line.split()[0] for line in ledger.check()] == ["p5", "p6"]


def test_the_four_lines_and_the_goals() -> None:
    stock = Run(started=1900, failed=350, silent_failed=300, by_state={PLUGIN: 150, CUDA: 150, TOOLKIT: 50})
    placed = Run(started=2090, failed=10, silent_failed=9)
    assert four_lines(1000, 2000, 34, 6, 8.0, stock, placed, 99.52) == [
        "churn: nodes 1000, GPU pods 2000, faults 34 (silent 6), minutes 8",
        "churn: launch success  stock 84.4 % (1900 of 2250)  gpu-placement 99.5 % (2090 of 2100)",
        "churn: failed pods per silent fault  stock 50  gpu-placement 1.5",
        "churn: report says 99.5 % launch success for the gpu-placement run (truth 99.5 %)",
    ]
    assert goals(placed, 6, 99.52) == []
    missed = goals(Run(started=1900, failed=100, silent_failed=90), 6, 97.0)
    assert missed == ["launch success 95.0 % < 99.0 %", "15.0 failed pods per silent fault > 2",
                      "the report's 97.0 % is not within 1 point of the truth 95.0 %"]
    assert "report says no figure %" in four_lines(1, 1, 0, 0, 4.5, stock, placed, None)[3]
