"""Scenario 19: GPUs claimed through DRA on the real 1.37 control plane. The harness plays NVIDIA's
kubelet plugin (DeviceClasses, a ResourceSlice per node) and the kubelet's part for claims; the
chart's webhook routes claim pods to its scheduler, kube-scheduler's own DRA allocator picks the
devices, the extender judges the nodes, and the webhook replicas keep DeviceTaintRules so that no
scheduler's allocator gives out an unverified node's devices.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpu_placement.app.cli import main
from gpu_placement.base.config import Config
from gpu_placement.decide.kubefilters import AFFINITY
from gpu_placement.kube.api import load_api_client
from gpu_placement.samples.cluster import validator_pod
from gpu_placement.samples.dra import device_classes
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from tests.e2e.cluster import ADMIN_TOKEN, DraPlugin, now_rfc3339, wait_for
from tests.e2e.conftest import E2E
from tests.e2e.dra import RESOURCE, Obj, allocation
from webhook.claim_reader import ClaimReader


@pytest.fixture(scope="module")
def plugin(e2e: E2E) -> Iterator[DraPlugin]:
    dra = DraPlugin(e2e.api)
    dra.install()
    yield dra
    dra.stop()  # later scenarios see a cluster without DRA devices again


def dra_nodes(e2e: E2E, plugin: DraPlugin, group: str, specs: list[tuple[str, bool, dict[str, str]]]) -> list[str]:
    """GPU nodes whose GPUs only the DRA driver gives (no device-plugin resource), validator Ready or not."""
    names = e2e.nodes(group, [(suffix, "h100", {"allocatable": {}, "validator_ready": ready, "labels": labels})
                              for suffix, ready, labels in specs])
    for name in names:
        plugin.publish(name, 2)
    return names


def template(e2e: E2E, ns: str, name: str = "one-gpu") -> None:
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
                                                        "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}}
    r = e2e.api.create(f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", body)
    assert r.status_code == 201, r.text


def claim_pod(e2e: E2E, ns: str, name: str, group: str, tmpl: str = "one-gpu") -> Obj:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
           "spec": {"nodeSelector": {"e2e-group": group}, "restartPolicy": "Never",
                    "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": tmpl}],
                    "containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04",
                                    "resources": {"claims": [{"name": "gpu"}],
                                                  "requests": {"cpu": "100m", "memory": "128Mi"}}}]}}
    r = e2e.api.create(f"/api/v1/namespaces/{ns}/pods", pod)
    assert r.status_code == 201, r.text
    return dict(r.json())


def rule(e2e: E2E, node: str) -> Obj | None:
    r = e2e.api.http.get(f"{RESOURCE}/devicetaintrules/gpu-placement-{node}")
    return dict(r.json()) if r.status_code == 200 else None


def wait_rule(e2e: E2E, node: str, value: str | None, effect: str = "NoSchedule") -> Obj | None:
    """Until the node's rule carries `value` (None: until it is gone)."""
    def seen() -> Obj | bool | None:
        found = rule(e2e, node)
        if value is None:
            return found is None
        return found if found and found["spec"]["taint"].get("value") == value and \
            found["spec"]["taint"]["effect"] == effect else None
    found = wait_for(f"DeviceTaintRule of {node} {value or 'gone'}", seen, timeout=30, interval=0.2)
    return found if isinstance(found, dict) else None


