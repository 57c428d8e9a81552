"""The templates of `dra` namespaces and their device quota, kept by the quota mirror's leader against the
fake API server: the view fed by the real list+watch loop, the writes through the real client."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.config import Config
from gpu_placement.ingest import Ingest
from gpu_placement.live import LiveSource
from gpu_placement.service import discover_dra
from gpu_placement.view import ClusterView
from tests.fakeapi import FakeApiServer
from tests.test_live import wait_for
from tests.test_quota_mirror import FAST, FAST_WATCH
from webhook.dra_templates import TemplateKeeper
from webhook.quota_mirror import QuotaMirror

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
        # the stand-ins, per level, that converted pods carry (webhook/dra_quota.py)
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
