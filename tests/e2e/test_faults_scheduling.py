"""Faults 2 and 4, in the scheduler pod, during a burst (invariants: faults.py).

2. The extender sidecar is SIGKILLed; kubelet's rules bring it back (restart at once the first
   time, the startup probe on /readyz as the chart renders it) while kube-scheduler keeps running
   and retries what the extender could not answer.
4. Two scheduler pods (the chart's `scheduler.replicas: 2`) with leader election: the leader's pod
   is lost (both containers SIGKILLed) and the standby, whose extender has been watching all along,
   takes the Lease and schedules from a warm view: no ViewNotReady answer after the takeover.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import wait_for
from tests.e2e.conftest import E2E
from tests.e2e.deploy import Pod
from tests.e2e.faults import make_world, run_scenario

# kube-scheduler's leaderelection log lines (lower-cased: klog's text changed between releases).
ATTEMPTING, ACQUIRED = "attempting to acquire leader lease", "successfully acquired lease"


def said(pod: Pod, words: str) -> bool:
    return words in pod.procs["kube-scheduler"].tail(100_000).lower()


def decisions(e2e: E2E, pod: Pod) -> dict[str, float]:
    """The extender's counters that tell a cold view from a warm one."""
    text = httpx.get(f"{e2e.extender_url(pod)}/metrics", timeout=5).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith('gpu_placement_decisions_total{component="extender",reason="ViewNotReady"}'):
            out["ViewNotReady"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("gpu_placement_request_seconds_count{") and 'verb="filter"' in line:
            out["filter"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith('gpu_placement_cache_objects{kind="pods"}'):
            out["pods in view"] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.timeout(420)
def test_extender_sidecar_killed_and_brought_back_by_its_probes(e2e: E2E) -> None:
    world = make_world(e2e, "extender")
    scheduler = e2e.scheduler
    assert scheduler is not None

    def fault(notes: dict[str, Any]) -> None:
        restarts = e2e.supervisor.restarts(scheduler, "extender")
        t0 = time.monotonic()
        scheduler.kill("extender")
        e2e.supervisor.wait_restarted(scheduler, "extender", restarts)
        notes["extender restarted and Ready"] = time.monotonic() - t0
        if not scheduler.procs["kube-scheduler"].alive():
            notes["problems"].append("kube-scheduler exited with its sidecar")
        notes["ViewNotReady answers after the restart"] = decisions(e2e, scheduler).get("ViewNotReady", 0)

    run_scenario(e2e, world, "2 extender sidecar SIGKILL", fault)


@pytest.mark.timeout(420)
def test_scheduler_leader_lost_and_the_warm_standby_takes_over(e2e: E2E) -> None:
    world = make_world(e2e, "ha")
    leader = e2e.scheduler
    assert leader is not None
    standby = e2e.start_scheduler(replica=1)
    e2e.extra_pods.append(standby)
    try:
        wait_for("the standby waiting for the Lease", lambda: said(standby, ATTEMPTING), timeout=60)
        assert said(leader, ACQUIRED), "replica 0 does not lead"
        assert not said(standby, ACQUIRED), "the standby took the Lease from a live leader"
        warm: dict[str, float] = {}

        def fault(notes: dict[str, Any]) -> None:
            warm.update(decisions(e2e, standby))
            notes["standby's view before the takeover"] = f"{warm.get('pods in view', 0):.0f} pods"
            t0 = time.monotonic()
            leader.lose()
            wait_for("the standby leading", lambda: said(standby, ACQUIRED), timeout=90, interval=0.2)
            notes["standby leads"] = time.monotonic() - t0
            e2e.scheduler = standby  # what the later tests talk to

        outcome = run_scenario(e2e, world, "4 scheduler leader lost", fault, tail=10.0)
        after = decisions(e2e, standby)
        assert after.get("ViewNotReady", 0) == warm.get("ViewNotReady", 0), (
            f"the standby answered ViewNotReady after the takeover: {warm} -> {after}\n{outcome.line()}")
        assert after.get("filter", 0) > warm.get("filter", 0), f"the new leader never called its extender: {after}"
    finally:
        e2e.extra_pods.remove(standby)
        if e2e.scheduler is not standby:  # the takeover did not happen: back to one scheduler pod
            standby.stop()
