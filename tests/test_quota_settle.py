"""When the quota gate trusts a ResourceQuota figure (gpu_placement/facts/resourcequotas.py `observed`,
`QuotaStatus.settled`; webhook/quota_gate.py): only once the webhook's view has shown it for SETTLE_SECONDS,
because the API server's quota admission reads its own informer, which may show it later.

The e2e run that found it (tests/e2e/test_20_dra_policy.py, two replicas, a burst of 20 claim pods the moment
the quota was counted): 3 pods admitted against a quota of 2, the 4 after them refused `exceeded quota` by the
API server, which had read the quota only by then."""

from __future__ import annotations

from typing import Any

from gpu_placement.base.config import Config
from gpu_placement.facts.resourcequotas import SETTLE_SECONDS, QuotaStatus
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from webhook.quota_gate import settled_readiness

KEY = "requests.nvidia.com/gpu"


def quota(hard: str | None, ns: str = "team") -> dict[str, Any]:
    status = {} if hard is None else {"hard": {KEY: hard}, "used": {KEY: "0"}}
    return {"kind": "ResourceQuota", "metadata": {"name": "gpu-placement", "namespace": ns},
            "spec": {"hard": {KEY: hard or "2"}}, "status": status}


class Watched:
    """A view fed as the live source feeds it, on a clock the test moves."""

    def __init__(self) -> None:
        self.clock = [1000.0]
        self.view = ClusterView(Config(), clock=lambda: self.clock[0])
        self.ingest = Ingest(Config())

    def event(self, obj: dict[str, Any], kind: str = "MODIFIED") -> None:
        self.ingest.event(self.view, "resourcequotas", kind, obj)

    def relist(self, *objs: dict[str, Any]) -> None:
        self.ingest.replace(self.view, "resourcequotas", list(objs))

    def later(self, seconds: float) -> None:
        self.clock[0] += seconds

    def settled(self, limit: int, ns: str = "team") -> bool:
        record: QuotaStatus | None = self.view.resourcequotas.get(ns)
        return record is not None and record.settled(KEY, limit, self.clock[0], SETTLE_SECONDS)


def test_a_figure_just_counted_is_trusted_after_the_settle_time() -> None:
    w = Watched()
    w.event(quota(None), "ADDED")  # written by the mirror, not counted
    w.later(10)
    assert not w.settled(2)
    w.event(quota("2"))
    assert not w.settled(2)
    w.later(SETTLE_SECONDS - 0.01)
    assert not w.settled(2)
    w.later(0.01)
    assert w.settled(2) and not w.settled(1)


def test_a_lowered_figure_waits_and_a_raised_one_does_not() -> None:
    w = Watched()
    w.event(quota("4"), "ADDED")
    w.later(60)
    w.event(quota("2"))  # lowered: the API server may still read 4
    assert not w.settled(2) and w.settled(4)
    w.later(SETTLE_SECONDS)
    assert w.settled(2)
    w.event(quota("3"))  # raised: the API server reads 2 or 3, both at most 3
    assert w.settled(3) and not w.settled(2)


def test_an_unchanged_figure_keeps_its_age_across_events_and_relists() -> None:
    """A watch that expired lists again (410 Gone): the quota it lists unchanged is not new."""
    w = Watched()
    w.relist(quota("2"))
    w.later(SETTLE_SECONDS)
    w.relist(quota("2"), quota("1", ns="other"))
    w.event(quota("2"))
    assert w.settled(2) and not w.settled(1, ns="other")


def test_a_quota_deleted_and_made_again_starts_over() -> None:
    w = Watched()
    w.event(quota("2"), "ADDED")
    w.later(60)
    w.event(quota("2"), "DELETED")
    w.event(quota("2"), "ADDED")
    assert not w.settled(2)


def test_old_changes_are_pruned() -> None:
    """Each record keeps only the changes the check can reach: a quota edited every minute for a day holds
    one or two, not 1,440."""
    w = Watched()
    for figure in range(1, 200):
        w.event(quota(str(figure % 3 + 1)))
        w.later(60)
    record = w.view.resourcequotas["team"]
    assert len(record.changes[KEY]) == 2 and w.settled(2) and not w.settled(1)


def test_a_replica_is_not_ready_until_its_listed_quotas_are_settled() -> None:
    w = Watched()
    ready = settled_readiness(lambda: (True, ""), w.view)
    assert ready() == (True, "")  # not listed yet: the source's own readiness says so
    w.relist(quota("2"))
    assert ready() == (False, "ResourceQuotas listed 0.0 s ago: the quota gate trusts a figure it has seen for 2 s")
    w.later(SETTLE_SECONDS)
    assert ready() == (True, "") and w.settled(2)
    waiting = (False, "waiting for the first full list of pods")
    assert settled_readiness(lambda: waiting, w.view)() == waiting
