"""Scenario 23: launch outcomes are counted by one webhook replica under its own Lease, with the chart's
RBAC and arguments: the Lease carries the watermark and the cluster's totals, and every replica's
/metrics exports them (docs/outcomes.md)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from gpu_placement.outcomes.counter import TOTALS_ANNOTATION, WATERMARK_ANNOTATION
from tests.e2e.cluster import wait_for
from tests.e2e.conftest import E2E
from tests.e2e.deploy import NAMESPACE

LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/gpu-placement-outcomes"


def test_a_webhook_replica_counts_outcomes_under_its_own_lease(e2e: E2E) -> None:
    def annotated() -> dict[str, Any] | None:
        response = e2e.api.http.get(LEASE)
        if response.status_code != 200:
            return None
        lease: dict[str, Any] = response.json()
        found = lease["metadata"].get("annotations") or {}
        return lease if WATERMARK_ANNOTATION in found and TOTALS_ANNOTATION in found else None

    lease = wait_for("the outcomes Lease with its watermark and totals", annotated, timeout=60, interval=0.5)
    assert lease["spec"]["holderIdentity"]
    assert orjson.loads(lease["metadata"]["annotations"][TOTALS_ANNOTATION])["version"] == 1
    leading = []
    for pod in e2e.webhooks:
        if pod.procs["webhook"].alive():
            text = httpx.get(e2e.webhook_url(pod, "/metrics"), verify=False, timeout=5).text
            leading += [line for line in text.splitlines()
                        if line.startswith('gpu_placement_outcomes_leading{lease="gpu-placement-outcomes"} 1')]
            assert "gpu_placement_outcomes_counted_until_timestamp_seconds" in text
    assert len(leading) == 1  # exactly one replica counts