def test_a_dra_pod_gets_no_device_of_an_unverified_node_and_lands_once_it_is_verified(
        e2e: E2E, plugin: DraPlugin) -> None:
    group = "s19-verify"
    [node] = dra_nodes(e2e, plugin, group, [("a", False, {})])
    found = wait_rule(e2e, node, "NotValidated")
    assert found is not None
    e2e.wait_refused({node: "NotValidated"})  # config.refusedNodeLabel: kube-scheduler keeps our pods off it too
    assert found["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": node}
    assert found["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpu-placement"

    ns = e2e.namespace("dra")
    template(e2e, ns)
    pod = claim_pod(e2e, ns, "train", group)
    assert pod["spec"]["schedulerName"] == "gpu-placement"  # routed by /mutate from its claim's class
    # Another scheduler's pod (gpu-operator is exempt: the default scheduler, no extender) with the
    # same kind of claim: only the DeviceTaintRule stands between it and the node's devices.
    template(e2e, "gpu-operator", f"one-gpu-{group}")
    other = claim_pod(e2e, "gpu-operator", f"other-{group}", group, f"one-gpu-{group}")
    assert other["spec"]["schedulerName"] == "default-scheduler"

    # gpu-placement's pod: the node's label keeps it out (NodeAffinity filters before DynamicResources); the
    # other scheduler's pod: the allocator refuses the tainted devices.
    for namespace, name, why in ((ns, "train", AFFINITY), ("gpu-operator", f"other-{group}",
                                                         "cannot allocate all claims")):
        e2e.unschedulable_message(namespace, name, why)
        assert allocation(e2e, namespace, name) == []

    e2e.kubelets.set_pod_ready("gpu-operator", f"nvidia-operator-validator-{node}", True)
    wait_rule(e2e, node, None)
    e2e.wait_refused({node: None})
    for namespace, name in ((ns, "train"), ("gpu-operator", f"other-{group}")):
        assert e2e.wait_bound(namespace, name, timeout=60) == node
        [device] = allocation(e2e, namespace, name)
        assert (device["driver"], device["pool"]) == ("gpu.nvidia.com", node)
    assert wait_for("the pod Running (claim allocated and reserved for it)",
                    lambda: e2e.pod(ns, "train")["status"].get("phase") == "Running")


def test_a_dra_validator_waiting_through_a_webhook_restart_keeps_its_node_untainted(
        e2e: E2E, plugin: DraPlugin) -> None:
    """Review finding 2 on the real control plane: a GPU Operator DRA validator pod already pending when a
    webhook replica starts holds its node's rule back in the new process too (the controller reads the
    waiting validators from the view, not only from pod events after it subscribed). A rule there would
    keep the validator from its device for good: the node would never be verified."""
    group = "s19-restart"
    waiting, control = e2e.nodes(group, [(suffix, "h100", {"allocatable": {}, "validator_ready": None})
                                         for suffix in ("waiting", "control")])
    for name in (waiting, control):
        plugin.publish(name, 2)
        wait_rule(e2e, name, "NotValidated")  # no validator at all yet
    template(e2e, "gpu-operator", f"validation-{group}")
    pod = validator_pod(waiting, ready=False)  # as the operator's DaemonSet makes it: pinned, not bound yet
    pod["metadata"] = {"name": f"nvidia-dra-validator-{waiting}", "namespace": "gpu-operator",
                       "labels": pod["metadata"]["labels"]}
    pod.pop("status", None)
    spec = pod["spec"]
    del spec["nodeName"]
    spec.update(schedulerName="e2e-held-back",  # no scheduler runs it: it stays pending through the restart
                tolerations=[{"operator": "Exists"}],
                affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [waiting]}]}]}}},
                resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": f"validation-{group}"}])
    spec["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    r = e2e.api.create("/api/v1/namespaces/gpu-operator/pods", pod)
    assert r.status_code == 201, r.text
    try:
        wait_rule(e2e, waiting, None)  # held back while the validator waits for a device
        e2e.restart_webhooks()  # a fresh process: its view lists the pending validator before the controller
        e2e.kubelets.add_validator(control, ready=True)
        wait_rule(e2e, control, None)  # the new replica's controller leads and has made its passes
        assert rule(e2e, waiting) is None, "the restarted controller tainted a node whose validator waits"
    finally:
        e2e.api.http.delete(f"/api/v1/namespaces/gpu-operator/pods/{pod['metadata']['name']}")


def test_the_webhook_reads_a_template_its_view_lacks_with_its_own_credentials(e2e: E2E, plugin: DraPlugin) -> None:
    """A template applied together with its pod may reach the webhook's watch after the pod's admission
    (tests/test_webhook_claim_reader.py plays that race); the reader that then GETs it works against the
    real API server with the chart's ServiceAccount (RBAC `get`, the served version's path), and a name
    the API server does not have is told with its answer."""
    ns = e2e.namespace("dra-reader")
    template(e2e, ns, "one-gpu")
    view = ClusterView(Config())
    Ingest(view.config).replace(view, "deviceclasses", device_classes())  # DRA served; no template in the view
    api = load_api_client(str(e2e.webhooks[0].kubeconfig))
    try:
        reader = ClaimReader(view, api, "v1")
        spec = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
                                   {"name": "other", "resourceClaimTemplateName": "not-there"}]}
        wanted = reader.wanted(ns, spec)
        assert [name for _, _, name in wanted] == ["one-gpu", "not-there"]
        asyncio.run(reader.read(wanted))
        found = reader.pod_claims(ns, spec)
        assert found.classes == ("gpu.nvidia.com",)
        assert found.missing == (
            f"ResourceClaimTemplate {ns}/not-there, which is not in gpu-placement's view yet and could not be read "
            f"from the API server (the API server answered HTTP 404 NotFound: resourceclaimtemplates.resource.k8s.io "
            f'"not-there" not found)')
    finally:
        api.close()


