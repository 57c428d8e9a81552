"""The openb workload families load and are what their names say, and the paper's reference policies
score as the ATC'23 simulator defines them (hand-made nodes and tasks): docs/replay.md's family tables
rest on both. The long replays themselves are benchmarks/families.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_placement.replay import references
from gpu_placement.replay.families import FAMILIES, load
from gpu_placement.replay.references import (
    best_fit_score,
    fgd_score,
    frag_amount,
    reference_replay,
    simulator_arrivals,
    typical_pods,
)
from gpu_placement.replay.trace import MILLI, NodeRow, Task

DATA = Path(__file__).resolve().parent.parent / "data" / "openb"


def _share(tasks: list[Task], what: str) -> float:
    """The family's knob, measured: % of the GPU milli asked by tasks sharing a GPU, or by multi-GPU
    tasks; % of GPU tasks naming GPU models."""
    gpu = [t for t in tasks if t.gpus]
    if what == "gpushare":
        return 100 * sum(t.total_milli for t in gpu if t.share) / sum(t.total_milli for t in gpu)
    if what == "multigpu":
        return 100 * sum(t.total_milli for t in gpu if t.gpus > 1) / sum(t.total_milli for t in gpu)
    return 100 * sum(bool(t.models) for t in gpu) / len(gpu)


@pytest.mark.parametrize("name", [n for n in FAMILIES if n != "default"])
def test_each_family_loads_and_turns_its_knob(name: str) -> None:
    tasks = load(name, DATA)
    knob, percent = name.rstrip("0123456789"), int(name[len(name.rstrip("0123456789")):])
    default = _share(load("default", DATA), knob)
    assert abs(_share(tasks, knob) - percent) < 1, (name, _share(tasks, knob))
    assert abs(default - percent) > 5  # the default trace's: 28.5 % shares, 7.3 % multi-GPU, no models
    assert len(tasks) >= 8152 and len({t.name for t in tasks}) == len(tasks)


def test_an_unknown_family_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="multigpu50"):
        load("multigpu60", DATA)


# -- the references, by hand ------------------------------------------------------------------
def _task(cpu: int, milli: int, gpus: int = 1, name: str = "t", models: tuple[str, ...] = ()) -> Task:
    return Task(name, cpu, 1024, gpus if milli else 0, milli, models)


def test_typical_pods_are_the_most_frequent_asks_up_to_95_percent() -> None:
    tasks = [*(_task(4000, 500, name=f"a{i}") for i in range(60)),
             *(_task(8000, 1000, 2, name=f"b{i}") for i in range(36)),
             *(_task(1000, 0, name=f"c{i}") for i in range(4))]
    typical = typical_pods(tasks)
    # 60 + 36 = 96 of 100 tasks reach 95 %: the CPU-only kind is left out, the rest renormalised
    assert typical == (((4000, 500, 1, ()), 60 / 96), ((8000, 1000, 2, ()), 36 / 96))


def test_the_fragment_is_what_each_typical_pod_could_not_use() -> None:
    typical = (((4000, 500, 1, ()), 0.5), ((1000, 1000, 2, ()), 0.5))
    # a 500 share fits (on the whole GPU): the 300 left on the other is its fragment; two whole GPUs do not
    # fit: all 1300 free are theirs
    assert frag_amount("V100", 8000, [1000, 300], typical) == 0.5 * 300 + 0.5 * 1300
    # CPU look-ahead: with 2 CPUs left the 4-CPU share cannot come either: everything free is a fragment
    assert frag_amount("V100", 2000, [1000, 300], typical) == 1300
    # a GPU model the pod does not accept: all of it
    assert frag_amount("T4", 8000, [1000, 1000], (((1000, 500, 1, ("V100",)), 1.0),)) == 2000
    # CPU-only typical pods count every free GPU milli (the simulator's XL and XR)
    assert frag_amount("V100", 8000, [1000, 600], (((1000, 0, 0, ()), 1.0),)) == 1600


def test_best_fit_prefers_the_node_the_task_leaves_emptiest() -> None:
    task = _task(32000, 500)
    # 1 - (0.5 x 32 / 128 CPUs + 0.5 x 1.5 / 8 GPUs) = 0.78125
    assert best_fit_score(64000, [1000, 1000], task) == 78
    assert best_fit_score(40000, [1000, 600], task) > best_fit_score(64000, [1000, 1000], task)


def test_fgd_puts_a_share_where_it_fills_a_hole() -> None:
    typical = (((1000, 600, 1, ()), 1.0),)
    # GPUs [1000, 500] and 600 shares arriving: 500 on the 500 GPU leaves no hole (fragment 500 -> 0),
    # sigmoid(0.5) = 0.62 (on the whole GPU it would leave two 500s no 600 share fits: 500 -> 1000)
    assert fgd_score("V100", 8000, [1000, 500], _task(1000, 500), typical) == 62
    # 700 fits only the whole GPU and leaves 300 and 500, no room for a 600 share: 500 -> 800, sigmoid(-0.3)
    assert fgd_score("V100", 8000, [1000, 500], _task(1000, 700), typical) == 42
    assert fgd_score("V100", 8000, [300, 300], _task(1000, 700), typical) == -1


def test_a_reference_replay_places_as_the_simulator_does() -> None:
    rows = [NodeRow("a", 16000, 65536, 2, "V100"), NodeRow("b", 16000, 65536, 2, "V100")]
    tasks = [_task(1000, 500, name="s1"), _task(1000, 500, name="s2"), _task(1000, 1000, 2, name="w")]
    ranks = {"a": 1, "b": 0}  # equal scores go to b
    for policy in references.REFERENCES:
        run = reference_replay(rows, tasks, tasks, policy, ranks)
        # both shares on one GPU of one node, so the 2-GPU task finds the other node whole
        assert run.failed == [], policy
        [first, second, whole] = run.placements
        assert (first.node, first.devices) == (second.node, second.devices) == ("b", ((0, 500),)), policy
        assert (whole.node, whole.devices) == ("a", ((0, MILLI), (1, MILLI))), policy
        assert run.points[-1].allocated_pct == 75.0


def test_simulator_arrivals_rank_every_node_once() -> None:
    rows = [NodeRow(f"n{i}", 16000, 65536, 2, "V100") for i in range(5)]
    order, ranks = simulator_arrivals(rows, [_task(1000, 500, name=f"t{i}") for i in range(4)], 1.0, 42)
    assert sorted(ranks.values()) == list(range(5))
    assert sum(t.total_milli for t in order) <= 10 * MILLI and len(order) >= 4


def test_cpu_only_tasks_placed_as_kube_scheduler_does_go_to_the_emptiest_node() -> None:
    """`cpu_only_kube`: the references with CPU-only tasks where the replay puts them (LeastAllocated), for
    the comparison in the replay's own model; the simulator's Best-fit packs them instead."""
    rows = [NodeRow("busy", 64000, 65536, 2, "V100"), NodeRow("idle", 64000, 65536, 2, "V100")]
    tasks = [_task(48000, 1000, name="gpu"), _task(4000, 0, name="cpu")]
    ranks = {"busy": 0, "idle": 1}
    assert [p.node for p in reference_replay(rows, tasks, tasks, "best-fit", ranks).placements] == ["busy", "busy"]
    kube = reference_replay(rows, tasks, tasks, "best-fit", ranks, cpu_only_kube=True)
    assert [p.node for p in kube.placements] == ["busy", "idle"]
