"""Faults 3, 5 and 6, in the control plane, during a burst (invariants: faults.py).

3. kube-apiserver SIGKILLed and started again (same etcd, same flags and port);
5. kube-apiserver paused (SIGSTOP) for longer than the service's watch read timeout (a stream silent
   120 s is given up: `client_timeout`, docs/live.md), then resumed: every watch, ours, kube-scheduler's
   and the harness's kubelets', must notice and resume;
6. etcd SIGKILLed and started again on its data.

kube-scheduler's leader election gives up after 10 s without renewing and the process exits; the
harness's kubelet restarts it (tests/e2e/supervisor.py) as a real one would.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from tests.e2e.conftest import E2E
from tests.e2e.faults import make_world, run_scenario, watch_restarts

PAUSE_S = float(os.environ.get("E2E_PAUSE_S", "130"))  # past WatchSettings.client_timeout (120 s)


@pytest.mark.timeout(420)
def test_api_server_restarted_mid_burst(e2e: E2E) -> None:
    world = make_world(e2e, "apiserver")

    def fault(notes: dict[str, Any]) -> None:
        notes["API ready again"] = e2e.plane.restart("kube-apiserver")

    run_scenario(e2e, world, "3 kube-apiserver SIGKILL and restart", fault)


@pytest.mark.timeout(600)
def test_api_server_paused_past_the_watch_read_timeout(e2e: E2E) -> None:
    world = make_world(e2e, "paused")
    apiserver = e2e.plane.procs["kube-apiserver"]

    def fault(notes: dict[str, Any]) -> None:
        before = watch_restarts(e2e)["stalled"]
        apiserver.signal(signal.SIGSTOP)
        try:
            time.sleep(PAUSE_S)
        finally:
            apiserver.signal(signal.SIGCONT)
        t0 = time.monotonic()
        e2e.plane.wait_api_ready()
        notes[f"paused {PAUSE_S:.0f} s; API ready"] = time.monotonic() - t0
        stalled = watch_restarts(e2e)["stalled"] - before
        notes["extender watches given up as stalled"] = f"{stalled:.0f}"
        if not stalled:
            notes["problems"].append("no watch of the extender noticed the silence (cause=stalled)")

    run_scenario(e2e, world, "5 kube-apiserver SIGSTOP", fault)


@pytest.mark.timeout(420)
def test_etcd_restarted_mid_burst(e2e: E2E) -> None:
    world = make_world(e2e, "etcd")

    def fault(notes: dict[str, Any]) -> None:
        notes["API ready again"] = e2e.plane.restart("etcd")

    run_scenario(e2e, world, "6 etcd SIGKILL and restart", fault)
