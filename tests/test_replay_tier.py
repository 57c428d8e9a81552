"""`gpu-placement replay` models the path the chart runs (issue 44): `/filter` answers the best tier, at most
`--tier-size` nodes, and kube-scheduler takes its one node as it is or lets its own plugins choose within it;
`--tier-size 0` models a configuration that still calls `/prioritize` (the extender's scores at
`--extender-weight` added to the plugins')."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from gpu_placement.app.cli import main

HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
          "scheduled_time\n")


def _trace(tmp_path: Path, nodes: list[tuple[str, int]], pods: int, cpu_milli: int) -> tuple[Path, Path]:
    """Nodes of 8 GPUs with the CPU given; `pods` one-GPU tasks asking `cpu_milli` each, arriving in order."""
    node_file, pod_file = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    node_file.write_text("sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"{name},{cpu},262144,8,G2\n" for name, cpu in nodes))
    pod_file.write_text(HEADER + "".join(f"p{i},{cpu_milli},1024,1,1000,,LS,Running,{i},9999,{i}\n"
                                         for i in range(pods)))
    return node_file, pod_file


def _placed(capsys: pytest.CaptureFixture[str], nodes: Path, pods: Path, strategy: str, *args: str) -> list[str]:
    """The node of each task, in arrival order."""
    assert main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--arrivals", "as-is", "--scoring", strategy,
                 "--mode", "device-plugin", "-o", "json", *args]) == 0
    placements = orjson.loads(capsys.readouterr().out)["strategies"][strategy]["placements"]
    return [p["node"] for p in sorted(placements, key=lambda p: int(p["pod"].rsplit("p", 1)[1]))]


def test_the_extenders_order_is_absolute_across_tiers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Binpack, tasks heavy on CPU: with /prioritize at weight 1, kube-scheduler's CPU spreading outvotes the
    extender's one point and the second task goes to the empty node; with a tier, the fuller node is the only
    best one, so every task packs there, whatever the tier's size."""
    nodes, pods = _trace(tmp_path, [("node-a", 64_000), ("node-b", 64_000)], 4, 16_000)
    prioritized = _placed(capsys, nodes, pods, "binpack", "--tier-size", "0", "--extender-weight", "1")
    assert len(set(prioritized)) == 2
    for size in ("1", "8"):
        placed = _placed(capsys, nodes, pods, "binpack", "--tier-size", size)
        assert len(placed) == 4 and len(set(placed)) == 1


def test_within_the_tier_kube_schedulers_plugins_choose_unless_it_is_one_node(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Spread, two empty nodes tie for the first task; the big node leaves more CPU free after it
    (NodeResourcesFit LeastAllocated), so with a tier of two kube-scheduler takes it on every seed. With a
    tier of one, the extender's draw among the tied decides: the small node on some seeds."""
    nodes, pods = _trace(tmp_path, [("big", 64_000), ("small", 16_000)], 1, 8_000)
    seeds = [str(seed) for seed in range(1, 13)]
    assert {_placed(capsys, nodes, pods, "spread", "--tier-size", "2", "--seed", seed)[0] for seed in seeds} == {"big"}
    assert {_placed(capsys, nodes, pods, "spread", "--tier-size", "1", "--seed", seed)[0] for seed in seeds} == \
        {"big", "small"}


def test_the_same_seed_draws_the_same_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = _trace(tmp_path, [(f"n{i}", 64_000) for i in range(6)], 12, 4_000)
    first = _placed(capsys, nodes, pods, "spread", "--tier-size", "1", "--seed", "7")
    assert _placed(capsys, nodes, pods, "spread", "--tier-size", "1", "--seed", "7") == first


def test_the_text_says_which_path_it_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes, pods = _trace(tmp_path, [("node-a", 64_000)], 2, 1_000)
    said = {}
    for size in ("0", "1", "4"):
        assert main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--arrivals", "as-is", "--scoring",
                     "binpack", "--tier-size", size]) == 0
        said[size] = " ".join(capsys.readouterr().out.split())
    assert "kube-scheduler adds /prioritize's scores at weight 5" in said["0"]
    assert "one node drawn among the best; kube-scheduler takes it as it is" in said["1"]
    assert "at most 4 nodes; kube-scheduler's plugins choose within it" in said["4"]
    with pytest.raises(SystemExit) as exited:
        main(["replay", "--nodes", str(nodes), "--pods", str(pods), "--tier-size", "-1"])
    assert exited.value.code == 2
    assert "--tier-size: '-1' is not a whole number, 0 or more" in capsys.readouterr().err
