"""`gpu-placement replay`: run the strategies asked over the seeds asked, print the curves side by side
(text) or the contract's JSON, with a progress bar on a terminal."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import orjson

from gpu_placement.base.config import Config
from gpu_placement.replay.cluster import ReplayNode, read_node_source
from gpu_placement.replay.simulate import Point, Run, replay
from gpu_placement.replay.trace import MILLI, Task, arrivals, read_tasks_csv

__all__ = ["STRATEGIES", "ReplayOptions", "render_json", "render_text", "run_replays"]

STRATEGIES = ("binpack", "spread", "fragmentation")


@dataclass(slots=True, frozen=True)
class ReplayOptions:
    nodes: str
    pods: str
    strategies: tuple[str, ...]
    mode: str = "dra"
    arrivals: float = 1.3
    seed: int = 42
    seeds: int = 1
    weight: int = 5
    replicas: int = 2


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


def run_replays(options: ReplayOptions, config: Config | None = None, progress: IO[str] | None = None
                ) -> tuple[int, dict[str, list[Run]]]:
    """(GPUs in the cluster, runs per strategy, one per seed)."""
    nodes: list[ReplayNode] = read_node_source(options.nodes)
    tasks: list[Task] = read_tasks_csv(options.pods)
    capacity = sum(node.gpus for node in nodes) * MILLI
    runs: dict[str, list[Run]] = {name: [] for name in options.strategies}
    for seed in range(options.seed, options.seed + options.seeds):
        order = arrivals(tasks, capacity, options.arrivals, seed)
        for strategy in options.strategies:
            bar = _bar(progress, f"{strategy} seed {seed}") if progress is not None else None
            runs[strategy].append(replay(nodes, tasks, order, options.mode, strategy, seed, options.weight,
                                         options.replicas, config, bar))
    return capacity // MILLI, runs


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


def render_json(gpus: int, runs: dict[str, list[Run]]) -> bytes:
    """The JSON (docs/replay.md): `{"gpus", "strategies": {NAME: {"points", "placements", "failed"}}}`. With
    several seeds, `points` are the means over them, `placements` and `failed` the first seed's, and
    `seeds` lists each seed's own run."""
    strategies: dict[str, Any] = {}
    for name, runs_ in runs.items():
        entry = _run_json(runs_[0])
        if len(runs_) > 1:
            entry["points"] = _run_json(Run(name, 0, gpus, _mean_points(runs_)))["points"]
            entry["seeds"] = [{"seed": run.seed, **_run_json(run)} for run in runs_]
        strategies[name] = entry
    return orjson.dumps({"gpus": gpus, "strategies": strategies})


def render_text(gpus: int, runs: dict[str, list[Run]], options: ReplayOptions) -> str:
    names = list(runs)
    seeds = [run.seed for run in next(iter(runs.values()))]
    means = {name: _mean_points(runs_) for name, runs_ in runs.items()}
    width = max(14, *(len(n) + 2 for n in names))
    seed_text = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]} (means)"
    lines = [f"{options.mode} mode, {gpus} GPUs, tasks arriving up to {options.arrivals * 100:g} % of their capacity, "
             f"{seed_text}",
             "", "GPUs allocated (% of capacity) as tasks arrive:",
             "arrived %".ljust(10) + "".join(name.rjust(width) for name in names)]
    top = max((p.arrived_pct for points in means.values() for p in points), default=0)
    for pct in range(0, top + 1, 10):
        cells = [_at(means[name], pct) for name in names]
        lines.append(f"{pct:>9} " + "".join((f"{c.allocated_pct:.2f}" if c else "-").rjust(width) for c in cells))
    lines.append("")
    last = top  # where arrivals ended: the asked ratio, or less when the trace holds fewer tasks
    for pct in dict.fromkeys((100, last)):
        cells = [_at(means[name], pct) for name in names]
        lines.append(f"unallocated GPUs at {pct} % arrived: " + ", ".join(
            f"{name} {c.unallocated_gpus:.0f}" if c else f"{name} -" for name, c in zip(names, cells, strict=True)))
    if len(seeds) > 1:
        spread = []
        for name in names:
            values = [p.allocated_pct for run in runs[name] if (p := _at(run.points, last)) is not None]
            if values:
                spread.append(f"{name} {min(values):.2f}-{max(values):.2f}")
        lines.append(f"allocated at {last} % over the seeds (min-max): " + ", ".join(spread))
    failed = ", ".join(f"{name} {statistics.mean(len(r.failed) for r in runs[name]):.0f}" for name in names)
    lines.append(f"tasks that fit nowhere: {failed}")
    return "\n".join(lines)


def stderr_if_terminal() -> IO[str] | None:
    return sys.stderr if sys.stderr.isatty() else None
