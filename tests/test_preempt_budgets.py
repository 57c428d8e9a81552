"""`/preempt` and PodDisruptionBudgets: the victims it adds spare the budgets as kube-scheduler's
DefaultPreemption spares them, and those it cannot spare are counted in NumPDBViolations.

The cluster of tests/test_preempt.py: on t4-a, 1 GiB is free, the in-tree set (batch-low) frees a
share and 2 GiB more, and the preemptor needs 4 GiB. batch-big (priority 10, 6 GiB) or one of the six
batch-small pods (priority 20, 1 GiB each) would make up the rest; without budgets, batch-big goes
(lower priority).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.base.config import Config
from gpu_placement.facts.budgets import Budget, budget_from_json, violations
from gpu_placement.kube.api import WatchSettings
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import KINDS, Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.support.extender import Extender
from tests.support.preempt import cluster, meta_args, preempt, uid, victim_uids
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)


def budget(name: str, selector: dict[str, Any] | None, allowed: int, disrupted: tuple[str, ...] = ()
           ) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "inference", "uid": f"uid-pdb-{name}"},
            "spec": {"selector": selector, "maxUnavailable": 0},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1,
                       "disruptedPods": {pod: "2026-01-01T00:00:00Z" for pod in disrupted}}}


@pytest.fixture
def with_budgets(request: pytest.FixtureRequest) -> Iterator[Extender]:
    server = Extender([*cluster(), *request.param])
    yield server
    server.close()


@pytest.mark.parametrize("with_budgets", [[budget("big", {"matchLabels": {"app": "batch-big"}}, 0)]],
                         indirect=True)
def test_a_victim_a_budget_protects_is_passed_over_when_others_will_do(with_budgets: Extender) -> None:
    answer = preempt(with_budgets, meta_args({"t4-a": ["batch-low"]}))
    assert victim_uids(answer, "t4-a") == [uid("batch-small-0"), uid("batch-low")]
    assert answer["t4-a"]["NumPDBViolations"] == 0


@pytest.mark.parametrize("with_budgets", [[budget("all", {"matchExpressions": [
    {"key": "app", "operator": "In", "values": ["batch-big", *(f"batch-small-{i}" for i in range(6))]}]}, 0)]],
    indirect=True)
def test_when_every_way_breaks_a_budget_the_fewest_are_broken_and_counted(with_budgets: Extender) -> None:
    """kube-scheduler picks the node with the fewest violations: the count it gets must include ours."""
    answer = preempt(with_budgets, meta_args({"t4-a": ["batch-low"]}, pdb={"t4-a": 2}))
    assert victim_uids(answer, "t4-a") == [uid("batch-big"), uid("batch-low")]  # one victim, not two
    assert answer["t4-a"]["NumPDBViolations"] == 2 + 1  # kube-scheduler's own, and batch-big's


@pytest.mark.parametrize("with_budgets", [[
    budget("being-evicted", {"matchLabels": {"app": "batch-big"}}, 0, disrupted=("batch-big",)),
    budget("room-for-two", {"matchExpressions": [{"key": "app", "operator": "Exists"}]}, 2),
    budget("empty-selector", {}, 0), budget("no-selector", None, 0),
    budget("bad-operator", {"matchExpressions": [{"key": "app", "operator": "Near", "values": ["x"]}]}, 0)]],
    indirect=True)
def test_budgets_count_as_kube_scheduler_counts_them(with_budgets: Extender) -> None:
    """A pod the API server is already evicting for a budget does not break it again; a budget with
    room for two disruptions takes batch-low (the in-tree victim, counted first) and batch-big; empty,
    missing and invalid selectors match nothing."""
    answer = preempt(with_budgets, meta_args({"t4-a": ["batch-low"]}))
    assert victim_uids(answer, "t4-a") == [uid("batch-big"), uid("batch-low")]
    assert answer["t4-a"]["NumPDBViolations"] == 0


def test_violations_draw_on_a_budget_in_order() -> None:
    shared = budget_from_json(budget("two", {"matchLabels": {"team": "a"}}, 2))
    victims = [("inference", f"p{i}", {"team": "a"}) for i in range(4)] + [("other", "q", {"team": "a"})]
    assert violations(victims, [shared]) == [False, False, True, True, False]
    assert violations([("inference", "p", {})], [shared]) == [False]  # no labels: no budget selects it
    assert isinstance(shared, Budget) and shared.allowed == 2


def test_the_live_view_watches_budgets(fake_api: FakeApiServer) -> None:
    config = Config()
    view = ClusterView(config)
    api = fake_api.api_client()
    source = LiveSource(view, Ingest(config), api, WatchSettings(server_timeout=30, client_timeout=35.0,
                                                                 backoff_initial=0.05, backoff_max=0.3),
                        kinds=(*KINDS, "poddisruptionbudgets"))
    fake_api.add(budget("big", {"matchLabels": {"app": "batch-big"}}, 0))
    source.start()
    try:
        wait_for(lambda: source.ready, what="the first lists")
        assert view.poddisruptionbudgets["inference/big"].allowed == 0
        fake_api.patch("PodDisruptionBudget", "big", {"status": {"disruptionsAllowed": 1}}, "inference")
        wait_for(lambda: view.poddisruptionbudgets["inference/big"].allowed == 1, what="the status change")
        fake_api.delete("PodDisruptionBudget", "big", "inference")
        wait_for(lambda: "inference/big" not in view.poddisruptionbudgets, what="the deletion")
    finally:
        source.stop()
        api.close()
        gc.unfreeze()
