"""`gpu-placement replay` on a small trace (tests/fixtures/replay: 6 nodes, 48 tasks): the ATC'23
simulator's draws, the CLI's text and JSON, and placements that never hold more than a device or a
node has, in both modes."""

from __future__ import annotations

import collections
import csv
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpu_placement.app.cli import main
from gpu_placement.replay.gorand import GoRand
from gpu_placement.replay.trace import arrivals, read_nodes_csv, read_tasks_csv

FIXTURES = Path(__file__).parent / "fixtures" / "replay"
NODES, PODS = FIXTURES / "nodes.csv", FIXTURES / "pods.csv"
CAPACITY = 24_000  # 24 GPUs in nodes.csv


def test_go_math_rand_draw_for_draw() -> None:
    """Printed by Go 1.26 (math/rand, rand.New(rand.NewSource(seed))): Int, Int63, Intn, Shuffle of ten,
    Perm(7), Int63n, in that order."""
    expected = {
        42: (3440579354231278675, 608747136543856411, [4996, 0, 776159, 1], [2, 7, 0, 5, 1, 6, 4, 9, 3, 8],
             [6, 0, 2, 3, 5, 4, 1], 285741900),
        0: (8717895732742165505, 2259404117704393152, [6057, 6, 858363, 1], [2, 8, 0, 3, 4, 6, 9, 7, 5, 1],
            [0, 1, 6, 2, 4, 5, 3], 179206205),
        -7: (747107023976529931, 7084732931963018726, [7130, 6, 1034171, 1], [9, 1, 0, 4, 8, 3, 2, 7, 5, 6],
             [2, 3, 1, 4, 6, 5, 0], 672152622),
        1 << 40: (5470237361722394362, 6322525149314491254, [5977, 3, 423341, 0], [8, 4, 3, 5, 6, 0, 9, 1, 7, 2],
                  [3, 4, 2, 0, 6, 5, 1], 861688657),
    }
    for seed, (first, second, intns, shuffled, perm, big) in expected.items():
        rng = GoRand(seed)
        assert (rng.int(), rng.int63()) == (first, second)
        assert [rng.intn(8152), rng.intn(10), rng.intn(1 << 20), rng.intn(3)] == intns
        items = list(range(10))

        def swap(i: int, j: int, items: list[int] = items) -> None:
            items[i], items[j] = items[j], items[i]

        rng.shuffle(len(items), swap)
        assert items == shuffled
        assert rng.perm(7) == perm
        assert rng.int63n(1_000_000_007) == big


# The order of an independent Go program that follows core.go Simulate (rand.Seed, rand.Int,
# SortClusterPods with --shuffle-pod=true, TunePodsByNodeTotalResource) on tests/fixtures/replay/pods.csv.
TRIMMED_42 = ("39 26 19 31 38 00 11 37 20 14 10 17 36 32 24 33 12 35 44 41 05 45 30 29 22 42 40 23 13 08 46 25 43 34 "
              "16 01 28 03")
INFLATED_7 = ("02 34 35 25 20 10 32 16 07 29 04 46 01 18 12 13 42 33 23 28 37 19 24 38 09 40 21 08 44 03 39 27 22 43 "
              "36 30 05 45 17 26 00 14 15 06 31 41 47 11 21-tuned-0 21-tuned-1 02-tuned-2 42-tuned-3 12-tuned-4 "
              "26-tuned-5 05-tuned-6 18-tuned-7 14-tuned-8 41-tuned-9 32-tuned-10 31-tuned-11 33-tuned-12")