def test_the_extender_judges_dra_pods_where_the_taint_only_reports(e2e: E2E, plugin: DraPlugin) -> None:
    """taintEffect None, a dry run: the rule is written but the allocator ignores it; the extender still
    keeps the gpu-placement pod off the unverified node, while the other scheduler's pod lands there."""
    e2e.upgrade({"config": {"dra": {"taintEffect": "None"}}})
    try:
        group = "s19-dry-run"
        [bad, good] = dra_nodes(e2e, plugin, group, [("bad", False, {}), ("good", True, {})])
        wait_rule(e2e, bad, "NotValidated", effect="None")
        e2e.wait_refused({bad: "NotValidated", good: None})
        assert rule(e2e, good) is None
        ns = e2e.namespace("dra-dry")
        template(e2e, ns)
        for i in range(2):
            claim_pod(e2e, ns, f"p{i}", group)
            assert e2e.wait_bound(ns, f"p{i}", timeout=60) == good  # never `bad`: its label says NotValidated
        template(e2e, "gpu-operator", f"one-gpu-{group}")
        claim_pod(e2e, "gpu-operator", f"other-{group}", group, f"one-gpu-{group}")
        e2e.api.merge_patch(f"/api/v1/nodes/{good}", {"metadata": {"labels": {"e2e-group": "s19-parked"}}})
        assert e2e.wait_bound("gpu-operator", f"other-{group}", timeout=60) == bad  # None only reports
    finally:
        e2e.upgrade({})


def test_a_driver_upgrade_taints_and_untaints(e2e: E2E, plugin: DraPlugin) -> None:
    group = "s19-upgrade"
    [node] = dra_nodes(e2e, plugin, group, [("a", True, {})])
    assert rule(e2e, node) is None
    path = f"/api/v1/nodes/{node}"
    e2e.api.merge_patch(path, {"metadata": {"labels": {"nvidia.com/gpu-driver-upgrade-state": "drain-required"}}})
    wait_rule(e2e, node, "DriverUpgrade")
    e2e.wait_refused({node: "DriverUpgrade"})
    ns = e2e.namespace("dra-upgrade")
    template(e2e, ns)
    claim_pod(e2e, ns, "waits", group)
    e2e.unschedulable_message(ns, "waits", AFFINITY)  # the label, before the allocator meets the rule
    e2e.api.merge_patch(path, {"metadata": {"labels": {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}}})
    wait_rule(e2e, node, None)
    e2e.wait_refused({node: None})
    assert e2e.wait_bound(ns, "waits", timeout=60) == node


