"""Quota holds against a live view (the fake API server, the real list+watch loop, the webhook over
HTTPS): holds only warn (any caller can make one; the API server's quota refuses the extra pod of a
burst), and they stay as long as their pods may come: a stalled pod watch keeps them until the view
shows the pods; a hold whose pod never came is dropped only once a list of the namespace's pods, made
after its time was up, lacks it; a later denial of the same pod releases its hold."""

from __future__ import annotations

import gc
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gpu_placement.base.config import parse_config
from gpu_placement.kube.api import WatchSettings
from gpu_placement.observe.metrics import API_OUTCOMES, QUOTA_HOLD_SETTLEMENTS
from gpu_placement.samples.cluster import namespace
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from gpu_placement.web.certs import CertBundle
from gpu_placement.web.serving import ServerThread
from gpu_placement.web.tls import ReloadingTLS, make_server
from tests.fakeapi import FakeApiServer
from tests.support.metrics import sample
from tests.support.waiting import wait_for
from tests.support.webhook import Webhook, trusting, user_pod
from webhook.app import create_app
from webhook.quota import MAX_HOLDS

pytestmark = pytest.mark.timeout(60)

GPU = "nvidia.com/gpu"
TTL = 0.5


@dataclass
class Live:
    fake: FakeApiServer
    hook: Webhook
    source: LiveSource

    @property
    def reservations(self) -> Any:
        return self.hook.app.state.admission.reservations

    def create(self, pod: dict[str, Any], ns: str, store: bool = True) -> tuple[bool, dict[str, Any]]:
        """What the API server does: /mutate, name and uid the pod, /validate, store it if allowed (and
        `store`: False plays its own quota admission refusing it afterwards)."""
        mutated, _, _ = self.hook.mutate(pod, ns)
        named = {**mutated, "metadata": {**mutated["metadata"], "namespace": ns, "uid": str(uuid.uuid4())}}
        verdict = self.hook.validate(named, ns)
        if verdict["allowed"] and store:
            self.fake.add(named, keep_uid=True)
        return verdict["allowed"], verdict


@pytest.fixture
def live(fake_api: FakeApiServer, bundle: CertBundle) -> Iterator[Live]:
    fake_api.load([namespace("research", {"gpu-placement.io/quota": f"{GPU}=2"}),
                   namespace("solo", {"gpu-placement.io/quota": f"{GPU}=1"})])
    config = parse_config({"reservationTTLSeconds": TTL})
    view = ClusterView(config)
    api = fake_api.api_client()
    interval = fake_api.bookmark_interval
    # A stalled pod watch is given up 3-4 s after the stall (its last bookmark came 0-1 s before it):
    # long after a hold made at once is overdue (TTL 0.5 s) even if that create is slow under load.
    # With two intervals (1-2 s) a create 0.5-1.5 s late could leave the holds nothing to list: the pods came
    # through the resumed watch first, and `holds.lists > 0` failed.
    source = LiveSource(view, Ingest(config), api, WatchSettings(
        connect_timeout=1.0, read_timeout=2.0, server_timeout=30, bookmark_interval=interval,
        client_timeout=4 * interval, backoff_initial=0.05, backoff_max=0.3))
    app = create_app(view, config, source.readiness, api)
    app.state.holds.interval, app.state.holds.recheck = 0.05, 0.1
    source.start()
    wait_for(lambda: source.ready, what="the first lists")
    fake_api.wait_for_watches(3)
    try:
        tls = ReloadingTLS(bundle.cert, bundle.key)
        with ServerThread(make_server(app, "127.0.0.1", 0, tls=tls)) as server, httpx.Client(
                base_url=f"https://localhost:{server.port}", verify=trusting(bundle), timeout=10) as client:
            yield Live(fake_api, Webhook(config, view, Ingest(config), app, client, [0.0]), source)
    finally:
        source.stop()
        api.close()
        gc.unfreeze()


def unreachable_lists() -> float:
    """The lists of a namespace's pods the holds tried and could not make (QUOTA_HOLD_LISTS, by outcome)."""
    return sum(sample("gpu_placement_quota_hold_lists_total", outcome=outcome) for outcome in API_OUTCOMES
               if outcome != "ok")


def test_a_stalled_pod_watch_keeps_the_holds_and_every_later_pod_is_told(live: Live) -> None:
    # The fake API server has no quota admission: the ResourceQuota the mirror keeps is what refuses the
    # extra pods in a cluster (e2e: test_13_quota_from_the_first_second). Here the holds are what is told.
    assert live.fake.stall_watches("pods") == 1
    for i in range(4):
        ok, verdict = live.create(user_pod("research", f"p{i}", gpus={GPU: 1}), "research")
        assert ok, verdict
        if i >= 2:
            assert f"0 are in use, {i} more admitted moments ago may yet be created" in verdict["warnings"][0]
        time.sleep(TTL * 1.5)  # the holds' time is up: the lists find the pods, so they stay held
    assert live.hook.app.state.holds.lists > 0 and live.hook.app.state.holds.dropped == 0
    with live.hook.view.lock:
        assert live.reservations.pending("research") == {GPU: 4}
    # The silent stream was given up and resumed: the view has the pods, the holds are gone, and what
    # exists refuses.
    wait_for(lambda: {f"research/p{i}" for i in range(4)} <= live.hook.view.pods.keys(), what="the watch resumed")
    with live.hook.view.lock:
        assert live.reservations.pending("research") == {}
        assert live.hook.view.namespace_usage["research"] == {GPU: 4}
    ok, verdict = live.create(user_pod("research", "late", gpus={GPU: 1}), "research")
    assert not ok and "4 are in use" in verdict["status"]["message"]


