"""Kubernetes Events where a person looks first (issue 34; gpu_placement/controllers/events.py), written to the fake API
server: on a Node when gpu-placement's verdict for it changes (a flapping node aggregated into a series,
and rate-limited, as client-go's event libraries do), on a Namespace whose settings do nothing, on a pod
admitted with warnings (by the replica that admitted it, once the pod exists), only by the Lease holder
where every replica sees the same thing."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.app.demo import DEMO_CONFIG
from gpu_placement.app.explain import admission_review
from gpu_placement.base.config import parse_config
from gpu_placement.controllers.events import (
    CONTROLLER,
    EventItem,
    EventWriter,
    PodWarnings,
    Regarding,
    watch_namespaces,
    watch_nodes,
)
from gpu_placement.kube.lease import Lease
from gpu_placement.report.namespaces import policy_problems
from gpu_placement.samples.cluster import demo_objects, make_pod, namespace, validator_pod
from gpu_placement.web import asgi
from gpu_placement.web.patching import apply_patch
from tests.fakeapi import FakeApiServer
from tests.support.events import events
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def core() -> Any:
    return core_from_objects(parse_config(DEMO_CONFIG), demo_objects())


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_node_verdict_change_is_an_event_on_the_node(fake_api: FakeApiServer, core: Any) -> None:
    clock = Clock()
    writer = EventWriter(fake_api.api_client(), "webhook-a", clock=clock)
    writer.start()
    try:
        watch_nodes(core.view, core.config, writer)
        writer.drain()
        assert events(fake_api) == []  # the verdicts seen at start are not changes
        core.ingest.event(core.view, "pods", "MODIFIED", validator_pod("h100-not-validated", ready=True))
        [usable] = wait_for(lambda: events(fake_api, "default"), what="the Normal event")
        assert usable["regarding"] == {"apiVersion": "v1", "kind": "Node", "name": "h100-not-validated"}
        assert (usable["type"], usable["reason"], usable["action"]) == ("Normal", "GpuNodeUsable", "Usable")
        assert usable["note"] == "gpu-placement takes GPU pods on node h100-not-validated again (it was NotValidated)"
        assert usable["reportingController"] == CONTROLLER and usable["reportingInstance"] == "webhook-a"
        # It flaps: the same Warning again within 6 minutes is one Event whose series counts it.
        for _ in range(3):
            clock.now += 30
            core.ingest.event(core.view, "pods", "MODIFIED", validator_pod("h100-not-validated", ready=False))
            clock.now += 30
            core.ingest.event(core.view, "pods", "MODIFIED", validator_pod("h100-not-validated", ready=True))
        writer.drain()
        warnings = [e for e in events(fake_api, "default") if e["type"] == "Warning"]
        assert len(warnings) == 1 and warnings[0]["reason"] == "GpuNodeUnusable"
        assert warnings[0]["action"] == "NotValidated"
        assert warnings[0]["note"].startswith("gpu-placement keeps GPU pods off node h100-not-validated: ")
        assert "nvidia-operator-validator pod" in warnings[0]["note"] and "NotValidated" not in warnings[0]["note"]
        assert warnings[0]["series"]["count"] == 3
        assert next(e for e in events(fake_api, "default") if e["type"] == "Normal")["series"]["count"] == 4
        # Past the series' end (6 minutes quiet), a repeat is a new Event.
        clock.now += 7 * 60
        core.ingest.event(core.view, "pods", "MODIFIED", validator_pod("h100-not-validated", ready=False))
        wait_for(lambda: len([e for e in events(fake_api) if e["type"] == "Warning"]) == 2, what="a second Warning")
    finally:
        writer.stop()


def test_a_flood_about_one_object_is_limited(fake_api: FakeApiServer) -> None:
    """tools/record's spam filter: 25 at once per object, then one per 5 minutes."""
    clock = Clock()
    writer = EventWriter(fake_api.api_client(), "webhook-a", clock=clock)
    node = Regarding("Node", "gpu-1")
    for i in range(40):
        writer.write(EventItem(node, "Warning", "GpuNodeUnusable", f"Code{i}", f"reason {i}"))
    assert len(events(fake_api)) == 25
    clock.now += 300
    writer.write(EventItem(node, "Warning", "GpuNodeUnusable", "Later", "later"))
    writer.write(EventItem(Regarding("Node", "gpu-2"), "Warning", "GpuNodeUnusable", "Other", "another node"))
    assert len(events(fake_api)) == 27