def test_nvidia_gpu_served_by_dra_still_goes_through_the_extender(e2e: E2E, plugin: DraPlugin) -> None:
    """DRAExtendedResource: gpu.nvidia.com names extendedResourceName nvidia.com/gpu, so a pod asking for
    nvidia.com/gpu on nodes without that resource gets a device of the class; it reaches the extender
    (it names a GPU resource; the profile has no managedResources anyway) and gets the node rules."""
    e2e.upgrade({"config": {"dra": {"taintEffect": "None"}}})  # so that only the extender can say no
    try:
        group = "s19-extended"
        [node] = dra_nodes(e2e, plugin, group, [("a", False, {})])
        e2e.wait_refused({node: "NotValidated"})  # a DRA-only node is a GPU node: labelled too
        ns = e2e.namespace("dra-extended")
        assert e2e.gpu_pod(ns, "classic", group).status_code == 201
        e2e.unschedulable_message(ns, "classic", AFFINITY)
        # The extender's own verdict for the pod on that node: it judges it (interested: a GPU resource).
        answer = httpx.post(f"{e2e.extender_url()}/filter", timeout=10, content=json.dumps(
            {"Pod": e2e.pod(ns, "classic"), "Nodes": None, "NodeNames": [node]})).json()
        assert answer["FailedAndUnresolvableNodes"][node].startswith("NotValidated: "), answer
        e2e.kubelets.set_pod_ready("gpu-operator", f"nvidia-operator-validator-{node}", True)
        # kube-scheduler retries the pod at once on the validator's update, often before the extender's
        # watch has it; answered NotValidated then, the pod would wait for the next event it listens to
        # (one run of `make e2e` in two: over 60 s). The extender waits for its view (extender/settle.py).
        assert e2e.wait_bound_once_verified(ns, "classic", node, timeout=15) == node
        [device] = allocation(e2e, ns, "classic")
        assert device["pool"] == node
    finally:
        e2e.upgrade({})


# -- issue 31: DRA as Kubernetes 1.37 ships it ---------------------------------------------------------------

IMPLICIT = "deviceclass.resource.kubernetes.io/gpu.nvidia.com"


def test_an_unchanged_nvidia_gpu_pod_lands_on_the_verified_dra_node_and_never_on_the_unverified_one(
        e2e: E2E, plugin: DraPlugin) -> None:
    """KEP-5004: gpu.nvidia.com names extendedResourceName nvidia.com/gpu (DraPlugin installs NVIDIA's classes),
    so a pod written the usual way is served by a DRA device of a node without the resource in its
    allocatable; kube-scheduler makes its claim. The webhook shapes it as any GPU pod but without the
    nvidia.com/gpu.present selector; the DeviceTaintRule and the extender keep it off the unverified node.
    The class's implicit name goes the same way."""
    group = "s19-kep5004"
    verified, unverified = dra_nodes(e2e, plugin, group, [("ok", True, {}), ("bad", False, {})])
    wait_rule(e2e, unverified, "NotValidated")
    e2e.wait_refused({unverified: "NotValidated", verified: None})
    ns = e2e.namespace("dra-kep5004")
    for name, resource in (("classic", "nvidia.com/gpu"), ("implicit", IMPLICIT)):
        r = e2e.gpu_pod(ns, name, group, resource=resource)
        assert r.status_code == 201, r.text
        spec = r.json()["spec"]
        assert spec["containers"][0]["resources"]["limits"][resource] == "1" and "resourceClaims" not in spec
        assert spec["schedulerName"] == "gpu-placement"
        assert "nvidia.com/gpu.present" not in (spec.get("nodeSelector") or {})
        assert e2e.wait_bound(ns, name, timeout=60) == verified
        [device] = allocation(e2e, ns, name)
        assert (device["driver"], device["pool"]) == ("gpu.nvidia.com", verified)
    # Both of the verified node's devices are taken now; the unverified node's two are free, and stay so.
    assert e2e.gpu_pod(ns, "third", group).status_code == 201
    message = e2e.unschedulable_message(ns, "third", "cannot allocate all claims")  # the verified node, full
    assert AFFINITY in message, message  # the unverified one, kept out by its label
    assert not e2e.pod(ns, "third")["spec"].get("nodeName")


