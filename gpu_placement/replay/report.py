"""`gpu-placement replay`: run the strategies asked over the seeds asked, print the curves side by side
(text) or the contract's JSON, with a progress bar on a terminal."""

from __future__ import annotations

import statistics
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from gpu_placement.base.config import Config
from gpu_placement.replay.cluster import ReplayNode, read_node_source
from gpu_placement.replay.pods import read_pod_source
from gpu_placement.replay.simulate import Point, Run, replay
from gpu_placement.replay.trace import MILLI, arrivals

__all__ = ["STRATEGIES", "ReplayOptions", "Replays", "render_json", "render_text", "run_replays", "stderr_if_terminal"]

STRATEGIES = ("binpack", "spread", "fragmentation")


@dataclass(slots=True, frozen=True)
class ReplayOptions:
    nodes: str
    pods: str
    strategies: tuple[str, ...]
    mode: str = "dra"
    arrivals: float | None = 1.3  # None: each listed task once (`--arrivals as-is`)
    seed: int = 42
    seeds: int = 1
    weight: int = 5
    replicas: int = 2
    tier_size: int = 8  # /filter's best tier (the chart's config.scoring.tierSize); 0: /prioritize at `weight`


@dataclass(slots=True)
class Replays:
    gpus: int
    nodes: int
    listed: int  # tasks in the pod list that may arrive
    runs: dict[str, list[Run]]  # per strategy, one per seed
    left_out: Counter[str] = field(default_factory=Counter)  # pods of a cluster's list that do not arrive, by why


def _bar(out: IO[str], label: str) -> Callable[[int, int], None]:
    """A progress bar redrawn in place, about a hundred times a run."""
    started = time.monotonic()
    shown = [-1]

    def draw(done: int, total: int) -> None:
        step = done * 100 // total
        if step == shown[0] and done != total:
            return
        shown[0] = step
        filled = step * 30 // 100
        elapsed = time.monotonic() - started
        out.write(f"\r{label} [{'#' * filled}{'.' * (30 - filled)}] {step:3d}% {done}/{total} tasks {elapsed:.0f} s")
        if done == total:
            out.write("\n")
        out.flush()

    return draw