@pytest.mark.parametrize(("ratio", "seed", "expected"), [(1.3, 42, TRIMMED_42), (2.5, 7, INFLATED_7)])
def test_arrivals_are_the_simulators_draws(ratio: float, seed: int, expected: str) -> None:
    tasks = read_tasks_csv(PODS)
    order = arrivals(tasks, CAPACITY, ratio, seed)
    assert [t.name.removeprefix("small-pod-") for t in order] == expected.split()
    asked = sum(t.total_milli for t in order)
    if ratio == 1.3:  # trimmed: tasks drawn out until the total is at or below the target
        assert asked <= ratio * CAPACITY < asked + max(t.total_milli for t in tasks)
    else:  # inflated: copies of tasks drawn from the list sorted by name, appended after the shuffled tasks
        assert order[48].name == "small-pod-21-tuned-0" and asked <= ratio * CAPACITY


def _replay(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["replay", "--nodes", str(NODES), "--pods", str(PODS), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _held(answer: dict[str, Any], strategy: str) -> tuple[dict[tuple[str, int], int], dict[str, int]]:
    """Milli per (node, GPU index) and CPU per node, from the JSON's placements."""
    tasks = {t.name: t for t in read_tasks_csv(PODS)}
    per_device: dict[tuple[str, int], int] = collections.Counter()
    cpu: dict[str, int] = collections.Counter()
    for placed in answer["strategies"][strategy]["placements"]:
        task = tasks[placed["pod"].split("/")[1].split("-tuned-")[0]]
        assert len(placed["devices"]) == task.gpus  # every GPU it asked, on distinct devices
        assert len({d["index"] for d in placed["devices"]}) == task.gpus
        for device in placed["devices"]:
            assert device["milli"] == task.milli
            per_device[(placed["node"], device["index"])] += device["milli"]
        cpu[placed["node"]] += task.cpu_milli
    return per_device, cpu


@pytest.mark.parametrize("mode", ["dra", "device-plugin"])
def test_json_placements_never_hold_more_than_a_device_or_a_node_has(mode: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _replay("--mode", mode, "--scoring", "binpack,fragmentation", "--arrivals", "2.5", "-o", "json",
                           capsys=capsys)
    assert code == 0
    answer = orjson.loads(out)
    assert answer["gpus"] == 24 and set(answer["strategies"]) == {"binpack", "fragmentation"}
    nodes = {n.name: n for n in read_nodes_csv(NODES)}
    order = arrivals(read_tasks_csv(PODS), CAPACITY, 2.5, 42)
    for strategy, result in answer["strategies"].items():
        assert set(result) == {"points", "placements", "failed"}
        per_device, _ = _held(answer, strategy)
        assert all(0 <= index < nodes[node].gpus for node, index in per_device)
        assert max(per_device.values()) <= 1000  # no GPU holds more than all of it
        placed = {p["pod"] for p in result["placements"]}
        gpu_tasks = {f"openb/{t.name}" for t in order if t.gpus} | {f"openb-shared/{t.name}" for t in order if t.gpus}
        assert placed <= gpu_tasks and not placed & set(result["failed"])
        assert len(placed) + len(result["failed"]) == sum(1 for t in order if t.gpus)
        points = result["points"]
        assert [p["arrived_pct"] for p in points] == list(range(len(points)))
        assert all(set(p) == {"arrived_pct", "allocated_pct", "unallocated_gpus"} for p in points)
        final = sum(t.total_milli for t in order if f"openb/{t.name}" in placed or f"openb-shared/{t.name}" in placed)
        assert points[-1]["allocated_pct"] == pytest.approx(final / CAPACITY * 100, abs=0.01)
        assert points[-1]["unallocated_gpus"] == pytest.approx(24 - final / 1000, abs=0.1)


@pytest.mark.parametrize("mode", ["dra", "device-plugin"])
def test_binpack_fills_fewer_nodes_than_spread(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A third of the capacity arrived: binpack's scores put it on fewer nodes than spread's
    (in dra mode the fill counts the devices' consumable `share`, not only memory)."""
    _, out, _ = _replay("--mode", mode, "--scoring", "binpack,spread", "--arrivals", "0.3", "-o", "json", capsys=capsys)
    strategies = orjson.loads(out)["strategies"]
    used = {name: len({p["node"] for p in result["placements"]}) for name, result in strategies.items()}
    assert used["binpack"] < used["spread"], used


def test_cpu_is_never_overcommitted_either(capsys: pytest.CaptureFixture[str]) -> None:
    """The node's CPU (kube-scheduler's NodeResourcesFit) counts CPU-only tasks too: GPU tasks alone stay
    below it with room to spare for those."""
    _, out, _ = _replay("--scoring", "fragmentation", "--arrivals", "2.5", "-o", "json", capsys=capsys)
    _, cpu = _held(orjson.loads(out), "fragmentation")
    nodes = {n.name: n for n in read_nodes_csv(NODES)}
    assert all(used <= nodes[node].cpu_milli for node, used in cpu.items())


def test_text_puts_the_strategies_side_by_side(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _replay("--scoring", "binpack,spread,fragmentation", "--seeds", "2", capsys=capsys)
    assert code == 0 and err == ""  # no progress bar when stderr is not a terminal
    lines = out.splitlines()
    assert "Seeds 42-43: the figures are means over them." in " ".join(lines[:lines.index("")])
    header = lines.index("GPUs allocated as tasks arrive, in % of the cluster's GPUs (arrived %: what the tasks "
                         "so far ask):") + 1
    assert lines[header].split() == ["arrived", "%", "binpack", "spread", "fragmentation"]
    assert [line.split()[0] for line in lines[header + 1:header + 4]] == ["0", "10", "20"]
    assert any(line.startswith("unallocated GPUs at 100 % arrived: binpack ") for line in lines)
    assert any(line.startswith("allocated at ") and "(min-max): binpack " in line for line in lines)
    assert any(line.startswith("tasks that fit nowhere, of 38: binpack ") for line in lines)


def _intro(out: str) -> str:
    """The text's opening sentences, unwrapped."""
    return " ".join(out.split("\n\n")[0].split())


def test_text_says_what_its_mode_and_figures_mean(capsys: pytest.CaptureFixture[str]) -> None:
    """The mode in words (DRA shares are not what NVIDIA's device plugin, or its DRA driver today, offers),
    what arrived and up to what, and why tasks fit nowhere past 100 %."""
    _, out, _ = _replay("--scoring", "binpack", capsys=capsys)
    intro = _intro(out)
    assert intro.startswith("dra mode: a task gets any share of a GPU it asks (DRA devices with consumable capacity, "
                            "KEP-5075). NVIDIA's DRA driver offers no such shares today: for a cluster on the device "
                            "plugin, replay with --mode device-plugin.")
    assert ("24 GPUs on 6 nodes. 38 tasks arrive one at a time and never leave, asking 129 % of the GPUs in all: 38 "
            "of the 48 listed, in the order seed 42 draws (the others left out at random to stay within 130 %)."
            ) in intro
    ending = " ".join(out[out.index("tasks that fit nowhere"):].split())
    assert "past 100 % arrived the tasks ask more than the cluster has, so some fail there by construction" in ending
    _, out, _ = _replay("--scoring", "binpack", "--mode", "device-plugin", "--replicas", "4", "--arrivals", "2.5",
                        capsys=capsys)
    intro = _intro(out)
    assert intro.startswith("device-plugin mode: what NVIDIA's device plugin offers: whole GPUs, or time-sliced "
                            "replicas of 1/4 GPU")
    assert ("65 tasks arrive one at a time and never leave, asking 249 % of the GPUs in all: the 48 listed, in the "
            "order seed 42 draws, then 17 copies of them drawn at random (named NAME-tuned-N) to come near 250 %."
            ) in intro


def test_arrivals_never_pass_the_ratio_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The simulator's padding checks a copy's share of one GPU against the target, so an 8-GPU copy could
    take a run asked for 100 % to 125 % on this 24-GPU cluster; a copy that would pass it is not added."""
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                    + "".join(f"one-{i},4000,8192,1,1000\n" for i in range(6))
                    + "".join(f"eight-{i},32000,65536,8,1000\n" for i in range(2)))
    tasks = read_tasks_csv(pods)
    for seed in range(42, 52):
        assert sum(t.total_milli for t in arrivals(tasks, CAPACITY, 1.0, seed)) <= CAPACITY
    code = main(["replay", "--nodes", str(NODES), "--pods", str(pods), "--arrivals", "1.0", "--scoring", "binpack"])
    out = capsys.readouterr().out
    assert code == 0 and not re.search(r"at 1[0-9][1-9] % arrived", out), out
    assert "asking 92 % of the GPUs in all: the 8 listed, in the order seed 42 draws (a copy drawn at random would " \
        "have passed 100 %)." in _intro(out)


def test_as_is_replays_each_listed_task_once(capsys: pytest.CaptureFixture[str]) -> None:
    """`--arrivals as-is`: the list as it is, shuffled, nothing copied or left out."""
    code, out, _ = _replay("--arrivals", "as-is", "--scoring", "binpack", "-o", "json", capsys=capsys)
    assert code == 0
    result = orjson.loads(out)["strategies"]["binpack"]
    arrived = {p["pod"].split("/")[1] for p in result["placements"]} | {f.split("/")[1] for f in result["failed"]}
    assert arrived == {t.name for t in read_tasks_csv(PODS) if t.gpus}
    _, out, _ = _replay("--arrivals", "as-is", "--scoring", "binpack", capsys=capsys)
    assert "48 tasks arrive one at a time and never leave, asking 185 % of the GPUs in all: each of the 48 listed " \
        "once, in the order seed 42 draws." in _intro(out)


def _pod(name: str, node: str | None = None, *, cpu: str = "4", gpus: dict[str, int] | None = None,
         phase: str = "Running", owner: str | None = None, annotations: dict[str, str] | None = None
         ) -> dict[str, Any]:
    limits = {resource: str(count) for resource, count in (gpus or {}).items()}
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "annotations": annotations or {}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": "x", "uid": "u",
                                    "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {**({"nodeName": node} if node else {}), "containers": [{"name": "main", "resources": {
                "requests": {"cpu": cpu, "memory": "1Gi", **limits}, "limits": limits}}]},
            "status": {"phase": phase}}


def test_a_kubectl_pods_list_arrives_without_daemonsets_static_or_finished_pods(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--pods` takes `kubectl get pods -A -o json`: a DaemonSet's or a static pod stays on its node and
    keeps what it requests there (all but 3 CPUs of snap-a: spread sends every 4-CPU GPU pod to snap-b);
    finished pods and pods asking MIG slices do not arrive; the output says so."""
    from gpu_placement.samples.cluster import make_node

    nodes = tmp_path / "nodes.json"
    nodes.write_bytes(orjson.dumps({"kind": "List", "items": [make_node("snap-a", "h100x8"),
                                                               make_node("snap-b", "h100x8")]}))
    pods = tmp_path / "pods.json"
    pods.write_bytes(orjson.dumps({"kind": "List", "items": [
        _pod("train-0", "snap-b", gpus={"nvidia.com/gpu": 2}),
        _pod("train-1", gpus={"nvidia.com/gpu": 1}, phase="Pending"),
        _pod("share-0", gpus={"nvidia.com/gpu.shared": 1}, phase="Pending"),
        _pod("agent-x", "snap-a", cpu="60", owner="DaemonSet"),
        _pod("etcd-snap-a", "snap-a", cpu="1", annotations={"kubernetes.io/config.mirror": "abc"}),
        _pod("done-0", "snap-a", gpus={"nvidia.com/gpu": 8}, phase="Succeeded"),
        _pod("mig-0", gpus={"nvidia.com/mig-1g.10gb": 1}, phase="Pending"),
    ]}))
    args = ["replay", "--nodes", str(nodes), "--pods", str(pods), "--arrivals", "as-is", "--scoring", "spread"]
    assert main([*args, "-o", "json"]) == 0
    result = orjson.loads(capsys.readouterr().out)["strategies"]["spread"]
    assert not result["failed"]
    assert {p["pod"]: p["node"] for p in result["placements"]} == {
        "openb/team-a.train-0": "snap-b", "openb/team-a.train-1": "snap-b", "openb/team-a.share-0": "snap-b"}
    assert main(args) == 0
    intro = _intro(capsys.readouterr().out)
    assert "16 GPUs on 2 nodes. 3 tasks arrive one at a time" in intro
    assert ("Pods that do not arrive: 2 DaemonSet or static: kept on their node, 1 asking MIG slices or "
            "ResourceClaims (not modelled), 1 finished (Succeeded or Failed).") in intro


def test_several_seeds_in_json_keep_each_seeds_run(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _replay("--scoring", "binpack", "--seeds", "2", "--seed", "7", "-o", "json", capsys=capsys)
    result = orjson.loads(out)["strategies"]["binpack"]
    assert [run["seed"] for run in result["seeds"]] == [7, 8]
    assert result["placements"] == result["seeds"][0]["placements"]


def test_the_same_seed_replays_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    first = _replay("--scoring", "fragmentation", "-o", "json", capsys=capsys)[1]
    assert _replay("--scoring", "fragmentation", "-o", "json", capsys=capsys)[1] == first


@pytest.mark.parametrize(("args", "message"), [
    (["--scoring", "random"], "scoring strategies are binpack, spread, fragmentation"),
    (["--arrivals", "0"], "must be above 0"),
    (["--mode", "mig"], "invalid choice: 'mig'"),
])
def test_bad_usage_exits_2_naming_the_problem(args: list[str], message: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["replay", "--nodes", str(NODES), "--pods", str(PODS), *args])
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_bad_trace_files_exit_2_naming_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "pods.csv"
    rows = list(csv.reader(PODS.open()))
    rows[3][rows[0].index("num_gpu")] = "two"
    with broken.open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    assert main(["replay", "--nodes", str(NODES), "--pods", str(broken)]) == 2
    assert capsys.readouterr().err.strip() == f"gpu-placement replay: {broken}:4: num_gpu 'two' is not a number"
    headless = tmp_path / "nodes.csv"
    headless.write_text("name,cpu\nn1,4000\n")
    assert main(["replay", "--nodes", str(headless), "--pods", str(PODS)]) == 2
    assert "nodes.csv: no column sn, cpu_milli, memory_mib, gpu, model (the header has name, cpu;" in \
        capsys.readouterr().err
    assert main(["replay", "--nodes", str(tmp_path / "none.json"), "--pods", str(PODS)]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_a_kubectl_nodes_snapshot_is_a_cluster_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--nodes` takes `kubectl get nodes -o json`: GPUs from GPU Feature Discovery's labels, CPU and memory
    from allocatable; a node that is not Ready takes nothing."""
    from gpu_placement.samples.cluster import make_node

    ready = make_node("snap-a", "h100x8")
    down = make_node("snap-b", "h100x8", ready=False)
    (tmp_path / "nodes.json").write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "NodeList",
                                                        "items": [ready, down]}))
    assert main(["replay", "--nodes", str(tmp_path / "nodes.json"), "--pods", str(PODS), "-o", "json",
                 "--scoring", "fragmentation"]) == 0
    answer = orjson.loads(capsys.readouterr().out)
    assert answer["gpus"] == 16
    assert {p["node"] for p in answer["strategies"]["fragmentation"]["placements"]} == {"snap-a"}


def test_a_terminal_gets_a_progress_bar() -> None:
    import io

    from gpu_placement.replay.report import ReplayOptions, run_replays

    shown = io.StringIO()
    replays = run_replays(ReplayOptions(str(NODES), str(PODS), ("binpack",)), progress=shown)
    assert replays.gpus == 24 and len(replays.runs["binpack"]) == 1
    drawn = shown.getvalue()
    assert drawn.startswith("\rbinpack seed 42 [") and re.search(r"\] 100% 38/38 tasks \d+ s\n$", drawn)
