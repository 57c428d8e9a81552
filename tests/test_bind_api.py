"""`ApiBinder` against the fake API server, and `/bind` end to end: the Binding is created through the
API, the GPU reservation holds until the watch shows the pod bound, and every refusal is a sentence."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from kubernetes.client import ApiClient

from extender.app import create_app
from extender.binding import ApiBinder, BindError
from gpu_placement.base.config import Config
from gpu_placement.decide.placement import Placement
from gpu_placement.kube.api import WatchSettings
from gpu_placement.samples.cluster import make_node, make_pod, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from gpu_placement.web.serving import ServerThread, make_server
from tests.fakeapi import FakeApiServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)

GPU = "nvidia.com/gpu"
Extender = tuple[httpx.Client, ClusterView, list[str]]  # client, the live view, reservations made


@pytest.fixture
def api(fake_api: FakeApiServer) -> Iterator[ApiClient]:
    fake_api.load([make_node("gpu-1", "h100x8"), make_node("gpu-2", "h100x8"),
                   make_pod("default", "trainer", gpus={GPU: 2})])
    client = fake_api.api_client()
    yield client
    client.close()


def bind_once(binder: ApiBinder, namespace: str, name: str, pod_uid: str, node: str) -> None:
    """One bind in a loop of its own, as the extender's event loop makes it; the connections closed after."""
    async def run() -> None:
        try:
            await binder.bind(namespace, name, pod_uid, node)
        finally:
            await binder.aclose()

    asyncio.run(run())


def uid(fake: FakeApiServer, name: str = "trainer") -> str:
    pod = fake.get("Pod", name, "default")
    assert pod is not None
    return str(pod["metadata"]["uid"])


def test_bind_creates_the_binding(fake_api: FakeApiServer, api: ApiClient) -> None:
    bind_once(ApiBinder(api), "default", "trainer", uid(fake_api), "gpu-1")
    pod = fake_api.get("Pod", "trainer", "default")
    assert pod is not None and pod["spec"]["nodeName"] == "gpu-1"
    request = next(r for r in fake_api.requests_log if r.verb == "create")
    assert request.path == "/api/v1/namespaces/default/pods/trainer/binding"


def test_already_bound_is_a_409_sentence(fake_api: FakeApiServer, api: ApiClient) -> None:
    fake_api.bind("default", "trainer", "gpu-2")
    with pytest.raises(BindError) as info:
        bind_once(ApiBinder(api), "default", "trainer", uid(fake_api), "gpu-1")
    message = str(info.value)
    assert message.startswith("pod default/trainer cannot be bound to gpu-1: already bound")
    assert 'already assigned to node "gpu-2"' in message  # the API server's own words


def test_replaced_pod_is_a_409_uid_mismatch(api: ApiClient) -> None:
    with pytest.raises(BindError, match=r"replaced \(UID changed\).*Precondition failed: UID in precondition: old-uid"):
        bind_once(ApiBinder(api), "default", "trainer", "old-uid", "gpu-1")


def test_pod_gone_is_a_404_sentence(api: ApiClient) -> None:
    with pytest.raises(BindError, match=r"^pod default/ghost no longer exists"):
        bind_once(ApiBinder(api), "default", "ghost", "", "gpu-1")


def test_forbidden_names_the_rbac_rule(fake_api: FakeApiServer, api: ApiClient) -> None:
    fake_api.fail_next(1, 403, path="/api/v1/namespaces/default/pods/trainer/binding",
                       message='pods "trainer" is forbidden: User "system:serviceaccount:gpu:gpu-placement" cannot '
                               'create resource "pods/binding" in API group "" in the namespace "default"')
    with pytest.raises(BindError) as info:
        bind_once(ApiBinder(api), "default", "trainer", uid(fake_api), "gpu-1")
    assert "forbidden: grant the service account RBAC `create` on `pods/binding`" in str(info.value)
    assert "system:serviceaccount:gpu:gpu-placement" in str(info.value)


def test_other_statuses_carry_the_status_message(fake_api: FakeApiServer, api: ApiClient) -> None:
    fake_api.fail_next(1, 500, path="/api/v1/namespaces/default/pods/trainer/binding", message="etcd is sad")
    with pytest.raises(BindError, match=r"refused: HTTP 500 InternalError: etcd is sad"):
        bind_once(ApiBinder(api), "default", "trainer", uid(fake_api), "gpu-1")


def test_api_down_is_a_did_not_answer_sentence(fake_api: FakeApiServer, api: ApiClient) -> None:
    pod_uid = uid(fake_api)
    fake_api.down()
    start = time.monotonic()
    with pytest.raises(BindError, match=r"API server did not answer within 0\.5 s \(.*refused"):
        bind_once(ApiBinder(api, timeout=(0.5, 0.5)), "default", "trainer", pod_uid, "gpu-1")
    assert time.monotonic() - start < 1.0


def test_slow_api_is_a_did_not_answer_sentence(fake_api: FakeApiServer, api: ApiClient) -> None:
    fake_api.delay = 2.0  # the answer would come after 2 s; the bind gives up at its 0.3 s read timeout
    start = time.monotonic()
    with pytest.raises(BindError, match=r"API server did not answer within 0\.3 s \(.*timed out"):
        bind_once(ApiBinder(api, timeout=(2.0, 0.3)), "default", "trainer", uid(fake_api), "gpu-1")
    assert time.monotonic() - start < 1.5  # not the answer's 2 s: a connection and 0.3 s, with room for load


