"""The templates of `dra` namespaces and their device quota, kept by the quota mirror's leader against the
fake API server: the view fed by the real list+watch loop, the writes through the real client."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpu_placement.app.assembly import discover_dra
from gpu_placement.base.config import Config
from gpu_placement.controllers.quota_mirror import MirrorSettings, QuotaMirror
from gpu_placement.controllers.templates import TemplateKeeper
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.support.quota import FAST, FAST_WATCH
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)
Obj = dict[str, Any]
DRA = {"gpu-placement.io/allocation": "dra", "gpu-placement.io/quota": "nvidia.com/gpu=4,nvidia.com/mig-1g.10gb=2",
       "gpu-placement.io/gpu-products": "NVIDIA-H100-80GB-HBM3"}


class Replica:
    def __init__(self, fake: FakeApiServer) -> None:
        self.config = Config()
        self.view = ClusterView(self.config)
        self.api = fake.api_client()
        dra = discover_dra(self.api, tries=1)
        self.source = LiveSource(self.view, Ingest(self.config), self.api, FAST_WATCH,
                                 kinds=("namespaces", *dra.paths()), paths=dra.paths())
        self.mirror = QuotaMirror(self.api, self.view, self.config, "gpu-placement", "replica-a", FAST)
        self.mirror.templates = TemplateKeeper(self.api, self.view, self.config, str(dra.version))
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first lists")
        self.mirror.start()

    def stop(self) -> None:
        self.mirror.stop()
        self.source.stop()
        self.api.close()


@pytest.fixture
def cluster() -> Iterator[tuple[FakeApiServer, Replica]]:
    with FakeApiServer(dra="v1") as fake:
        fake.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
        replica = Replica(fake)
        yield fake, replica
        replica.stop()
        gc.unfreeze()


def ours(fake: FakeApiServer, ns: str) -> dict[str, Obj]:
    return {t["metadata"]["name"]: t for t in fake.list("ResourceClaimTemplate", ns)
            if t["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by") == "gpu-placement"}


def set_annotations(fake: FakeApiServer, ns: str, annotations: dict[str, str]) -> Obj:
    return fake.upsert({"kind": "Namespace", "metadata": {"name": ns, "annotations": annotations}})


def test_a_dra_namespace_gets_its_templates_and_its_quota_in_devices(cluster: tuple[FakeApiServer, Replica]) -> None:
    fake, _ = cluster
    team = set_annotations(fake, "ai", DRA)
    wait_for(lambda: len(ours(fake, "ai")) == 2, what="the templates")  # exclusive and shared (no MIG published)
    templates = ours(fake, "ai")
    assert sorted(name.rsplit("-", 1)[0] for name in templates) == ["gpu-placement-gpu", "gpu-placement-shared"]
    for template in templates.values():
        assert template["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Namespace", "name": "ai", "uid": team["metadata"]["uid"]}]
        [request] = template["spec"]["spec"]["devices"]["requests"]
        assert "NVIDIA-H100-80GB-HBM3" in request["exactly"]["selectors"][0]["cel"]["expression"]
    quota = wait_for(lambda: fake.get("ResourceQuota", "gpu-placement", "ai"), what="the ResourceQuota")
    assert quota["spec"]["hard"] == {
        "requests.nvidia.com/gpu": "4", "requests.nvidia.com/mig-1g.10gb": "2",
        "gpu.nvidia.com.deviceclass.resource.k8s.io/devices": "4",
        "mig.nvidia.com.deviceclass.resource.k8s.io/devices": "2",
        # the stand-ins, per level, that converted pods carry (gpu_placement/decide/dra_quota.py)
        "requests.gpu-placement.io/gpu": "4", "requests.gpu-placement.io/mig-1g.10gb": "2"}


def test_a_changed_policy_replaces_the_templates_and_device_plugin_removes_them(
        cluster: tuple[FakeApiServer, Replica]) -> None:
    fake, _ = cluster
    set_annotations(fake, "ai", DRA)
    wait_for(lambda: len(ours(fake, "ai")) == 2, what="the templates")
    before = set(ours(fake, "ai"))
    set_annotations(fake, "ai", {**DRA, "gpu-placement.io/gpu-products": "NVIDIA-A100-SXM4-80GB"})
    wait_for(lambda: len(ours(fake, "ai")) == 2 and not set(ours(fake, "ai")) & before,
             what="new templates for the new products, the old ones gone")
    set_annotations(fake, "ai", {**DRA, "gpu-placement.io/allocation": "device-plugin"})
    wait_for(lambda: not ours(fake, "ai"), what="no templates once back on the device plugin")
    wait_for(lambda: fake.get("ResourceQuota", "gpu-placement", "ai")["spec"]["hard"] == {  # type: ignore[index]
        "requests.nvidia.com/gpu": "4", "requests.nvidia.com/mig-1g.10gb": "2"}, what="the quota without devices")


def test_templates_someone_else_wrote_are_never_touched_and_a_broken_annotation_keeps_ours(
        cluster: tuple[FakeApiServer, Replica]) -> None:
    fake, replica = cluster
    fake.add({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
              "metadata": {"name": "mine", "namespace": "ai"},
              "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
                                                          "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}})
    set_annotations(fake, "ai", DRA)
    wait_for(lambda: len(ours(fake, "ai")) == 2 and replica.mirror.templates.writes == 2, what="the templates")
    writes = replica.mirror.templates.writes
    set_annotations(fake, "ai", {**DRA, "gpu-placement.io/allocation": "yes"})
    wait_for(lambda: replica.view.namespaces["ai"].annotations.get("gpu-placement.io/allocation") == "yes",
             what="the view to see the broken annotation")
    replica.mirror.resync()
    assert len(ours(fake, "ai")) == 2 and replica.mirror.templates.writes == writes
    set_annotations(fake, "ai", {})
    wait_for(lambda: not ours(fake, "ai"), what="ours gone with the annotations")
    assert fake.get("ResourceClaimTemplate", "mine", "ai") is not None


class Manual:
    """A replica whose mirror turns are taken by the test (no thread): the view still by list+watch."""

    def __init__(self, fake: FakeApiServer, lease: str) -> None:
        self.config = Config()
        self.view = ClusterView(self.config)
        self.api = fake.api_client()
        dra = discover_dra(self.api, tries=1)
        self.source = LiveSource(self.view, Ingest(self.config), self.api, FAST_WATCH,
                                 kinds=("namespaces", "pods", *dra.paths()), paths=dra.paths())
        self.mirror = QuotaMirror(self.api, self.view, self.config, "gpu-placement", "replica-a",
                                  MirrorSettings(lease_name=lease, lease_seconds=30, renew_seconds=0.05))
        self.mirror.templates = TemplateKeeper(self.api, self.view, self.config, str(dra.version))
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first lists")

    def stop(self) -> None:
        self.source.stop()
        self.api.close()


@pytest.fixture
def manual() -> Iterator[tuple[FakeApiServer, Manual]]:
    with FakeApiServer(dra="v1") as fake:
        fake.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
        replica: Manual | None = None
        try:
            yield fake, (replica := Manual(fake, "templates-lock"))
        finally:
            if replica is not None:
                replica.stop()
            gc.unfreeze()


def test_one_template_refused_does_not_hold_back_the_others_or_the_quota(
        manual: tuple[FakeApiServer, Manual]) -> None:
    fake, replica = manual
    fake.add({"kind": "Namespace", "metadata": {"name": "ai", "annotations": DRA}})
    wait_for(lambda: "ai" in replica.view.namespaces, what="the namespace in the view")
    fake.fail_next(1, 422, reason="Invalid", method="POST",
                   path="/apis/resource.k8s.io/v1/namespaces/ai/resourceclaimtemplates",
                   message='ResourceClaimTemplate.resource.k8s.io "x" is invalid: spec.spec: refused by a policy')
    replica.mirror.step()
    assert len(ours(fake, "ai")) == 1  # the first refused, the second made
    assert fake.get("ResourceQuota", "gpu-placement", "ai") is not None  # and the quota written in the same pass
    [failing] = replica.mirror.templates.failures.errors
    assert failing.startswith("ai/gpu-placement-")
    assert replica.mirror.last_error is not None and "refused by a policy" in replica.mirror.last_error
    assert REGISTRY.get_sample_value("gpu_placement_quota_mirror_failing_objects", {"lease": "templates-lock"}) == 1
    replica.mirror.step()  # the next turn: the namespace again
    assert len(ours(fake, "ai")) == 2
    assert replica.mirror.last_error is None and not replica.mirror.templates.failures.errors
    assert REGISTRY.get_sample_value("gpu_placement_quota_mirror_failing_objects", {"lease": "templates-lock"}) == 0


def test_a_dra_namespace_being_deleted_gets_no_templates(manual: tuple[FakeApiServer, Manual]) -> None:
    fake, replica = manual
    fake.add({"kind": "Namespace", "metadata": {"name": "ai-old", "annotations": DRA,
                                                "deletionTimestamp": "2026-12-01T00:00:00Z",
                                                "finalizers": ["example.com/stuck"]}})
    fake.add({"kind": "Namespace", "metadata": {"name": "ai", "annotations": DRA}})
    wait_for(lambda: "ai" in replica.view.namespaces and "ai-old" in replica.view.namespaces, what="the namespaces")
    replica.mirror.step()
    assert len(ours(fake, "ai")) == 2 and not ours(fake, "ai-old")
    assert not fake.count("create", "/apis/resource.k8s.io/v1/namespaces/ai-old/resourceclaimtemplates")
    assert replica.mirror.last_error is None
    # The view behind the API server (the deletion not seen yet): NamespaceLifecycle's 403 is settled.
    record = replica.view.namespaces["ai-old"]
    with replica.view.lock:
        replica.view.namespaces["ai-old"] = replace(record, terminating=False)
    replica.mirror.templates.reconcile("ai-old", replica.mirror._template_policy("ai-old", record), record.uid)
    assert fake.count("create", "/apis/resource.k8s.io/v1/namespaces/ai-old/resourceclaimtemplates") == 2
    assert not replica.mirror.templates.failures.errors


def waiting_pod(name: str, template: str, phase: str = "Pending") -> Obj:
    """A pod whose claim kube-controller-manager has not made yet (its create refused by quota, say)."""
    return {"kind": "Pod", "metadata": {"name": name, "namespace": "ai"},
            "spec": {"containers": [{"name": "c", "image": "x"}],
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}]},
            "status": {"phase": phase}}


def test_a_changed_policy_keeps_an_old_template_while_a_pod_waits_for_its_claim_from_it(
        manual: tuple[FakeApiServer, Manual]) -> None:
    fake, replica = manual
    set_annotations(fake, "ai", DRA)
    wait_for(lambda: "ai" in replica.view.namespaces, what="the namespace in the view")
    replica.mirror.step()
    old = ours(fake, "ai")
    [old_gpu] = [name for name in old if name.startswith("gpu-placement-gpu-")]
    fake.add(waiting_pod("train-0", old_gpu))
    fake.add(waiting_pod("done-0", old_gpu, phase="Succeeded"))  # finished: waits for nothing
    wait_for(lambda: replica.view.template_waiters.get(f"ai/{old_gpu}") == {"ai/train-0"}, what="the waiting pod")
    set_annotations(fake, "ai", {**DRA, "gpu-placement.io/gpu-products": "NVIDIA-A100-SXM4-80GB"})
    wait_for(lambda: replica.view.namespaces["ai"].get("gpu-placement.io/gpu-products") == "NVIDIA-A100-SXM4-80GB",
             what="the new policy in the view")
    replica.mirror.step()
    now = ours(fake, "ai")
    assert len(now) == 3 and old_gpu in now  # the two new ones, and the old one train-0 still needs
    assert not set(old) - {old_gpu} & set(now)  # the old shared template, which nobody waits for, went
    # kube-controller-manager makes the claim and records it on the pod: the old template goes.
    fake.patch("Pod", "train-0", {"status": {"resourceClaimStatuses": [
        {"name": "gpu", "resourceClaimName": "train-0-gpu-x7k2p"}]}}, "ai")
    wait_for(lambda: not replica.view.template_waiters, what="the claim recorded in the view")
    replica.mirror.step()  # a turn on the pod's event alone (no resync due)
    assert old_gpu not in ours(fake, "ai") and len(ours(fake, "ai")) == 2
    assert replica.mirror.templates.kept == {}


def test_a_template_failing_in_a_namespace_that_is_then_deleted_is_forgotten(
        manual: tuple[FakeApiServer, Manual]) -> None:
    fake, replica = manual
    fake.add({"kind": "Namespace", "metadata": {"name": "ai", "annotations": DRA}})
    wait_for(lambda: "ai" in replica.view.namespaces, what="the namespace in the view")
    fake.fail_next(100, 422, reason="Invalid", method="POST",
                   path="/apis/resource.k8s.io/v1/namespaces/ai/resourceclaimtemplates")
    replica.mirror.step()
    assert replica.mirror.templates.failures.errors and replica.mirror.last_error is not None
    fake.stop_failing()
    fake.delete("Namespace", "ai")
    wait_for(lambda: "ai" not in replica.view.namespaces, what="the namespace gone from the view")
    replica.mirror.step()
    assert not replica.mirror.templates.failures.errors and replica.mirror.last_error is None