def test_a_monitor_pod_is_untouched_and_uncharged(e2e: E2E, plugin: DraPlugin) -> None:
    """KEP-5018: a DCGM-like pod whose claim has adminAccess (all the node's GPUs), in a namespace labelled
    resource.kubernetes.io/admin-access=true that also has a GPU quota: /mutate leaves it as it is (on main
    it moved it to the gpu-placement scheduler), the API server's charge for its claim (32 devices: All is
    the worst case) gets room of its own in the mirrored quota, and the namespace's own pod still gets its
    one GPU, on a device the monitor shares."""
    group = "s19-monitor"
    [node] = dra_nodes(e2e, plugin, group, [("a", True, {})])
    ns = e2e.namespace("dra-monitor", {"gpu-placement.io/allocation": "dra",
                                       "gpu-placement.io/quota": "nvidia.com/gpu=1"})
    e2e.api.merge_patch(f"/api/v1/namespaces/{ns}",
                        {"metadata": {"labels": {"resource.kubernetes.io/admin-access": "true"}}})
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "monitor", "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True}}]}}}}
    r = e2e.api.create(f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", body)
    assert r.status_code == 201, r.text
    pod = claim_pod(e2e, ns, "dcgm", group, "monitor")
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert "gpu-placement.io/admitted" not in (pod["metadata"].get("annotations") or {})
    assert all(t.get("key") != "nvidia.com/gpu" for t in pod["spec"].get("tolerations") or ())
    assert e2e.wait_bound(ns, "dcgm", timeout=60) == node
    assert {d["device"] for d in allocation(e2e, ns, "dcgm")} == {"gpu-0", "gpu-1"}
    quota = f"/api/v1/namespaces/{ns}/resourcequotas/gpu-placement"
    wait_for("room for the monitor's claim in the mirrored quota",
             lambda: e2e.api.get(quota).get("status", {}).get("hard", {}).get("requests.nvidia.com/gpu") == "33",
             timeout=30)
    # The webhook's gate admits once the quota controller has counted every resource of the new quota in
    # status.used (QuotaPending until then; a loaded machine took longer than the hard above): gpu_pod
    # retries the 503, as a client does.
    r = e2e.gpu_pod(ns, "tenant", group)
    assert r.status_code == 201, r.text
    assert e2e.wait_bound(ns, "tenant", timeout=60) == node
    used = e2e.api.get(quota)["status"]["used"]
    assert used["requests.nvidia.com/gpu"] == "33", used  # the monitor's 32 and the tenant's 1: the quota's 1 is whole


def test_a_device_its_pod_reports_unhealthy_is_tainted_alone(e2e: E2E, plugin: DraPlugin) -> None:
    """KEP-4680: the kubelet reports the pod's device Unhealthy in allocatedResourcesStatus (the harness plays
    the kubelet; resourceID in its form without a CDI device: <driver>/<pool>/<device>). The webhook's
    leader taints that device alone, DeviceUnhealthy; the node's other device stays free for others."""
    group = "s19-health"
    [node] = dra_nodes(e2e, plugin, group, [("a", True, {})])
    ns = e2e.namespace("dra-health")
    template(e2e, ns)
    claim_pod(e2e, ns, "sick", group)
    assert e2e.wait_bound(ns, "sick", timeout=60) == node
    [device] = allocation(e2e, ns, "sick")
    wait_for("the pod Running", lambda: e2e.pod(ns, "sick")["status"].get("phase") == "Running")
    status = {"containerStatuses": [{
        "name": "main", "ready": True, "restartCount": 0, "image": "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04",
        "imageID": "", "state": {"running": {"startedAt": now_rfc3339()}},
        "allocatedResourcesStatus": [{"name": "claim:gpu", "resources": [
            {"resourceID": f"gpu.nvidia.com/{node}/{device['device']}", "health": "Unhealthy",
             "message": "XID 79: GPU has fallen off the bus"}]}]}]}
    e2e.api.merge_patch(f"/api/v1/namespaces/{ns}/pods/sick/status", {"status": status})
    name = f"gpu-placement-{node}-{device['device']}"
    def written() -> Obj | None:
        r = e2e.api.http.get(f"{RESOURCE}/devicetaintrules/{name}")
        return dict(r.json()) if r.status_code == 200 else None
    found = wait_for(f"DeviceTaintRule {name}", written, timeout=30)
    assert found["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": node, "device": device["device"]}
    assert found["spec"]["taint"]["value"] == "DeviceUnhealthy"
    assert "XID 79: GPU has fallen off the bus" in found["metadata"]["annotations"]["gpu-placement.io/reason"]
    assert rule(e2e, node) is None  # the node stays verified: only that device is kept out
    e2e.api.delete(f"/api/v1/namespaces/{ns}/pods/sick")
    wait_for(f"DeviceTaintRule {name} gone once no pod reports it",
             lambda: e2e.api.http.get(f"{RESOURCE}/devicetaintrules/{name}").status_code == 404, timeout=60)


def _nodes_json(e2e: E2E, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Obj]:
    """`gpu-placement nodes -o json` as a platform engineer runs it, through a kubeconfig: per node."""
    kubeconfig = e2e.api.kubeconfig(tmp_path / "admin.kubeconfig", ADMIN_TOKEN, "e2e-admin")
    capsys.readouterr()
    assert main(["nodes", "--kubeconfig", str(kubeconfig), "-o", "json"]) == 0
    return {r["node"]: r for r in json.loads(capsys.readouterr().out)["nodes"]}


def test_a_node_serving_nvidia_gpu_both_ways_gives_it_from_the_device_plugin_alone(
        e2e: E2E, plugin: DraPlugin, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A node whose allocatable has nvidia.com/gpu: 1 (the device plugin) and whose ResourceSlice publishes 2
    devices of gpu.nvidia.com (the class naming nvidia.com/gpu): kube-scheduler serves nvidia.com/gpu there from
    the device plugin alone (no claim made), and with that one unit taken a second such pod does not fit, DRA
    devices free or not (extendeddynamicresources.go filterExtendedResources: DRA only where allocatable is 0).
    The class's implicit name takes a DRA device there. `gpu-placement nodes` says it serves it both ways."""
    group = "s19-both"
    [node] = e2e.nodes(group, [("a", "h100", {"allocatable": {"nvidia.com/gpu": "1"}})])
    plugin.publish(node, 2)
    ns = e2e.namespace("dra-both")
    assert e2e.gpu_pod(ns, "plugin", group).status_code == 201
    assert e2e.wait_bound(ns, "plugin", timeout=60) == node
    assert not e2e.pod(ns, "plugin").get("status", {}).get("extendedResourceClaimStatus")  # no claim: the plugin's
    assert e2e.gpu_pod(ns, "more", group).status_code == 201
    cond = e2e.scheduled_condition(ns, "more", timeout=60)
    assert "Insufficient nvidia.com/gpu" in cond["message"], cond
    assert not allocation(e2e, ns, "more") and not e2e.pod(ns, "more")["spec"].get("nodeName")
    r = e2e.gpu_pod(ns, "implicit", group, resource=IMPLICIT)
    assert r.status_code == 201, r.text
    assert e2e.wait_bound(ns, "implicit", timeout=60) == node
    [device] = allocation(e2e, ns, "implicit")
    assert (device["driver"], device["pool"]) == ("gpu.nvidia.com", node)
    record = _nodes_json(e2e, tmp_path, capsys)[node]
    assert record["served"]["nvidia.com/gpu"] == "device-plugin" and record["served"][IMPLICIT] == "dra"
    assert record["both_ways"] == ["nvidia.com/gpu"]
    assert not e2e.pod(ns, "more")["spec"].get("nodeName")  # still: the free DRA device does not serve it


def test_a_claim_pod_does_not_preempt_for_devices(e2e: E2E, plugin: DraPlugin) -> None:
    """kube-scheduler 1.37 does not preempt for DRA devices (its DynamicResources plugin has no
    PreFilterExtensions and refuses the node as UnschedulableAndUnresolvable): a high-priority claim pod whose
    device a low-priority claim pod holds stays Pending, nominated nowhere, and the holder keeps running. The
    extender refuses such a node as unresolvable too, so nothing asks /preempt to free a device."""
    group = "s19-preempt"
    for name, value in (("s19-low", 10), ("s19-high", 1000000)):
        r = e2e.api.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value})
        assert r.status_code in (201, 409), r.text
    [node] = e2e.nodes(group, [("a", "h100", {"allocatable": {}})])
    plugin.publish(node, 1)
    ns = e2e.namespace("dra-preempt")
    template(e2e, ns)
    for name, priority in (("low", "s19-low"), ("high", "s19-high")):
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
               "spec": {"nodeSelector": {"e2e-group": group}, "restartPolicy": "Never", "priorityClassName": priority,
                        "terminationGracePeriodSeconds": 0,
                        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                        "containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04",
                                        "resources": {"claims": [{"name": "gpu"}],
                                                      "requests": {"cpu": "100m", "memory": "128Mi"}}}]}}
        r = e2e.api.create(f"/api/v1/namespaces/{ns}/pods", pod)
        assert r.status_code == 201, r.text
        if name == "low":
            assert e2e.wait_bound(ns, "low", timeout=60) == node
            wait_for("the holder Running", lambda: e2e.pod(ns, "low")["status"].get("phase") == "Running", timeout=30)
    cond = e2e.scheduled_condition(ns, "high", timeout=60)  # written after kube-scheduler's PostFilter (preemption)
    assert "cannot allocate all claims" in cond["message"], cond
    high, low = e2e.pod(ns, "high"), e2e.pod(ns, "low")
    assert not high["status"].get("nominatedNodeName"), high["status"]
    assert not low["metadata"].get("deletionTimestamp") and low["spec"]["nodeName"] == node
    assert not any(c.get("type") == "DisruptionTarget" for c in low["status"].get("conditions", ())), low["status"]