def test_only_the_lease_holder_writes_what_every_replica_sees(fake_api: FakeApiServer) -> None:
    api = fake_api.api_client()
    first = EventWriter(api, "a", Lease(api, "default", "gpu-placement-events", "a", 30))
    second = EventWriter(api, "b", Lease(api, "default", "gpu-placement-events", "b", 30))
    item = EventItem(Regarding("Node", "gpu-1"), "Warning", "GpuNodeUnusable", "NotValidated", "off")
    first.write(item)
    second.write(item)
    assert [e["reportingInstance"] for e in events(fake_api)] == ["a"]
    # A pod's warnings are known to the replica that admitted it only: written without the Lease.
    second.write(EventItem(Regarding("Pod", "p", "default"), "Warning", "GpuPlacementWarning", "Admitted", "x",
                           leased=False))
    assert sorted(e["reportingInstance"] for e in events(fake_api)) == ["a", "b"]


def test_a_namespace_whose_settings_do_nothing(fake_api: FakeApiServer) -> None:
    objects = [*demo_objects(), namespace("typo1", {"gpu-placement.io/qouta": "nvidia.com/gpu=4"})]
    core = core_from_objects(parse_config({**DEMO_CONFIG, "namespaceSelection": "optIn"}), objects)
    fake_api.load(o for o in objects if o["kind"] == "Namespace")
    writer = EventWriter(fake_api.api_client(), "a")
    writer.start()
    try:
        watch_namespaces(core.view, writer, lambda record: policy_problems(record, core.config))
        writer.drain()
        typo = wait_for(lambda: events(fake_api, "typo1"), what="typo1's Events")
        typo = wait_for(lambda: len(events(fake_api, "typo1")) == 2 and events(
            fake_api, "typo1"), what="both of typo1's Events")
        by_kind = {e["action"]: e for e in typo}  # misspelt, and on a namespace nobody opted in
        assert set(by_kind) == {"unread_annotation", "not_opted_in"}
        assert by_kind["unread_annotation"]["regarding"]["kind"] == "Namespace"
        assert by_kind["unread_annotation"]["reason"] == "GpuPolicyIgnored"
        assert "did you mean gpu-placement.io/quota?" in by_kind["unread_annotation"]["note"]
        team = events(fake_api, "team-a")
        assert [e["action"] for e in team] == ["not_opted_in"]
        assert "the webhook never sees its pods" in team[0]["note"]
        # Labelled right: opted in, nothing new is said about team-a.
        core.ingest.event(core.view, "namespaces", "MODIFIED", namespace(
            "team-a", {"gpu-placement.io/quota": "nvidia.com/gpu=16", "gpu-placement.io/pools": "training"},
            {"gpu-placement.io/enabled": "true"}))
        writer.drain()
        assert len(events(fake_api, "team-a")) == 1
    finally:
        writer.stop()


def test_a_pods_admission_warnings_land_on_the_pod_once_it_exists(fake_api: FakeApiServer, core: Any) -> None:
    """A controller drops admission warnings: a Deployment's pod with a misspelt annotation told no one."""
    fake_api.load(o for o in demo_objects() if o["kind"] == "Namespace")
    writer = EventWriter(fake_api.api_client(), "a")
    writer.start()
    try:
        warnings = PodWarnings(core.view, writer)
        app = core.webhook_app(on_warned=warnings.admitted)

        pod = make_pod("research", "train-abc12", gpus={"nvidia.com/gpu": 1},
                       annotations={"gpu-placement.io/gpumemory": "20Gi"})
        review = admission_review(pod, "research")
        review["request"]["dryRun"] = False
        _, body = asgi.call(app, "POST", "/mutate", orjson.dumps(review))  # shaped first, as the API server does
        pod = apply_patch(pod, orjson.loads(base64.b64decode(orjson.loads(body)["response"]["patch"])))
        review["request"]["object"] = pod
        status, body = asgi.call(app, "POST", "/validate", orjson.dumps(review))
        assert status == 200 and orjson.loads(body)["response"]["warnings"]
        writer.drain()
        assert events(fake_api) == []  # the pod does not exist yet
        core.ingest.event(core.view, "pods", "ADDED", pod)
        [event] = wait_for(lambda: events(fake_api, "research"), what="the pod's Event")
        assert event["regarding"]["kind"] == "Pod" and event["regarding"]["name"] == "train-abc12"
        assert event["reason"] == "GpuPlacementWarning" and event["type"] == "Warning"
        assert "did you mean gpu-placement.io/gpu-memory?" in event["note"]
        # A dry run (explain, kubectl --dry-run=server) leaves nothing to write.
        review["request"]["dryRun"] = True
        review["request"]["object"]["metadata"]["name"] = "dry"
        asgi.call(app, "POST", "/validate", orjson.dumps(review))
        core.ingest.event(core.view, "pods", "ADDED", {**pod, "metadata": {**pod["metadata"], "name": "dry"}})
        writer.drain()
        assert len(events(fake_api, "research")) == 1
    finally:
        writer.stop()