# -- /bind end to end ------------------------------------------------------------------------------

@pytest.fixture
def extender(fake_api: FakeApiServer, api: ApiClient) -> Iterator[Extender]:
    fake_api.load([validator_pod("gpu-1"), validator_pod("gpu-2")])
    config = Config()
    view = ClusterView(config)
    settings = WatchSettings(server_timeout=30, client_timeout=35.0, backoff_initial=0.05, backoff_max=0.3)
    source = LiveSource(view, Ingest(config), api, settings)
    reserved: list[str] = []
    reserve = view.reserve

    def spy(pod: str, node: str, *args: Any) -> Any:
        reserved.append(f"{pod}@{node}")
        return reserve(pod, node, *args)

    view.reserve = spy  # type: ignore[method-assign]
    source.start()
    try:
        wait_for(lambda: source.ready, what="the live view")
        app = create_app(view, Placement(view, config), ApiBinder(api, timeout=(1.0, 0.5)), source.readiness)
        with ServerThread(make_server(app, "127.0.0.1", 0)) as server, \
                httpx.Client(base_url=server.url(""), timeout=10) as client:
            yield client, view, reserved
    finally:
        source.stop()
        gc.unfreeze()


def bind(client: httpx.Client, name: str, node: str, pod_uid: str = "") -> str:
    body = {"PodName": name, "PodNamespace": "default", "PodUID": pod_uid, "Node": node}
    response = client.post("/bind", content=orjson.dumps(body), headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    return str(response.json()["Error"])


def filter_(client: httpx.Client, fake: FakeApiServer, name: str = "trainer") -> list[str]:
    """kube-scheduler's /filter before its /bind: the verdict /bind takes again."""
    pod = fake.get("Pod", name, "default")
    body = {"Pod": pod, "Nodes": None, "NodeNames": ["gpu-1", "gpu-2"]}
    response = client.post("/filter", content=orjson.dumps(body), headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    return sorted(response.json()["NodeNames"])  # sent in no particular order


def test_bind_reserves_until_the_watch_shows_the_pod_bound(fake_api: FakeApiServer, extender: Extender) -> None:
    client, view, reserved = extender
    assert client.get("/readyz").status_code == 200
    assert filter_(client, fake_api) == ["gpu-1", "gpu-2"]
    assert bind(client, "trainer", "gpu-1", uid(fake_api)) == ""
    assert reserved == ["default/trainer@gpu-1"]  # held from before the API call
    pod = fake_api.get("Pod", "trainer", "default")
    assert pod is not None and pod["spec"]["nodeName"] == "gpu-1"
    wait_for(lambda: view.pods["default/trainer"].node == "gpu-1", what="the watch to show the pod bound")
    wait_for(lambda: not view.reservations, what="the reservation released")
    assert view.free_units[GPU]["gpu-1"] == view.free_units[GPU]["gpu-2"] - 2  # the pod's own charge now


def test_refused_bind_releases_the_reservation(fake_api: FakeApiServer, extender: Extender) -> None:
    client, view, reserved = extender
    assert filter_(client, fake_api) == ["gpu-1", "gpu-2"]
    fake_api.fail_next(1, 403, path="/api/v1/namespaces/default/pods/trainer/binding")
    error = bind(client, "trainer", "gpu-1", uid(fake_api))
    assert "pods/binding" in error and reserved == ["default/trainer@gpu-1"]
    assert not view.reservations and view.free_units[GPU]["gpu-1"] == view.free_units[GPU]["gpu-2"]
    fake_api.delete("Pod", "trainer", "default")
    wait_for(lambda: "default/trainer" not in view.pods, what="the pod deleted in the view")
    assert bind(client, "trainer", "gpu-2").startswith("pod default/trainer no longer exists")
    assert not view.reservations  # held for the API call, released on its definite "no"


def test_an_unanswered_bind_keeps_the_reservation_until_the_watch_decides(fake_api: FakeApiServer,
                                                                           extender: Extender) -> None:
    """A read timeout: the Binding may exist. Releasing the hold would let the next pod take the
    memory this one may already be using; the watch settles it."""
    client, view, _ = extender
    assert filter_(client, fake_api) == ["gpu-1", "gpu-2"]
    fake_api.delay = 1.0
    error = bind(client, "trainer", "gpu-1", uid(fake_api))
    assert "did not answer within 0.5 s" in error and "stay reserved" in error
    assert view.reservations["default/trainer"].node == "gpu-1"
    assert view.free_units[GPU]["gpu-1"] == view.free_units[GPU]["gpu-2"] - 2
    fake_api.delay = 0.0
    time.sleep(0.3)  # the watch shows the pod still unbound: the hold stays
    assert view.pods["default/trainer"].node is None and "default/trainer" in view.reservations
    # kube-scheduler retries the pod: its own hold does not count against it, and is not doubled
    assert filter_(client, fake_api) == ["gpu-1", "gpu-2"]
    assert bind(client, "trainer", "gpu-1", uid(fake_api)) == ""
    wait_for(lambda: view.pods["default/trainer"].node == "gpu-1", what="the watch to show the pod bound")
    wait_for(lambda: not view.reservations, what="the reservation handed over to the pod's own charge")
    assert view.free_units[GPU]["gpu-1"] == view.free_units[GPU]["gpu-2"] - 2
