"""Fault 1: the webhook replica holding the quota mirror's Lease is SIGKILLed during a burst and
restarted (kubelet's rules: tests/e2e/supervisor.py), with the chart's two replicas behind the
Service. While the Lease is orphaned (until it runs out, 30 s) a new namespace gets its quota and
twelve creates arrive at once: the quota must hold from the first second. Invariants: faults.py."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.e2e.cluster import gate_open, wait_for
from tests.e2e.conftest import E2E
from tests.e2e.faults import GPU, lease_holder, make_world, pod_by_pid, run_scenario

MIRROR_LEASE = "gpu-placement-quota-mirror"
FRESH_QUOTA, FRESH_CREATES = 4, 12


def at_once(e2e: E2E, namespace: str, prefix: str, retry: bool) -> Counter[int]:
    """FRESH_CREATES GPU pods created at once (a barrier), their status codes; `retry`: the webhook's 503s
    retried, as a client does (False: counted)."""
    barrier = threading.Barrier(FRESH_CREATES)

    def create(i: int) -> int:
        barrier.wait()
        return e2e.gpu_pod(namespace, f"{prefix}-{i:02d}", "faults-nowhere", retry=retry).status_code

    with ThreadPoolExecutor(FRESH_CREATES) as pool:
        return Counter(pool.map(create, range(FRESH_CREATES)))


@pytest.mark.timeout(420)
def test_webhook_replica_holding_the_quota_mirror_lease_killed_and_restarted(e2e: E2E) -> None:
    second = e2e.start_webhook(1)  # the chart runs two (webhook.replicas)
    try:
        world = make_world(e2e, "webhook")

        def fault(notes: dict[str, Any]) -> None:
            holder = lease_holder(e2e, MIRROR_LEASE)
            victim = pod_by_pid(e2e.webhooks, "webhook", holder)
            if victim is None:
                notes["problems"].append(f"no running replica holds the Lease {MIRROR_LEASE} ({holder!r})")
                return
            restarts = e2e.supervisor.restarts(victim, "webhook")
            t0 = time.monotonic()
            victim.kill("webhook")
            notes["killed"] = f"{victim.deployment}-{victim.replica}, the Lease holder"
            e2e.supervisor.wait_restarted(victim, "webhook", restarts)
            notes["killed replica Ready again"] = time.monotonic() - t0

            # Both replicas serving, the Lease still naming the dead process: a quota set now, and creates
            # at once, before anything mirrored it: /validate refuses them (503 QuotaPending) until
            # the API server enforces it, never one pod over it (the checker samples the namespace).
            fresh = e2e.namespace("fq-webhook", {"gpu-placement.io/quota": f"{GPU}={FRESH_QUOTA}"}, wait_quota=False)
            world.quotas[fresh] = {GPU: FRESH_QUOTA}
            world.unscheduled.add(fresh)  # its pods select no node: the quota is what is tested
            codes = at_once(e2e, fresh, "first", retry=False)
            notes[f"new quota of {FRESH_QUOTA}, {FRESH_CREATES} creates at once"] = dict(codes)
            if codes[201] and not e2e.quota_in_force(fresh, {GPU: FRESH_QUOTA}):
                notes["problems"].append(f"{codes[201]} GPU pods admitted into {fresh} before the API server "
                                         "enforced its quota (only QuotaPending is right then)")

            def taken() -> bool:
                pod = pod_by_pid(e2e.webhooks, "webhook", lease_holder(e2e, MIRROR_LEASE))
                return pod is not None and pod.procs["webhook"].alive()

            wait_for("a running replica holding the quota mirror Lease", taken, timeout=90, interval=0.5)
            notes["Lease held again"] = time.monotonic() - t0
            wait_for(f"ResourceQuota {fresh}/gpu-placement in force",
                     lambda: e2e.quota_in_force(fresh, {GPU: FRESH_QUOTA}), timeout=60, interval=0.5)
            gate_open(fresh, [lambda: e2e.gpu_pod(fresh, "gate-probe", "fq-nowhere", dryRun="All")])
            notes["new quota in force"] = time.monotonic() - t0
            again = at_once(e2e, fresh, "again", retry=True)
            notes["then at once"] = dict(again)
            stored = len(e2e.api.get(f"/api/v1/namespaces/{fresh}/pods")["items"])
            if not set(codes) | set(again) <= {201, 403, 503}:
                notes["problems"].append(f"creates answered other than 201, 403 or 503: {codes}, {again}")
            if stored != FRESH_QUOTA:
                notes["problems"].append(f"{stored} pods in {fresh} once its quota of {FRESH_QUOTA} is in force "
                                         f"and {2 * FRESH_CREATES} were asked for")

        run_scenario(e2e, world, "1 webhook Lease holder SIGKILL", fault)
    finally:
        second.stop()
        e2e.webhooks.remove(second)
        e2e.route_webhooks()