def test_claims_competing_for_the_big_gpu_land_where_the_allocator_finds_room(e2e: E2E, plugin: DraPlugin) -> None:
    """A pod asks any GPU and one of 70 GiB or more, on a node with an 80 GB and a 40 GB GPU. First fit
    gives the first request the 80 GB and leaves the second nothing; kube-scheduler's allocator goes back
    and gives the first the 40 GB. The extender agrees (decide/dra_fit.py searches as the allocator
    does): the pod is bound there, each request with the device the allocator chose."""
    from gpu_placement.samples.dra import Gpu, resource_slice

    group = "s19-compete"
    [node] = dra_nodes(e2e, plugin, group, [("a", True, {})])
    mixed = resource_slice(node, 2)
    small = resource_slice(node, 1, Gpu(product="NVIDIA A100-SXM4-40GB", memory_bytes=42_949_672_960))
    mixed["spec"]["devices"][1] = {**small["spec"]["devices"][0], "name": "gpu-1"}
    mixed["spec"]["pool"]["generation"] = 2
    e2e.api.apply(mixed, manager="gpu-kubelet-plugin")
    ns = e2e.namespace("dra")
    big = "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('70Gi')) >= 0"
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "two-gpus", "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "any", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                {"name": "big", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                            "selectors": [{"cel": {"expression": big}}]}}]}}}}
    r = e2e.api.create(f"{RESOURCE}/namespaces/{ns}/resourceclaimtemplates", body)
    assert r.status_code == 201, r.text
    claim_pod(e2e, ns, "pair", group, "two-gpus")
    assert e2e.wait_bound(ns, "pair", timeout=60) == node
    given = {device["request"]: device["device"] for device in allocation(e2e, ns, "pair")}
    assert given == {"any": "gpu-1", "big": "gpu-0"}
