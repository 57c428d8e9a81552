"""Scenario 6: node health flips reach scheduling within a second, through the real watch: the
validator pod goes not Ready, a driver upgrade starts, MIG is being reconfigured, the kubelet stops
posting Ready. Then: a deleted pod frees its GPU memory and a waiting pod lands; a pod waiting for its
node's validator (kept out by the node's gpu-placement.io/refused label, explain giving the reason) binds once
it is Ready. All of it with pods that never fit waiting beside (`backlog`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from gpu_placement.decide.kubefilters import AFFINITY
from tests.e2e.conftest import E2E, gpu_pod_manifest

CUDA11 = "nvcr.io/nvidia/cuda:11.6.2-runtime-ubuntu20.04"  # the T4 fixture's driver is 510.73.08


@pytest.fixture(scope="module", autouse=True)
def backlog(e2e: E2E) -> Iterator[None]:
    """Pods that never fit, waiting through the whole file, as a busy cluster has them and as `make e2e`'s
    earlier scenarios leave theirs: kube-scheduler retries each on every event (twice a second while
    the flips run), and a round of retries may wait for the extender's view. On a T4 whose memory one
    pod holds, four wait for memory and four ask more than a T4 has; four wait for an H100 whose
    validator never turns Ready (kept out by its gpu-placement.io/refused label: kube-scheduler does not send
    it to the extender). Before the settle budget kept its last waits for answers that are new,
    they spent it (330 to 375 waits denied a run), and a pod retried on the deletion or the validator's
    Ready it waited for, before the extender's watch had it, was answered without a wait and parked
    (the second or third test failed in 2 runs of 5)."""
    group = "s6-backlog"
    e2e.nodes(group, [("t4", "t4-timeslicing", {"shared_resource": "nvidia.com/gpu.shared",
                                              "labels": {"nvidia.com/gpu.sharing-strategy": "time-slicing"}}),
                      ("h100", "h100", {"validator_ready": False})])
    e2e.wait_refused({f"{group}-h100": "NotValidated", f"{group}-t4": None})
    shared = e2e.namespace("backlog", {"gpu-placement.io/sharing": "shared", "gpu-placement.io/gpu-memory": "12Gi"})
    exclusive = e2e.namespace("backlog-x")
    assert e2e.gpu_pod(shared, "holder", group, image=CUDA11).status_code == 201
    assert e2e.wait_bound(shared, "holder") == f"{group}-t4"
    for i in range(4):
        assert e2e.gpu_pod(shared, f"starved-{i}", group, image=CUDA11).status_code == 201
        assert e2e.gpu_pod(shared, f"big-{i}", group, image=CUDA11,
                           annotations={"gpu-placement.io/gpu-memory": "40Gi"}).status_code == 201
        assert e2e.gpu_pod(exclusive, f"unverified-{i}", group).status_code == 201
    for ns, name, reason in ((shared, "starved-3", "InsufficientGPUMemory"), (shared, "big-3", "InsufficientGPUMemory"),
                             (exclusive, "unverified-3", AFFINITY)):
        e2e.unschedulable_message(ns, name, reason)
    yield
    for ns in (shared, exclusive):
        e2e.api.delete(f"/api/v1/namespaces/{ns}")


def test_new_pods_avoid_a_node_within_a_second_of_its_health_flipping(e2e: E2E) -> None:
    """Independent of the scoring strategy: a new pod lands on the other node and the extender's /filter
    turns the flipped one away; once the node is restored, a pod pinned to it binds."""
    group = "s6"
    a, b = e2e.nodes(group, [(slot, "h100x8", {"labels": {"e2e-slot": slot}}) for slot in ("a", "b")])
    ns = e2e.namespace("health")
    node_path = f"/api/v1/nodes/{a}"

    def label(key: str, value: str | None) -> Callable[[], None]:
        return lambda: e2e.api.merge_patch(node_path, {"metadata": {"labels": {key: value}}}) and None

    def pod(name: str, pinned: bool) -> None:
        manifest = gpu_pod_manifest(ns, name, group)
        if pinned:
            manifest["spec"]["nodeSelector"]["e2e-slot"] = "a"
        assert e2e.api.create(f"/api/v1/namespaces/{ns}/pods", manifest).status_code == 201

    flips: list[tuple[str, Callable[[], None], Callable[[], None]]] = [
        ("validator not Ready", lambda: e2e.kubelets.set_pod_ready("gpu-operator", f"nvidia-operator-validator-{a}",
                                                                   False),
         lambda: e2e.kubelets.set_pod_ready("gpu-operator", f"nvidia-operator-validator-{a}", True)),
        ("driver upgrade", label("nvidia.com/gpu-driver-upgrade-state", "drain-required"),
         label("nvidia.com/gpu-driver-upgrade-state", None)),
        ("MIG reconfiguring", label("nvidia.com/mig.config.state", "pending"),
         label("nvidia.com/mig.config.state", "success")),
        ("NotReady", lambda: e2e.kubelets.set_ready(a, False), lambda: e2e.kubelets.set_ready(a, True)),
    ]
    for i, (what, flip, restore) in enumerate(flips):
        flip()
        time.sleep(1.0)
        pod(f"during-{i}", pinned=False)
        landed = e2e.wait_bound(ns, f"during-{i}")
        assert landed == b, f"{what}: a new pod went to {landed}, the flipped node"
        answer = httpx.post(f"{e2e.extender_url()}/filter", timeout=10, content=json.dumps(
            {"Pod": e2e.pod(ns, f"during-{i}"), "Nodes": None, "NodeNames": [a]})).json()
        assert a not in (answer.get("NodeNames") or []), f"{what}: the extender passes the flipped node: {answer}"
        assert e2e.api.delete(f"/api/v1/namespaces/{ns}/pods/during-{i}").status_code == 200
        restore()
        if what == "NotReady":
            e2e.kubelets.wait_schedulable([a])
        time.sleep(1.0)
        pod(f"after-{i}", pinned=True)
        assert e2e.wait_bound(ns, f"after-{i}") == a, f"{what}: the node did not come back"


def test_a_deleted_pod_frees_its_memory_and_a_waiting_pod_lands(e2e: E2E) -> None:
    group = "s6-memory"
    [t4] = e2e.nodes(group, [("t4", "t4-timeslicing", {"shared_resource": "nvidia.com/gpu.shared",
                                                     "labels": {"nvidia.com/gpu.sharing-strategy": "time-slicing"}})])
    # A T4 has 15 GiB; two pods of 10 GiB each do not fit together, though 8 time-slices are free.
    ns = e2e.namespace("memory", {"gpu-placement.io/sharing": "shared", "gpu-placement.io/gpu-memory": "10Gi"})
    assert e2e.gpu_pod(ns, "first", group, image=CUDA11).status_code == 201
    assert e2e.wait_bound(ns, "first") == t4
    assert e2e.gpu_pod(ns, "second", group, image=CUDA11).status_code == 201
    cond = e2e.scheduled_condition(ns, "second")
    assert "InsufficientGPUMemory" in cond["message"], cond
    assert e2e.api.delete(f"/api/v1/namespaces/{ns}/pods/first").status_code == 200
    assert e2e.wait_bound(ns, "second", timeout=30) == t4


def test_a_pod_waiting_for_its_only_node_binds_once_the_validator_is_ready(e2e: E2E) -> None:
    """The device plugin's side of scenario 19's extended-resource test: kube-scheduler retries the pod
    on the validator's update within a millisecond or two, maybe before the extender's watch has it."""
    group = "s6-verify"
    [node] = e2e.nodes(group, [("a", "h100", {"validator_ready": False})])
    ns = e2e.namespace("verify")
    e2e.wait_refused({node: "NotValidated"})
    assert e2e.gpu_pod(ns, "waits", group).status_code == 201
    # kube-scheduler keeps the labelled node out itself (config.refusedNodeLabel); explain says why
    e2e.unschedulable_message(ns, "waits", AFFINITY)
    [row] = [row for row in e2e.explain(ns, "waits")["nodes"] if row["node"] == node]
    assert row["figures"].startswith("gpu-placement.io/refused=NotValidated, gpu-placement's reason: NotValidated: "
                                     "the nvidia-operator-validator pod on the node is not Ready"), row
    e2e.kubelets.set_pod_ready("gpu-operator", f"nvidia-operator-validator-{node}", True)
    # the label goes with the leader's next patch, and NodeAffinity's queueing hint requeues the pod on it
    assert e2e.wait_bound_once_verified(ns, "waits", node, timeout=15) == node
    assert e2e.refused_label(node) is None
