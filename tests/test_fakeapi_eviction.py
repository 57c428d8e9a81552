"""The fake API server's pods/eviction and label managedFields, as kube-apiserver answers them
(pkg/registry/core/pod/storage/eviction.go; structured-merge-diff merge/update.go)."""

from __future__ import annotations

from typing import Any

import orjson

from gpu_placement.kube import api as kube
from gpu_placement.samples.cluster import make_node, make_pod, namespace, with_label_writers
from tests.fakeapi import FakeApiServer

EVICT = "/api/v1/namespaces/web/pods/{}/eviction"


def _evict(fake: FakeApiServer, name: str) -> tuple[int, dict[str, Any]]:
    response = kube.request(fake.api_client(), "POST", EVICT.format(name), timeout=(5, 10), body={
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": "web"}})
    status, body = response.status, orjson.loads(response.read())
    response.release_conn()
    return status, body


def _budget(allowed: int, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "cache", "namespace": "web"},
            "spec": {"selector": {"matchLabels": {"app": "cache"}}, **spec},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 2, "desiredHealthy": 2}}


def _setup(fake: FakeApiServer, allowed: int, **spec: Any) -> None:
    fake.load([namespace("web")])
    fake.add(make_pod("web", "cache-0", node="n1", labels={"app": "cache"}))
    fake.add(_budget(allowed, **spec))


def test_a_budget_that_allows_no_disruption_answers_429(fake_api: FakeApiServer) -> None:
    _setup(fake_api, 0)
    status, body = _evict(fake_api, "cache-0")
    assert status == 429
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    assert body["details"]["causes"] == [{"reason": "DisruptionBudget",
                                          "message": "The disruption budget cache needs 2 healthy pods and has 2 "
                                                     "currently"}]
    assert fake_api.get("Pod", "cache-0", "web") is not None


def test_an_allowed_eviction_takes_one_disruption_and_the_pod(fake_api: FakeApiServer) -> None:
    _setup(fake_api, 1)
    status, body = _evict(fake_api, "cache-0")
    assert (status, body["status"]) == (201, "Success")
    assert fake_api.get("Pod", "cache-0", "web") is None
    budget = fake_api.get("PodDisruptionBudget", "cache", "web")["status"]
    assert budget["disruptionsAllowed"] == 0 and set(budget["disruptedPods"]) == {"cache-0"}


def test_pods_that_need_no_budget_and_two_budgets(fake_api: FakeApiServer) -> None:
    _setup(fake_api, 0)
    pending = make_pod("web", "cache-1", labels={"app": "cache"})  # Pending: canIgnorePDB
    fake_api.add(pending)
    assert _evict(fake_api, "cache-1")[0] == 201
    unready = make_pod("web", "cache-2", node="n1", labels={"app": "cache"})
    unready["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    fake_api.add(unready)
    fake_api.patch("PodDisruptionBudget", "cache", {"spec": {"unhealthyPodEvictionPolicy": "AlwaysAllow"}}, "web")
    assert _evict(fake_api, "cache-2")[0] == 201  # an unready pod does not count towards the budget
    assert fake_api.get("PodDisruptionBudget", "cache", "web")["status"]["disruptionsAllowed"] == 0
    fake_api.add({**_budget(5), "metadata": {"name": "all", "namespace": "web"}, "spec": {"selector": {}}})
    status, body = _evict(fake_api, "cache-0")
    assert status == 500 and "more than one PodDisruptionBudget" in body["message"]


def test_label_writers_are_recorded(fake_api: FakeApiServer) -> None:
    """A patch takes the labels it adds or changes for its field manager; a removed label leaves every
    manager; a label written again with its value keeps its owner."""
    fake_api.add(with_label_writers(make_node("n1", "h100", labels={"team": "a"})))
    api = fake_api.api_client()
    path = "/api/v1/nodes/n1"
    for body, manager in (({"metadata": {"labels": {"team": "b", "zone": "z1"}}}, "ops-script"),
                          ({"metadata": {"labels": {"nvidia.com/gpu.product": None, "zone": "z1"}}}, "kubectl-edit")):
        response = kube.request(api, "PATCH", path, query=[("fieldManager", manager)], body=body, timeout=(5, 10),
                                content_type="application/merge-patch+json")
        assert response.status == 200
        kube.drain(response)  # read to the end: a connection handed back unread breaks the next request on it
    owners: dict[str, set[str]] = {}
    for entry in fake_api.get("Node", "n1")["metadata"]["managedFields"]:
        for field in entry["fieldsV1"].get("f:metadata", {}).get("f:labels", {}):
            owners.setdefault(field[2:], set()).add(entry["manager"])
    assert owners["team"] == {"ops-script"} and owners["zone"] == {"ops-script"}
    assert "nvidia.com/gpu.product" not in owners
    assert owners["nvidia.com/gpu.count"] == {"nfd-master"}
    assert "kubectl-edit" not in {e["manager"] for e in fake_api.get("Node", "n1")["metadata"]["managedFields"]}
