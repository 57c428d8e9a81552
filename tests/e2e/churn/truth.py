"""The harness's truth about each GPU pod launch, and the four lines `make e2e-churn` ends with (pure).

A launch is a GPU pod the scheduler bound that then started (KWOK played it Running, or Succeeded) or
failed to start. The only failures in the run are the node's: KWOK plays one only on a node the harness
broke (tests/e2e/churn/stages.py), so the shape of the status says which fault it was; the harness
checks it against its own record of each node's GPU state at the time (`Ledger.check`). Pods deleted or
never played before the run's end are no launch (the outcome counter drops them too).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.e2e.churn.schedule import CUDA, OK, PLUGIN, TOOLKIT
from tests.e2e.churn.stages import PLUGIN_MESSAGE

__all__ = ["STARTED", "Ledger", "Run", "four_lines", "goals", "played"]

STARTED = "started"
SILENT_STATES = (PLUGIN, CUDA)


def played(status: Mapping[str, Any]) -> str | None:
    """What KWOK played for a GPU pod, from its status: STARTED, one of the failure states (PLUGIN,
    CUDA, TOOLKIT), or None (nothing yet, or a pod stopped on deletion after it ran: already started)."""
    phase = status.get("phase")
    if phase == "Failed" and status.get("reason") == "UnexpectedAdmissionError":
        return PLUGIN if status.get("message") == PLUGIN_MESSAGE else "other"
    for container in status.get("containerStatuses") or ():
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated.get("reason") == "StartError":
            return TOOLKIT
        if terminated.get("exitCode") == 1 and "Failed to initialize NVML" in str(terminated.get("message")):
            return CUDA
        if (container.get("state") or {}).get("running") or terminated.get("exitCode") in (0, 143):
            return STARTED
    return STARTED if phase in ("Running", "Succeeded") else None


@dataclass
class Ledger:
    """Each node's GPU state over time (as the harness set it, seconds from the run's start), and each
    GPU pod's launch as the harness watched it."""

    states: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # node -> [(at, state)], in order
    pods: dict[str, tuple[str, float, str | None]] = field(default_factory=dict)  # uid -> (node, bound at, played)
    last: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # uid -> the last status seen

    def set_state(self, node: str, at: float, state: str) -> None:
        self.states.setdefault(node, []).append((at, state))

    def state_at(self, node: str, at: float) -> str:
        changes = self.states.get(node, [])
        i = bisect.bisect_right([t for t, _ in changes], at)
        return changes[i - 1][1] if i else OK

    def saw(self, uid: str, node: str, at: float, status: Mapping[str, Any]) -> None:
        """A GPU pod bound to `node`, seen at `at` with `status`: the first verdict sticks."""
        self.last[uid] = status
        known = self.pods.get(uid)
        if known is not None and known[2] is not None:
            return
        self.pods[uid] = (node, known[1] if known else at, played(status))

    def check(self, slack: float = 3.0) -> list[str]:
        """Launches the node's state does not explain: a failure of a kind the node was not in within
        `slack` seconds before it was bound (the Stage update and the bind race by that much), or a start
        while the node was broken for `slack` seconds around the bind."""
        wrong = []
        for uid, (node, bound, outcome) in self.pods.items():
            if outcome is None:
                continue
            seen = {self.state_at(node, bound - slack + i * slack / 4) for i in range(9)}
            if outcome == STARTED and OK not in seen:
                wrong.append(f"{uid} started on {node} while it was {sorted(seen)}")
            elif outcome != STARTED and outcome not in seen:
                wrong.append(f"{uid} failed ({outcome}) on {node} while it was {sorted(seen)}")
        return wrong

    def readings(self, classify: Callable[[Mapping[str, Any]], tuple[str, str]]) -> Counter[str]:
        """How `classify` (gpu-placement's reading of a pod status) reads each launch's last status,
        against what was played: "played -> state/cause" for every launch it reads otherwise."""
        out: Counter[str] = Counter()
        for uid, (_, _, outcome) in self.pods.items():
            if outcome is None:
                continue
            state, cause = classify(self.last[uid])
            if (state == STARTED) != (outcome == STARTED):
                out[f"{outcome} -> {state}/{cause}"] += 1
        return out

    def run(self) -> Run:
        outcomes = [outcome for _, _, outcome in self.pods.values() if outcome is not None]
        return Run(started=outcomes.count(STARTED), failed=sum(1 for o in outcomes if o != STARTED),
                   silent_failed=sum(1 for o in outcomes if o in SILENT_STATES),
                   by_state={s: outcomes.count(s) for s in sorted(set(outcomes)) if s != STARTED})


@dataclass(frozen=True)
class Run:
    started: int
    failed: int
    silent_failed: int  # failures on nodes with a silent GPU loss
    by_state: Mapping[str, int] = field(default_factory=dict)

    @property
    def launches(self) -> int:
        return self.started + self.failed

    @property
    def success(self) -> float:
        return 100.0 * self.started / self.launches if self.launches else 0.0


def _count(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def four_lines(nodes: int, pods: int, faults: int, silent: int, minutes: float, stock: Run, placed: Run,
               report_success: float | None) -> list[str]:
    """The lines the run ends with. `pods`: GPU pods of work the Jobs asked for; `report_success`: the
    launch success `gpu-placement report` gave for the gpu-placement run (percent; None: no figure)."""
    def per(run: Run) -> str:
        return _count(run.silent_failed / silent) if silent else "0"

    report = f"{report_success:.1f}" if report_success is not None else "no figure"
    return [
        f"churn: nodes {nodes}, GPU pods {pods}, faults {faults} (silent {silent}), minutes {_count(minutes)}",
        f"churn: launch success  stock {stock.success:.1f} % ({stock.started} of {stock.launches})  "
        f"gpu-placement {placed.success:.1f} % ({placed.started} of {placed.launches})",
        f"churn: failed pods per silent fault  stock {per(stock)}  gpu-placement {per(placed)}",
        f"churn: report says {report} % launch success for the gpu-placement run (truth {placed.success:.1f} %)",
    ]


def goals(placed: Run, silent: int, report_success: float | None) -> list[str]:
    """The issue's goals the gpu-placement run misses (empty: all met)."""
    missed = []
    if placed.success < 99.0:
        missed.append(f"launch success {placed.success:.1f} % < 99.0 %")
    if silent and placed.silent_failed / silent > 2:
        missed.append(f"{placed.silent_failed / silent:.1f} failed pods per silent fault > 2")
    if report_success is None or abs(report_success - placed.success) > 1.0:
        missed.append(f"the report's {report_success} % is not within 1 point of the truth {placed.success:.1f} %")
    return missed
