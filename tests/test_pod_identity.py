"""A pod is its UID, not its name: `/bind`, the release of a reservation and a pod's charge go by UID.

A StatefulSet recreates `web-0` under the same name with a new UID, often within a second; the
extender's watch is then a moment behind the API server and kube-scheduler. Each test plays that:
the API server (tests/fakeapi.py, which binds with the UID precondition as kube-apiserver does)
already has the new pod, while the view, fed here event by event, still shows the old one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from extender.app import create_app
from extender.binding import ApiBinder
from gpu_placement.base.config import Config
from gpu_placement.decide.placement import Placement
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import KINDS, Ingest
from gpu_placement.web.serving import ServerThread, make_server
from tests.fakeapi import FakeApiServer

pytestmark = pytest.mark.timeout(30)

SHARED = "nvidia.com/gpu.shared"
ASK = {"gpu-placement.io/gpu-memory": "10Gi"}
T4, OTHER = "t4-a", "t4-b"  # time-sliced T4s: 15360 MiB, two shares each; one 10Gi share fits, two do not


def _t4(name: str) -> dict[str, Any]:
    return make_node(name, "t4-timeslicing", labels={"nvidia.com/gpu.replicas": "2",
                                                     "nvidia.com/gpu.sharing-strategy": "time-slicing"},
                     shared_resource=SHARED)


def _pod(name: str, uid: str, node: str | None = None) -> dict[str, Any]:
    return make_pod("apps", name, gpus={SHARED: 1}, annotations=ASK, node=node, uid=uid,
                    image="registry.example.com/web:1")


class Cluster:
    """The fake API server and an extender whose view the test feeds (the watch, held back)."""

    def __init__(self, fake: FakeApiServer, objects: list[dict[str, Any]]) -> None:
        self.fake = fake
        stored = [fake.add(obj, keep_uid=True) for obj in objects]
        self.config = Config()
        self.view = ClusterView(self.config)
        self.ingest = Ingest(self.config)
        for kind in KINDS:
            self.ingest.replace(self.view, kind, [obj for obj in stored if Ingest.kind_of(obj) == kind])
        self.api = fake.api_client()
        app = create_app(self.view, Placement(self.view, self.config), ApiBinder(self.api), lambda: (True, ""))
        self.server = ServerThread(make_server(app, "127.0.0.1", 0)).start()
        self.http = httpx.Client(base_url=self.server.url(""), timeout=10)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        """One pod event reaching the view (late)."""
        self.ingest.event(self.view, "pods", kind, obj)

    def recreate(self, name: str, uid: str) -> dict[str, Any]:
        """The StatefulSet controller: the old pod deleted, a new one of that name created."""
        self.fake.delete("Pod", name, "apps")
        return self.fake.add(_pod(name, uid), keep_uid=True)

    def filter(self, pod: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
        body = {"Pod": pod, "Nodes": None, "NodeNames": nodes}
        response = self.http.post("/filter", content=orjson.dumps(body))
        assert response.status_code == 200, response.text
        return dict(response.json())

    def bind(self, pod: dict[str, Any], node: str) -> str:
        meta = pod["metadata"]
        body = {"PodName": meta["name"], "PodNamespace": "apps", "PodUID": meta["uid"], "Node": node}
        response = self.http.post("/bind", content=orjson.dumps(body))
        assert response.status_code == 200, response.text
        return str(response.json()["Error"])

    def close(self) -> None:
        self.http.close()
        self.server.stop()
        self.api.close()


@pytest.fixture
def cluster(fake_api: FakeApiServer, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    pods: list[dict[str, Any]] = request.param
    objects = [namespace("apps"), _t4(T4), _t4(OTHER), validator_pod(T4), validator_pod(OTHER), *pods]
    made = Cluster(fake_api, objects)
    yield made
    made.close()


@pytest.mark.parametrize("cluster", [[_pod("web-0", "uid-web-0-old", node=OTHER)]], indirect=True)
def test_bind_rechecks_a_recreated_pod_while_the_view_still_shows_its_predecessor_bound(cluster: Cluster) -> None:
    """The view's web-0 (old UID) is bound on another node: that says nothing about the new web-0,
    which /bind must check again and hold memory for like any other pod."""
    new = cluster.recreate("web-0", "uid-web-0-new")
    assert cluster.filter(new, [T4])["NodeNames"] == [T4]  # kube-scheduler's cycle for the new pod
    other = cluster.fake.add(_pod("chat", "uid-chat"), keep_uid=True)
    assert cluster.filter(other, [T4])["NodeNames"] == [T4]
    assert cluster.bind(other, T4) == ""  # bound first (binding cycles overlap): 10 of 15 GiB held
    error = cluster.bind(new, T4)
    assert error.startswith(f"InsufficientGPUMemory: the pod needs 10240 MiB of {SHARED} memory free"), error
    stored = cluster.fake.get("Pod", "web-0", "apps")
    assert stored is not None and not stored["spec"].get("nodeName")  # never bound onto the full T4


@pytest.mark.parametrize("cluster", [[_pod("web-0", "uid-web-0-old")]], indirect=True)
def test_a_late_deleted_event_of_the_old_pod_keeps_the_new_pods_reservation(cluster: Cluster) -> None:
    old = cluster.fake.get("Pod", "web-0", "apps")
    new = cluster.recreate("web-0", "uid-web-0-new")
    assert cluster.filter(new, [T4])["NodeNames"] == [T4]
    assert cluster.bind(new, T4) == ""
    assert cluster.view.reservations["apps/web-0"].node == T4
    cluster.event("DELETED", old)  # the old pod's deletion reaches the view only now
    held = cluster.view.reservations.get("apps/web-0")
    assert held is not None and held.node == T4, "the new pod's reservation was released by the old pod's DELETED"
    late = cluster.fake.add(_pod("late", "uid-late"), keep_uid=True)
    answer = cluster.filter(late, [T4])
    assert answer["NodeNames"] == [] and T4 in answer["FailedNodes"], answer  # 10 of 15 GiB still held
    cluster.event("ADDED", cluster.fake.get("Pod", "web-0", "apps"))  # the new pod, seen bound at last
    assert "apps/web-0" not in cluster.view.reservations
    assert cluster.view.charge_of("apps/web-0") == ((SHARED, 1, 10240),)  # its own charge holds it now


@pytest.mark.parametrize("cluster", [[_pod("web-0", "uid-web-0-old")]], indirect=True)
def test_a_relist_without_the_old_pod_keeps_the_new_pods_reservation(cluster: Cluster) -> None:
    cluster.fake.delete("Pod", "web-0", "apps")
    listed = cluster.fake.list("Pod")  # a relist served between the deletion and the new create
    new = cluster.fake.add(_pod("web-0", "uid-web-0-new"), keep_uid=True)
    assert cluster.filter(new, [T4])["NodeNames"] == [T4]
    assert cluster.bind(new, T4) == ""
    cluster.ingest.replace(cluster.view, "pods", listed)
    assert "apps/web-0" not in cluster.view.pods
    held = cluster.view.reservations.get("apps/web-0")
    assert held is not None and held.node == T4, "the relist released the new pod's reservation"
    assert cluster.view.free_mib[SHARED][T4] == 15360 - 10240


@pytest.mark.parametrize("cluster", [[_pod("web-0", "uid-web-0-old", node=T4)]], indirect=True)
def test_a_late_deleted_event_of_the_old_pod_leaves_the_new_pod_and_its_charge(cluster: Cluster) -> None:
    """The order a relist can show them in: the new pod (bound) first, then the old one's deletion."""
    old = cluster.fake.get("Pod", "web-0", "apps")
    cluster.recreate("web-0", "uid-web-0-new")
    cluster.fake.bind("apps", "web-0", OTHER)
    cluster.event("MODIFIED", cluster.fake.get("Pod", "web-0", "apps"))
    cluster.event("DELETED", old)
    kept = cluster.view.pods.get("apps/web-0")
    assert kept is not None and kept.uid == "uid-web-0-new", "the old pod's DELETED removed the new pod"
    assert cluster.view.free_mib[SHARED][OTHER] == 15360 - 10240 and cluster.view.free_mib[SHARED][T4] == 15360


def test_an_unknown_uid_still_releases() -> None:
    """Callers that know no UID (a snapshot, an old test) release as before."""
    view = ClusterView(Config())
    view.reserve("apps/web-0", T4, ((SHARED, 1),), "10Gi", "uid-1")
    view.release("apps/web-0", "uid-2")
    assert "apps/web-0" in view.reservations
    view.release("apps/web-0")
    assert not view.reservations
