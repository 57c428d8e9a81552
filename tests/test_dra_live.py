"""DRA objects by list+watch from an API server that serves resource.k8s.io, and nothing of it from one
that does not (docs/dra.md): discovery picks the version, the same reflector loop lists,
watches, resumes and relists them, ResourceSlices of other drivers never reach the view."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.app.assembly import discover_dra
from gpu_placement.base.config import Config
from gpu_placement.decide.placement import Placement
from gpu_placement.facts.dra import DRA_KINDS
from gpu_placement.kube.discovery import DraApi, discover
from gpu_placement.samples.cluster import make_node, namespace, validator_pod
from gpu_placement.samples.dra import device_classes, resource_slice
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import KINDS, Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.support.dra import claim_pod, template
from tests.support.live import FAST
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)


def base() -> list[dict[str, Any]]:
    return [namespace("ml"), make_node("dra-1", "h100", allocatable={}), validator_pod("dra-1"),
            make_node("dra-2", "h100", allocatable={}), validator_pod("dra-2")]


class Live:
    def __init__(self, fake: FakeApiServer) -> None:
        self.fake, self.config = fake, Config()
        self.view = ClusterView(self.config)
        self.api = fake.api_client()
        self.dra = discover_dra(self.api, tries=1)
        self.source = LiveSource(self.view, Ingest(self.config), self.api, FAST, kinds=(*KINDS, *self.dra.paths()),
                                 paths=self.dra.paths(), selectors={"resourceslices": "spec.driver=gpu.nvidia.com"})
        self.placement = Placement(self.view, self.config)
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first full lists")
        fake.wait_for_watches(len(self.source.kinds))

    def stop(self) -> None:
        self.source.stop()
        self.api.close()


@pytest.fixture
def served() -> Iterator[Live]:
    with FakeApiServer(dra="v1", taint_rules="v1") as fake:
        other = resource_slice("dra-2", 4)
        other["metadata"]["name"], other["spec"]["driver"] = "dra-2-x", "x.example.com"
        fake.load([*base(), *device_classes(), resource_slice("dra-1", 2), other,
                   template("ml", "one-gpu", "gpu.nvidia.com")])
        live = Live(fake)
        yield live
        live.stop()


def test_without_resource_k8s_io_nothing_changes() -> None:
    with FakeApiServer() as fake:
        fake.load(base())
        live = Live(fake)
        try:
            assert live.dra == DraApi()
            assert live.source.kinds == KINDS
            assert not live.view.dra.active
            paths = {r.path for r in fake.requests_log if r.verb in ("list", "watch")}
            assert paths == {"/api/v1/namespaces", "/api/v1/nodes", "/api/v1/pods"}
            req = live.placement.requirements(claim_pod("ml", "train", "one-gpu"))
            assert not req.wants_gpu  # no DRA served: a claim pod is not ours, as before
        finally:
            live.stop()


def test_discovery_picks_the_newest_version_that_serves_each_part() -> None:
    for view_version, taints, expected in (("v1", "v1", DraApi("v1", "v1")), ("v1", "v1beta2", DraApi("v1", "v1beta2")),
                                           ("v1", "v1alpha3", DraApi("v1", "v1alpha3")), ("v1", None, DraApi("v1")),
                                           ("v1beta2", None, DraApi("v1beta2"))):
        with FakeApiServer(dra=view_version, taint_rules=taints) as fake:
            api = fake.api_client()
            try:
                assert discover(api) == expected
            finally:
                api.close()


def test_slices_classes_and_templates_are_listed_and_watched(served: Live) -> None:
    view, fake = served.view, served.fake
    assert {r.query.get("fieldSelector") for r in fake.requests_log
            if r.path == "/apis/resource.k8s.io/v1/resourceslices"} == {"spec.driver=gpu.nvidia.com"}
    assert set(DRA_KINDS) <= view.listed
    assert view.nodes["dra-1"].dra_devices == 2
    assert view.nodes["dra-2"].dra_devices == 0  # another driver's slice is not ours
    req = served.placement.requirements(claim_pod("ml", "train", "one-gpu"))
    assert req.claims == ("gpu.nvidia.com",)
    assert served.placement.filter(req, ["dra-1", "dra-2"]).passed == ["dra-1"]

    fake.add(resource_slice("dra-2", 4))  # the kubelet plugin starts on dra-2
    wait_for(lambda: view.nodes["dra-2"].dra_devices == 4, what="dra-2's slice through the watch")
    assert sorted(served.placement.filter(req, ["dra-1", "dra-2"]).passed) == ["dra-1", "dra-2"]

    fake.delete("ResourceSlice", "dra-1-gpu.nvidia.com-gpus")
    wait_for(lambda: view.nodes["dra-1"].dra_devices == 0, what="dra-1's slice deleted")
    assert served.placement.filter(req, ["dra-1", "dra-2"]).passed == ["dra-2"]


def test_a_410_relists_the_dra_kinds_too(served: Live) -> None:
    fake, view = served.fake, served.view
    fake.compact()
    fake.load([resource_slice("dra-2", 3)])  # no events: only a relist can show it
    fake.cut_watches()
    wait_for(lambda: view.nodes["dra-2"].dra_devices == 3, what="the relist after 410")


def test_claims_allocated_fill_their_node(served: Live) -> None:
    fake, view = served.fake, served.view
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "train-gpu", "namespace": "ml"},
             "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
    fake.add(claim)
    wait_for(lambda: "ml/train-gpu" in view.dra.claims, what="the claim")
    assert view.dra.used_on("dra-1") == {}
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": "r", "driver": "gpu.nvidia.com", "pool": "dra-1", "device": "gpu-1"}]}}}
    fake.update(claim)
    wait_for(lambda: view.dra.used_on("dra-1") == {"gpu-1": 1}, what="the allocation")
    fake.delete("ResourceClaim", "train-gpu", "ml")
    wait_for(lambda: view.dra.used_on("dra-1") == {}, what="the claim deleted")


def test_a_deleted_node_does_not_come_back_when_its_resourceslice_goes_after_it(served: Live) -> None:
    """The kubelet plugin's ResourceSlices are owned by their Node, so the garbage collector deletes them
    after it (cluster autoscaler scale-down): their deletion must not put the Node back in the view."""
    from gpu_placement.report.cluster_metrics import ClusterMetrics

    fake, view = served.fake, served.view
    tracker = ClusterMetrics(view, served.config)
    tracker.start()
    fake.delete("Node", "dra-1")
    wait_for(lambda: "dra-1" not in view.nodes, what="the Node gone from the view")
    fake.delete("Pod", validator_pod("dra-1")["metadata"]["name"], "gpu-operator")
    fake.delete("ResourceSlice", resource_slice("dra-1", 2)["metadata"]["name"])
    wait_for(lambda: not view.dra.devices_on("dra-1"), what="the slice gone from the view")
    assert "dra-1" not in view.nodes and view.dra.label_facts("dra-1") is None
    unusable = {sample.labels["node"] for family in tracker.families()
                if family.name == "gpu_placement_gpu_node_unusable_since_timestamp_seconds"
                for sample in family.samples}
    assert "dra-1" not in unusable
    # A node that joins again is judged afresh, its slice merged in whichever order they come.
    fake.add(resource_slice("dra-1", 2))
    fake.add(make_node("dra-1", "h100", allocatable={}))
    wait_for(lambda: view.nodes.get("dra-1") is not None and view.nodes["dra-1"].dra_devices == 2,
             what="the node back with its devices")