def test_a_hold_whose_pod_never_came_goes_only_after_a_list_without_it(live: Live) -> None:
    mutated, _, _ = live.hook.mutate(user_pod("solo", "ghost", gpus={GPU: 1}), "solo")
    assert live.hook.validate(mutated, "solo")["allowed"] is True  # ...and then another webhook refused it
    ok, verdict = live.create(user_pod("solo", "next", gpus={GPU: 1}), "solo", store=False)  # the API server's
    assert ok and "1 more admitted moments ago" in verdict["warnings"][0]  # quota refused it after us
    live.fake.down()  # no list can be made: time alone does not end the holds
    failed = unreachable_lists()
    wait_for(lambda: unreachable_lists() > failed, what="a list tried once the holds' time is up")
    with live.hook.view.lock:
        assert live.reservations.pending("solo") == {GPU: 2}
    live.fake.up()
    wait_for(lambda: live.hook.app.state.holds.dropped == 2, what="the list that settles the holds")
    with live.hook.view.lock:
        assert live.reservations.pending("solo") == {}
    wait_for(lambda: live.source.ready and live.fake.open_watches() == 3, what="the watches back")
    ok, verdict = live.create(user_pod("solo", "next", gpus={GPU: 1}), "solo")
    assert ok and "warnings" not in verdict


def test_a_later_denial_of_the_same_pod_releases_its_hold(live: Live) -> None:
    mutated, _, _ = live.hook.mutate(user_pod("solo", "a", gpus={GPU: 1}), "solo")
    stored = {**mutated, "metadata": {**mutated["metadata"], "uid": str(uuid.uuid4())}}
    assert live.hook.validate(stored, "solo")["allowed"] is True
    with live.hook.view.lock:
        assert live.reservations.pending("solo") == {GPU: 1}
    live.fake.set_annotations("Namespace", "solo", {"gpu-placement.io/quota": f"{GPU}=0"})
    wait_for(lambda: live.hook.view.namespaces["solo"].get("gpu-placement.io/quota") == f"{GPU}=0",
             what="the lowered quota")
    assert live.hook.validate(stored, "solo")["allowed"] is False  # the API server called again
    with live.hook.view.lock:
        assert live.reservations.pending("solo") == {}


# -- holds anyone can make (review finding 5): bounded, and their lists paced -------------------------------

def test_holds_per_namespace_are_bounded(live: Live) -> None:
    """Past MAX_HOLDS the oldest goes: forged reviews (where holds only warn, nothing refuses them) cannot
    grow the webhook's memory without end."""
    settled = QUOTA_HOLD_SETTLEMENTS.labels("evicted")
    before = settled._value.get()
    with live.hook.view.lock:
        for i in range(MAX_HOLDS + 10):
            live.reservations.hold("research", f"research/forged-{i}", f"uid-{i}", ((GPU, 1),))
        assert len(live.reservations) == MAX_HOLDS
        assert "research/forged-0" not in live.reservations._by_namespace["research"]
    assert settled._value.get() - before == 10


def test_forged_holds_in_many_namespaces_do_not_turn_into_a_stream_of_lists(live: Live) -> None:
    """Each overdue namespace is listed at most every `recheck` seconds, and all of them together at most
    `lists_per_second` (bursts of `burst`): holds made up for every quota namespace cost a few lists."""
    holds = live.hook.app.state.holds
    holds.stop()  # its passes made here, one at a time
    names = [f"team-{i}" for i in range(6)]
    for name in names:
        live.fake.add({"kind": "Namespace", "metadata": {"name": name,
                                                          "annotations": {"gpu-placement.io/quota": f"{GPU}=4"}}})
    wait_for(lambda: set(names) <= live.hook.view.namespaces.keys(), what="the namespaces")
    holds.lists_per_second, holds.burst, holds._tokens = 0.001, 2, 2.0
    for name in names:
        mutated, _, _ = live.hook.mutate(user_pod(name, "forged", gpus={GPU: 1}), name)
        assert live.hook.validate(mutated, name)["allowed"] is True

    def overdue() -> int:
        with live.hook.view.lock:
            return len(live.reservations.overdue(live.hook.view.clock()))

    wait_for(lambda: overdue() == len(names), what="the holds overdue")
    for _ in range(5):
        holds.check()
    assert holds.lists == 2