def run_replays(options: ReplayOptions, config: Config | None = None, progress: IO[str] | None = None) -> Replays:
    nodes: list[ReplayNode] = read_node_source(options.nodes)
    pods = read_pod_source(options.pods, config or Config(), options.replicas)
    for node in nodes:  # what DaemonSet and static pods hold there stays held (replay/pods.py)
        held = pods.held.get(node.name)
        if held is not None:
            node.cpu_milli = max(0, node.cpu_milli - held.cpu_milli)
            node.memory_mib = max(0, node.memory_mib - held.memory_mib)
            node.pods = max(0, node.pods - held.pods)
    capacity = sum(node.gpus for node in nodes) * MILLI
    runs: dict[str, list[Run]] = {name: [] for name in options.strategies}
    for seed in range(options.seed, options.seed + options.seeds):
        order = arrivals(pods.tasks, capacity, options.arrivals, seed)
        for strategy in options.strategies:
            bar = _bar(progress, f"{strategy} seed {seed}") if progress is not None else None
            runs[strategy].append(replay(nodes, pods.tasks, order, options.mode, strategy, seed, options.weight,
                                         options.replicas, config, bar, options.tier_size))
    return Replays(capacity // MILLI, len(nodes), len(pods.tasks), runs, pods.left_out)


def _mean_points(runs: Sequence[Run]) -> list[Point]:
    by_pct: dict[int, list[Point]] = {}
    for run in runs:
        for point in run.points:
            by_pct.setdefault(point.arrived_pct, []).append(point)
    return [Point(pct, round(statistics.mean(p.allocated_pct for p in points), 2),
                  round(statistics.mean(p.unallocated_gpus for p in points), 1))
            for pct, points in sorted(by_pct.items()) if len(points) == len(runs)]


def _at(points: Sequence[Point], pct: int) -> Point | None:
    return next((p for p in points if p.arrived_pct == pct), None)


def _run_json(run: Run) -> dict[str, Any]:
    return {"points": [{"arrived_pct": p.arrived_pct, "allocated_pct": p.allocated_pct,
                        "unallocated_gpus": p.unallocated_gpus} for p in run.points],
            "placements": [{"pod": p.pod, "node": p.node, "devices": [{"index": i, "milli": m} for i, m in p.devices]}
                           for p in run.placements],
            "failed": run.failed}


def render_json(replays: Replays) -> bytes:
    """The JSON (docs/replay.md): `{"gpus", "strategies": {NAME: {"points", "placements", "failed"}}}`. With
    several seeds, `points` are the means over them, `placements` and `failed` the first seed's, and
    `seeds` lists each seed's own run."""
    strategies: dict[str, Any] = {}
    for name, runs_ in replays.runs.items():
        entry = _run_json(runs_[0])
        if len(runs_) > 1:
            entry["points"] = _run_json(Run(name, 0, replays.gpus, _mean_points(runs_)))["points"]
            entry["seeds"] = [{"seed": run.seed, **_run_json(run)} for run in runs_]
        strategies[name] = entry
    return orjson.dumps({"gpus": replays.gpus, "strategies": strategies})


_MODES = {
    "dra": "dra mode: a task gets any share of a GPU it asks (DRA devices with consumable capacity, KEP-5075). "
           "NVIDIA's DRA driver offers no such shares today: for a cluster on the device plugin, replay with "
           "--mode device-plugin.",
    "device-plugin": "device-plugin mode: what NVIDIA's device plugin offers: whole GPUs, or time-sliced "
                     "replicas of 1/{replicas} GPU on a pool of nodes sized for the tasks' shares; a larger "
                     "share takes a whole GPU.",
}


def _arrivals_text(replays: Replays, options: ReplayOptions, first: Run, top: int) -> str:
    """What arrived, in one sentence: how many, from where, in which order, up to what."""
    listed = first.arrivals - first.copies
    order = f"in the order seed {first.seed} draws"
    asked = f"{options.arrivals * 100:g} %" if options.arrivals is not None else ""
    if options.arrivals is None:
        how = f"each of the {replays.listed} listed once, {order}"
    elif first.copies:
        how = (f"the {replays.listed} listed, {order}, then {first.copies} copies of them drawn at random (named "
               f"NAME-tuned-N) to come near {asked}")
    elif listed < replays.listed:
        how = f"{listed} of the {replays.listed} listed, {order} (the others left out at random to stay within {asked})"
    else:
        how = f"the {replays.listed} listed, {order}" + (
            f" (a copy drawn at random would have passed {asked})" if top < options.arrivals * 100 else "")
    return f"{first.arrivals} tasks arrive one at a time and never leave, asking {top} % of the GPUs in all: {how}."


def _tier_text(options: ReplayOptions) -> str:
    size = options.tier_size
    if not size:
        return (f"/filter answers every passing node; kube-scheduler adds /prioritize's scores at weight "
                f"{options.weight} to its plugins'.")
    if size == 1:
        return "/filter answers the best tier, one node drawn among the best; kube-scheduler takes it as it is."
    return f"/filter answers the best tier, at most {size} nodes; kube-scheduler's plugins choose within it."


def render_text(replays: Replays, options: ReplayOptions) -> str:
    runs = replays.runs
    names = list(runs)
    first = next(iter(runs.values()))[0]
    seeds = [run.seed for run in next(iter(runs.values()))]
    means = {name: _mean_points(runs_) for name, runs_ in runs.items()}
    width = max(14, *(len(n) + 2 for n in names))
    top = max((p.arrived_pct for points in means.values() for p in points), default=0)  # where arrivals ended
    intro = [_MODES[options.mode].format(replicas=options.replicas),
             f"{replays.gpus} GPUs on {replays.nodes} nodes. " + _arrivals_text(replays, options, first, top)]
    intro.append(_tier_text(options))
    if replays.left_out:
        intro.append("Pods that do not arrive: " + ", ".join(f"{count} {why}" for why, count
                                                              in sorted(replays.left_out.items())) + ".")
    if len(seeds) > 1:
        intro.append(f"Seeds {seeds[0]}-{seeds[-1]}: the figures are means over them.")
    lines = [*(line for paragraph in intro for line in textwrap.wrap(paragraph, 110)),
             "", "GPUs allocated as tasks arrive, in % of the cluster's GPUs (arrived %: what the tasks so far ask):",
             "arrived %".ljust(10) + "".join(name.rjust(width) for name in names)]
    for pct in range(0, top + 1, 10):
        cells = [_at(means[name], pct) for name in names]
        lines.append(f"{pct:>9} " + "".join((f"{c.allocated_pct:.2f}" if c else "-").rjust(width) for c in cells))
    if top % 10:  # where arrivals ended, between two rows
        cells = [_at(means[name], top) for name in names]
        lines.append(f"{top:>9} " + "".join((f"{c.allocated_pct:.2f}" if c else "-").rjust(width) for c in cells))
    lines.append("")
    for pct in dict.fromkeys(p for p in (100, top) if p <= top):
        cells = [_at(means[name], pct) for name in names]
        lines.append(f"unallocated GPUs at {pct} % arrived: " + ", ".join(
            f"{name} {c.unallocated_gpus:.0f}" if c else f"{name} -" for name, c in zip(names, cells, strict=True)))
    if len(seeds) > 1:
        spread = []
        for name in names:
            values = [p.allocated_pct for run in runs[name] if (p := _at(run.points, top)) is not None]
            if values:
                spread.append(f"{name} {min(values):.2f}-{max(values):.2f}")
        lines.append(f"allocated at {top} % over the seeds (min-max): " + ", ".join(spread))
    failed = ", ".join(f"{name} {statistics.mean(len(r.failed) for r in runs[name]):.0f}" for name in names)
    lines.append(f"tasks that fit nowhere, of {first.arrivals}: {failed}")
    why = "no node has room for it as it arrives" + (
        "; past 100 % arrived the tasks ask more than the cluster has, so some fail there by construction" if
        top > 100 else "")
    lines.extend(textwrap.wrap(f"(A task fits nowhere if {why}. The fewer GPUs a strategy leaves unallocated, "
                               "the more of the cluster it fills.)", 110))
    return "\n".join(lines)


def stderr_if_terminal() -> IO[str] | None:
    return sys.stderr if sys.stderr.isatty() else None
