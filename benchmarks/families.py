"""The replay over the openb workload families (gpu_placement/replay/families.py): each strategy's GPUs
allocated at 130 % arrived, beside the ATC'23 paper's Best-fit and FGD run on the same task sequences
(gpu_placement/replay/references.py), family by family: docs/replay.md's family tables.

    nice -n 10 .venv/bin/python benchmarks/families.py [--families default,multigpu50] \
        [--strategies fragmentation,binpack,best-fit,fgd,best-fit+kube,fgd+kube] [--mode dra|device-plugin] \
        [--seed 42] [--seeds 1] [--tier-size 8] [--out /tmp/families.jsonl] [--label NAME] \
        [--set SPREAD_SHARE=0] [--columns A,B]

Each (family, strategy, seed) run appends one JSON line to `--out` as it ends (so a long table can be
stopped and resumed: runs already in the file are skipped), then the table is printed from the file:
per family and strategy the mean over the seeds found of the allocation at 130 % and at 100 % arrived.
`--table` prints it from the file without running. `--set NAME=VALUE` overrides a constant of
gpu_placement/decide/fragmentation.py for the run (for trying a change; `--label` names the result).
The references run in the paper's simulator model (fractional GPUs), whatever `--mode` says; `best-fit+kube`
and `fgd+kube` with the CPU-only tasks placed by kube-scheduler's default scores, as the replay places them.
CPU-heavy: one strategy on one family is a minute to a few; run it under `nice`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import orjson

from gpu_placement.replay import references
from gpu_placement.replay.cluster import read_node_source
from gpu_placement.replay.families import FAMILIES, NODES_CSV, load
from gpu_placement.replay.simulate import Run, replay
from gpu_placement.replay.trace import MILLI, arrivals, read_nodes_csv

ROOT = Path(__file__).resolve().parent.parent


def _at(run: Run, pct: int) -> float | None:
    return next((p.allocated_pct for p in run.points if p.arrived_pct == pct), None)


def run_one(data: Path, name: str, strategy: str, mode: str, seed: int, tier_size: int = 8) -> dict[str, object]:
    tasks = load(name, data)
    nodes = read_node_source(data / NODES_CSV)
    capacity = sum(n.gpus for n in nodes) * MILLI
    started = time.monotonic()
    policy, _, placing = strategy.partition("+")  # best-fit+kube: CPU-only tasks by kube-scheduler's defaults
    if policy in references.REFERENCES:
        rows = read_nodes_csv(data / NODES_CSV)
        order, ranks = references.simulator_arrivals(rows, tasks, 1.3, seed)
        run = references.reference_replay(rows, tasks, order, policy, ranks, seed, cpu_only_kube=placing == "kube")
    else:
        order = arrivals(tasks, capacity, 1.3, seed)
        run = replay(nodes, tasks, order, mode, strategy, seed, tier_size=tier_size)
    top = max(p.arrived_pct for p in run.points)
    return {"family": name, "strategy": strategy, "mode": "paper" if policy in references.REFERENCES else mode,
            "seed": seed, "at130": _at(run, top), "at100": _at(run, 100), "top": top, "failed": len(run.failed),
            "tier": tier_size, "seconds": round(time.monotonic() - started, 1)}


def table(rows: list[dict[str, object]], families: list[str], labels: list[str]) -> str:
    lines = ["| family | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for name in families:
        cells = []
        for label in labels:
            found = [r for r in rows if r["family"] == name and r["label"] == label]
            if not found:
                cells.append("-")
                continue
            mean = statistics.mean(float(r["at130"]) for r in found)  # type: ignore[arg-type]
            cells.append(f"{mean:.2f}" + (f" ({len(found)} seeds)" if len(found) > 1 else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--strategies", default="fragmentation,binpack,best-fit,fgd")
    parser.add_argument("--mode", default="dra", choices=("dra", "device-plugin"))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--tier-size", type=int, default=8, help="/filter's best tier (the chart's 8; 0: every "
                        "passing node and /prioritize, the replay before the tier)")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--data", default=str(ROOT / "data" / "openb"))
    parser.add_argument("--out", default="/tmp/families.jsonl")
    parser.add_argument("--label", default="", help="name of the fragmentation result (default: the strategy)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--table", action="store_true", help="print the table from --out, run nothing")
    parser.add_argument("--columns", default="", help="results to show, in order (default: every one in --out)")
    args = parser.parse_args()
    families = args.families.split(",")
    strategies = args.strategies.split(",")
    from gpu_placement.decide import fragmentation
    for setting in args.set:
        key, _, value = setting.partition("=")
        setattr(fragmentation, key, type(getattr(fragmentation, key))(value))
    out = Path(args.out)
    rows = [orjson.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    if not args.table:
        for name in families:
            for seed in range(args.seed, args.seed + args.seeds):
                for strategy in strategies:
                    reference = strategy.partition("+")[0] in references.REFERENCES
                    label = args.label if args.label and strategy == "fragmentation" else strategy
                    mode = "paper" if reference else args.mode
                    if any(r["family"] == name and r["label"] == label and r["seed"] == seed and r["mode"] == mode
                           for r in rows):
                        continue
                    row = {"label": label, **run_one(Path(args.data), name, strategy, args.mode, seed, args.tier_size)}
                    rows.append(row)
                    with out.open("ab") as sink:
                        sink.write(orjson.dumps(row) + b"\n")
                    print(orjson.dumps(row).decode(), file=sys.stderr, flush=True)
    labels = args.columns.split(",") if args.columns else list(dict.fromkeys(r["label"] for r in rows))
    for mode in dict.fromkeys(r["mode"] for r in rows if r["mode"] != "paper"):
        shown = [r for r in rows if r["mode"] in (mode, "paper") and r["seed"] in
                 range(args.seed, args.seed + args.seeds)]
        print(f"\nallocated at 130 % arrived, {mode} mode (references: the paper's simulator model)")
        print(table(shown, [f for f in families if any(r["family"] == f and r["mode"] == mode for r in shown)],
                    labels))
    return 0


if __name__ == "__main__":
    sys.exit(main())
