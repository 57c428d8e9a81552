"""Pods' GPU asks, the cluster view's accounting, and the placement cache staying equal to a fresh one."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.base.config import Config, Validator
from gpu_placement.decide.placement import Placement
from gpu_placement.facts.pods import effective_gpu_requests, pod_from_json
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView, Telemetry
from gpu_placement.view.ingest import Ingest

CONFIG = Config()
GPU = "nvidia.com/gpu"
H100 = 81559  # MiB per device, from the published H100 label set
T4 = 15360  # MiB per device, from the published T4 label set (bytes in the label)


def _c(name: str, limits: dict[str, str] | None = None, requests: dict[str, str] | None = None,
       restart: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "busybox", "resources": {}}
    if limits is not None:
        container["resources"]["limits"] = limits
    if requests is not None:
        container["resources"]["requests"] = requests
    if restart is not None:
        container["restartPolicy"] = restart
    return container


def _eff(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None) -> dict[str, int]:
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    return dict(effective_gpu_requests(spec, CONFIG.is_gpu_resource))


# -- Kubernetes' effective request rule --------------------------------------------------------
def test_app_containers_add_up() -> None:
    assert _eff([_c("a", {GPU: "1"}), _c("b", {GPU: "2"})]) == {GPU: 3}


def test_init_container_peak_versus_app_sum() -> None:
    app = [_c("a", {GPU: "1"}), _c("b", {GPU: "1"})]
    assert _eff(app, [_c("init", {GPU: "3"})]) == {GPU: 3}  # the init container needs more while it runs
    assert _eff(app, [_c("init", {GPU: "1"})]) == {GPU: 2}  # the app containers need more together
    assert _eff(app, [_c("i1", {GPU: "2"}), _c("i2", {GPU: "4"})]) == {GPU: 4}  # init containers run one by one


def test_sidecar_init_containers_run_beside_the_app() -> None:
    sidecar = _c("proxy", {GPU: "1"}, restart="Always")
    assert _eff([_c("app", {GPU: "1"})], [sidecar]) == {GPU: 2}
    # a regular init container after the sidecar runs beside it: 1 + 2
    assert _eff([_c("app", {GPU: "1"})], [sidecar, _c("load", {GPU: "2"})]) == {GPU: 3}
    # before it, it runs alone: max(2, 1 + 1)
    assert _eff([_c("app", {GPU: "1"})], [_c("load", {GPU: "2"}), sidecar]) == {GPU: 2}


def test_extended_resources_given_as_limits_only() -> None:
    assert _eff([_c("a", limits={GPU: "2"})]) == {GPU: 2}
    assert _eff([_c("a", limits={GPU: "2"}, requests={GPU: "2"})]) == {GPU: 2}  # not counted twice
    assert _eff([_c("a", requests={GPU: "1"})]) == {GPU: 1}


def test_only_gpu_resources_and_nonzero_counts() -> None:
    asks = _eff([_c("a", {"cpu": "4", "memory": "16Gi", "nvidia.com/mig-1g.10gb": "2", "nvidia.com/gpu.shared": "1",
                          "example.com/fpga": "1", GPU: "0"})])
    assert asks == {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/gpu.shared": 1}
    assert _eff([_c("a")]) == {} and _eff([]) == {}


def test_pod_record() -> None:
    ingest = Ingest(CONFIG)
    pod = ingest.pod(make_pod("ml", "train", gpus={GPU: 2}, node="gpu-1", annotations={
        "gpu-placement.io/gpu-memory": "20Gi"}))
    assert (pod.key, pod.node, pod.active, pod.gpus) == ("ml/train", "gpu-1", True, ((GPU, 2),))
    assert pod.memory_annotation == "20Gi" and pod.validator_ready is None
    assert not ingest.pod(make_pod("ml", "done", gpus={GPU: 1}, node="gpu-1", phase="Succeeded")).active
    assert not ingest.pod(make_pod("ml", "oom", gpus={GPU: 1}, node="gpu-1", phase="Failed")).active
    bare = pod_from_json({"metadata": {"name": "x"}}, CONFIG.is_gpu_resource, lambda ns, labels: False)
    assert (bare.namespace, bare.node, bare.active, bare.gpus) == ("default", None, True, ())


# -- view accounting ---------------------------------------------------------------------------
class Cluster:
    """A view fed the way a source feeds it, with an injected clock."""

    def __init__(self, config: Config = CONFIG) -> None:
        self.now = 1000.0
        self.config = config
        self.view = ClusterView(config, clock=lambda: self.now)
        self.ingest = Ingest(config)
        self.placement = Placement(self.view, config)

    def node(self, name: str, base: str | None, **kwargs: Any) -> None:
        self.view.upsert_node(self.ingest.node(make_node(name, base, **kwargs)))

    def pod(self, ns: str, name: str, **kwargs: Any) -> None:
        self.view.upsert_pod(self.ingest.pod(make_pod(ns, name, **kwargs)))

    def validator(self, node: str, ready: bool = True) -> None:
        self.view.upsert_pod(self.ingest.pod(validator_pod(node, ready)))

    def free(self, node: str, resource: str = GPU) -> tuple[int, int | None]:
        return self.view.free_units[resource][node], self.view.free_mib[resource][node]

    def verdict(self, node: str, **pod: Any) -> str:
        spec = make_pod("ml", "candidate", image="busybox", **pod)
        result = self.placement.filter(self.placement.requirements(spec), [node])
        return "pass" if result.passed else {**result.failed, **result.unresolvable}[node]


@pytest.fixture
def cluster() -> Cluster:
    c = Cluster()
    c.node("h8", "h100x8")
    c.node("t4", "t4-timeslicing")
    c.node("mig", "h100-mig-mixed")
    for name in ("h8", "t4", "mig"):
        c.validator(name)
    return c


def test_free_after_pods_bound(cluster: Cluster) -> None:
    assert cluster.free("h8") == (8, 8 * H100)
    cluster.pod("ml", "train", gpus={GPU: 2}, node="h8")
    assert cluster.free("h8") == (6, 6 * H100)  # a whole GPU is held whole
    cluster.pod("web", "embed", gpus={GPU: 1}, node="t4", annotations={"gpu-placement.io/gpu-memory": "4Gi"})
    cluster.pod("web", "chat", gpus={GPU: 1}, node="t4")
    assert cluster.free("t4") == (6, T4 - 4096 - T4 // 8)  # a share holds its ask, else one replica's memory
    cluster.pod("lab", "nb", gpus={"nvidia.com/mig-1g.10gb": 1}, node="mig")
    assert cluster.free("mig", "nvidia.com/mig-1g.10gb") == (1, 9984)
    assert cluster.free("mig", "nvidia.com/mig-3g.40gb") == (1, 40320)


def test_pending_and_terminal_pods_hold_nothing(cluster: Cluster) -> None:
    cluster.pod("ml", "waiting", gpus={GPU: 4})  # not bound yet
    cluster.pod("ml", "done", gpus={GPU: 4}, node="h8", phase="Succeeded")
    cluster.pod("ml", "crashed", gpus={GPU: 2}, node="h8", phase="Failed")
    assert cluster.free("h8") == (8, 8 * H100)
    cluster.pod("ml", "run", gpus={GPU: 3}, node="h8")
    assert cluster.free("h8") == (5, 5 * H100)
    cluster.pod("ml", "run", gpus={GPU: 3}, node="h8", phase="Succeeded")  # it finished
    assert cluster.free("h8") == (8, 8 * H100)


def test_pod_moved_and_deleted(cluster: Cluster) -> None:
    cluster.node("h8b", "h100x8")
    cluster.pod("ml", "p", gpus={GPU: 2}, node="h8")
    cluster.pod("ml", "p", gpus={GPU: 2}, node="h8b")  # deleted and recreated elsewhere under the same name
    assert cluster.free("h8") == (8, 8 * H100) and cluster.free("h8b") == (6, 6 * H100)
    cluster.view.delete_pod("ml/p")
    assert cluster.free("h8b") == (8, 8 * H100)
    cluster.view.delete_pod("ml/never-seen")  # harmless


def test_relabelled_node_changes_what_its_pods_hold(cluster: Cluster) -> None:
    cluster.pod("web", "chat", gpus={GPU: 1}, node="t4")  # holds one replica's memory
    cluster.pod("web", "embed", gpus={GPU: 1}, node="t4", annotations={"gpu-placement.io/gpu-memory": "4Gi"})
    assert cluster.free("t4") == (6, T4 - T4 // 8 - 4096)
    cluster.node("t4", "t4-timeslicing", labels={"nvidia.com/gpu.replicas": "4"})  # 4 replicas now: 4 units
    assert cluster.free("t4") == (2, T4 - T4 // 4 - 4096)
    cluster.pod("ml", "train", gpus={GPU: 1}, node="h8")
    cluster.node("h8", "h100x8", labels={"nvidia.com/gpu.memory": "40960"})
    assert cluster.free("h8") == (7, 7 * 40960)


def test_pods_seen_before_their_node_are_charged_when_it_arrives() -> None:
    """The live source lists pods and nodes in separate threads: pods may come first."""
    c = Cluster()
    c.pod("web", "embed", gpus={GPU: 1}, node="t4", annotations={"gpu-placement.io/gpu-memory": "4Gi"})
    c.pod("ml", "train", gpus={GPU: 2}, node="h8")
    c.node("t4", "t4-timeslicing")
    c.node("h8", "h100x8")
    assert c.free("t4") == (7, T4 - 4096)
    assert c.free("h8") == (6, 6 * H100)


def test_node_deleted_and_back_with_new_labels_recharges_its_pods() -> None:
    """A node object recreated under the same name (VM replaced, kubelet re-registered) while its pods
    and a reservation still point at it: they hold what a unit of the new node is."""
    c = Cluster()
    c.node("t4", "t4-timeslicing")
    c.pod("web", "chat", gpus={GPU: 1}, node="t4")
    c.view.reserve("web/next", "t4", ((GPU, 1),), None)
    c.view.delete_node("t4")
    c.node("t4", "t4-timeslicing", labels={"nvidia.com/gpu.replicas": "4"})
    assert c.free("t4") == (2, T4 - 2 * (T4 // 4))


def test_namespace_usage() -> None:
    c = Cluster()
    c.node("h8", "h100x8")
    c.pod("ml", "a", gpus={GPU: 2}, node="h8")
    c.pod("ml", "b", gpus={GPU: 1})  # pending counts against quota too
    c.pod("ml", "c", gpus={GPU: 4}, node="h8", phase="Succeeded")
    c.pod("web", "s", gpus={"nvidia.com/gpu.shared": 3})
    c.pod("web", "cpu-only")
    assert c.view.namespace_usage["ml"] == {GPU: 3}
    assert c.view.namespace_usage["web"] == {"nvidia.com/gpu.shared": 3}
    c.view.delete_pod("ml/a")
    c.pod("ml", "b", gpus={GPU: 1}, phase="Failed")
    assert c.view.namespace_usage.get("ml", {}) == {}


def test_namespace_memory_default_is_charged() -> None:
    c = Cluster()
    c.view.upsert_namespace(c.ingest.namespace(namespace("inference", {"gpu-placement.io/gpu-memory": "1Gi"})))
    c.node("t4", "t4-timeslicing")
    c.pod("inference", "embed", gpus={GPU: 2}, node="t4")
    assert c.free("t4") == (6, T4 - 2 * 1024)


# -- reservations ------------------------------------------------------------------------------
def test_reservation_reduces_free_and_expires_after_ttl() -> None:
    c = Cluster(Config(reservation_ttl_seconds=30))
    c.node("h8", "h100x8")
    c.validator("h8")
    c.view.reserve("ml/big", "h8", ((GPU, 8),), None)
    assert c.free("h8") == (0, 0)
    assert c.verdict("h8", gpus={GPU: 1}) == (
        "InsufficientGPU: the pod needs 1 nvidia.com/gpu free and the node has fewer")
    c.now += 29.9
    assert c.verdict("h8", gpus={GPU: 1}).startswith("InsufficientGPU")
    c.now += 0.2  # past reservationTTLSeconds: the pod was never seen bound
    assert c.verdict("h8", gpus={GPU: 1}) == "pass"
    assert c.free("h8") == (8, 8 * H100) and c.view.reservations == {}


def test_reservation_released_when_the_pod_is_seen_bound() -> None:
    c = Cluster()
    c.node("h8", "h100x8")
    c.view.reserve("ml/p", "h8", ((GPU, 2),), None)
    c.pod("ml", "p", gpus={GPU: 2})  # the watch shows it pending first: still reserved
    assert c.free("h8") == (6, 6 * H100)
    c.pod("ml", "p", gpus={GPU: 2}, node="h8")  # now bound: its own charge replaces the reservation
    assert c.free("h8") == (6, 6 * H100)
    assert c.view.reservations == {}
    c.view.delete_pod("ml/p")
    assert c.free("h8") == (8, 8 * H100)


def test_reservation_for_a_pod_bound_elsewhere_is_released() -> None:
    c = Cluster()
    c.node("h8", "h100x8")
    c.node("h8b", "h100x8")
    c.view.reserve("ml/p", "h8", ((GPU, 2),), None)
    c.pod("ml", "p", gpus={GPU: 2}, node="h8b")
    assert c.free("h8") == (8, 8 * H100) and c.free("h8b") == (6, 6 * H100)


def test_shared_reservation_holds_the_memory_ask() -> None:
    c = Cluster()
    c.node("t4", "t4-timeslicing")
    c.view.reserve("web/chat", "t4", ((GPU, 1),), "6Gi")
    assert c.free("t4") == (7, T4 - 6144)
    c.view.release("web/chat")
    assert c.free("t4") == (8, T4)


# -- validators --------------------------------------------------------------------------------
def test_validator_missing_not_ready_ready() -> None:
    c = Cluster()
    c.node("gpu-1", "h100")
    missing = c.verdict("gpu-1", gpus={GPU: 1})
    assert missing.startswith("NotValidated: no nvidia-operator-validator pod on the node")
    assert "gpu-operator" in missing and "app=nvidia-operator-validator" in missing  # where it looked
    c.validator("gpu-1", ready=False)
    assert c.verdict("gpu-1", gpus={GPU: 1}) == ("NotValidated: the nvidia-operator-validator pod on the node is "
                                                 "not Ready (namespace gpu-operator, app=nvidia-operator-validator)")
    c.validator("gpu-1", ready=True)
    assert c.verdict("gpu-1", gpus={GPU: 1}) == "pass"
    c.view.delete_pod("gpu-operator/nvidia-operator-validator-gpu-1")
    assert c.verdict("gpu-1", gpus={GPU: 1}).startswith("NotValidated: no nvidia-operator-validator pod")


def test_validator_in_another_namespace_or_without_the_label_is_ignored() -> None:
    c = Cluster()
    c.node("gpu-1", "h100")
    imposter = validator_pod("gpu-1")
    imposter["metadata"]["namespace"] = "default"
    c.view.upsert_pod(c.ingest.pod(imposter))
    unlabelled = make_pod("gpu-operator", "something-else", node="gpu-1", labels={"app": "gpu-feature-discovery"})
    c.view.upsert_pod(c.ingest.pod(unlabelled))
    assert c.verdict("gpu-1", gpus={GPU: 1}).startswith("NotValidated: no nvidia-operator-validator pod")


def test_a_ready_validator_beside_an_old_one_validates() -> None:
    c = Cluster()
    c.node("gpu-1", "h100")
    c.validator("gpu-1", ready=False)
    new = validator_pod("gpu-1")
    new["metadata"]["name"] = "nvidia-operator-validator-x7k2p"
    c.view.upsert_pod(c.ingest.pod(new))
    assert c.verdict("gpu-1", gpus={GPU: 1}) == "pass"


def test_validation_can_be_switched_off() -> None:
    c = Cluster(Config(validator=Validator(required=False)))
    c.node("gpu-1", "h100")
    assert c.verdict("gpu-1", gpus={GPU: 1}) == "pass"


# -- telemetry ---------------------------------------------------------------------------------
def test_telemetry_narrows_only_shares(cluster: Cluster) -> None:
    """Whole GPUs follow allocatable: an idle H100's free framebuffer is a little under its total."""
    idle = tuple([H100 - 500] * 8)
    cluster.view.set_telemetry({"h8": Telemetry(sum(idle), 0, cluster.now, idle),
                                "t4": Telemetry(3000, 0, cluster.now, (3000,))})
    assert cluster.free("h8") == (8, 8 * H100)
    assert cluster.verdict("h8", gpus={GPU: 8}) == "pass"
    shared = {"gpu-placement.io/sharing": "shared"}
    assert cluster.free("t4") == (8, 3000)  # a share: what the device really has left narrows it
    assert cluster.verdict("t4", gpus={GPU: 1}, annotations={**shared, "gpu-placement.io/gpu-memory": "4Gi"}) == (
        f"InsufficientGPUMemory: the pod needs 4096 MiB of {GPU} memory free and the node has less (per-node "
        "figures: gpu-placement explain)")
    assert cluster.verdict("t4", gpus={GPU: 1}, annotations={**shared, "gpu-placement.io/gpu-memory": "2Gi"}) == "pass"
    cluster.view.set_telemetry({"t4": Telemetry(10 * T4, 0, cluster.now, (10 * T4,))})
    assert cluster.free("t4") == (8, T4)  # telemetry narrows, never widens
    cluster.view.set_telemetry({})
    assert cluster.free("t4") == (8, T4)


# -- the placement cache stays equal to a fresh one --------------------------------------------
_PODS = {  # kinds of pod the scheduler asks about, each its own cache entry
    "whole-1-cuda12.2": dict(gpus={GPU: 1}, image="nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04"),
    "whole-4": dict(gpus={GPU: 4}),
    "share-4Gi": dict(gpus={GPU: 1}, annotations={"gpu-placement.io/gpu-memory": "4Gi",
                                                  "gpu-placement.io/sharing": "shared"}),
    "mig-1g": dict(gpus={"nvidia.com/mig-1g.10gb": 1}),
    "driver-550": dict(gpus={GPU: 1}, annotations={"gpu-placement.io/min-driver": "550"}),
    "cuda13": dict(gpus={GPU: 1}, image="nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04"),
    "t4-only-2Gi": dict(gpus={GPU: 1}, annotations={"gpu-placement.io/gpu-products": "Tesla-T4",
                                                      "gpu-placement.io/gpu-memory": "2Gi",
                                                      "gpu-placement.io/sharing": "shared"}),
}
_BASES = ["h100", "h100x8", "t4-timeslicing", "h100-mig-mixed", "a100-vgpu", "a10g-unregistered"]
_RELABELS: list[dict[str, str]] = [
    {"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"},
    {"nvidia.com/gpu-driver-upgrade-state": "drain-required"},
    {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"},
    {"nvidia.com/gpu.deploy.driver": "paused-for-driver-upgrade"},
    {"nvidia.com/mig.config.state": "pending"},
    {"nvidia.com/cuda.driver-version.full": "535.129.03", "nvidia.com/cuda.runtime-version.major": "12",
     "nvidia.com/cuda.runtime-version.minor": "2"},
    {"nvidia.com/cuda.driver-version.full": "580.65.06", "nvidia.com/cuda.runtime-version.major": "13",
     "nvidia.com/cuda.runtime-version.minor": "0"},
    {"nvidia.com/gpu.memory": "40960"},
    {"nvidia.com/gpu.memory": "abc"},
    {"nvidia.com/gpu.replicas": "4"},
]


class _Model:
    """The objects a source has delivered, to rebuild a view from scratch and compare."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.serial = 0

    def make_node(self, name: str) -> dict[str, Any]:
        rng = self.rng
        base = rng.choice(_BASES)
        labels = dict(rng.choice(_RELABELS)) if rng.random() < 0.3 else {}
        return make_node(name, base, labels=labels, ready=rng.random() > 0.1, unschedulable=rng.random() < 0.05,
                         allocatable=self._allocatable(base, labels))

    @staticmethod
    def _allocatable(base: str, labels: dict[str, str]) -> dict[str, str] | None:
        if base == "a10g-unregistered":
            return {GPU: "0"}
        if labels.get("nvidia.com/gpu.memory") == "abc" or "nvidia.com/gpu.replicas" in labels:
            return {GPU: "4"}
        return None


def _build_fresh(model: _Model, view: ClusterView, config: Config) -> Placement:
    fresh = ClusterView(config, clock=view.clock)
    ingest = Ingest(config)
    for obj in model.nodes.values():
        fresh.upsert_node(ingest.node(obj))
    for obj in model.pods.values():
        fresh.upsert_pod(ingest.pod(obj))
    for key, reservation in view.reservations.items():
        fresh.reserve(key, reservation.node, reservation.gpus, reservation.memory_annotation)
    return Placement(fresh, config)


def _answers(placement: Placement, names: list[str]) -> dict[str, Any]:
    answers = {}
    for kind, spec in _PODS.items():
        req = placement.requirements(make_pod("ml", kind, image=spec.get("image", "busybox"),
                                              gpus=spec["gpus"], annotations=spec.get("annotations")))
        result = placement.filter(req, names)
        answers[kind] = (sorted(result.passed), result.failed, result.unresolvable, placement.scores(req, names),
                         +result.reasons)
    return answers


Walk = Iterator[tuple[int, str, Cluster, _Model]]
_CHANGES = ["relabel", "bind", "delete-pod", "finish-pod", "validator", "delete-node", "add-node", "reserve"]


def _walk(seed: int, steps: int = 150) -> Walk:
    """Random changes of every kind a source delivers, with a fixed seed; yields after each one, with
    the scheduler's cache already warm for every kind of pod."""
    rng = random.Random(seed)
    config = Config(reservation_ttl_seconds=30)
    c = Cluster(config)
    model = _Model(rng)
    for i in range(8):
        name = f"n{i}"
        model.nodes[name] = model.make_node(name)
        model.pods[f"gpu-operator/nvidia-operator-validator-{name}"] = validator_pod(name)
    for obj in model.nodes.values():
        c.view.upsert_node(c.ingest.node(obj))
    for obj in model.pods.values():
        c.view.upsert_pod(c.ingest.pod(obj))
    _answers(c.placement, sorted(model.nodes))  # fill the cache before the changes start
    for step in range(steps):
        change = rng.choice(_CHANGES)
        names = sorted(model.nodes)
        if change == "relabel" and names:
            name = rng.choice(names)
            obj = model.make_node(name)
            model.nodes[name] = obj
            c.view.upsert_node(c.ingest.node(obj))
        elif change in ("bind", "reserve") and names:
            model.serial += 1
            spec = _PODS[rng.choice(list(_PODS))]
            node = rng.choice(names)
            pod = make_pod("ml", f"p{model.serial}", gpus=spec["gpus"], annotations=spec.get("annotations"),
                           node=node if change == "bind" else None)
            if change == "bind" or model.serial % 2:  # else /bind came before the watch showed the pod at all
                model.pods[f"ml/p{model.serial}"] = pod
                c.view.upsert_pod(c.ingest.pod(pod))
            if change == "reserve":  # /bind reserved it; the watch has not shown it bound
                record = c.ingest.pod(pod)
                c.view.reserve(record.key, node, record.gpus, record.memory_annotation)
        elif change in ("delete-pod", "finish-pod"):
            keys = [k for k in model.pods if k.startswith("ml/")]
            if keys:
                key = rng.choice(keys)
                if change == "delete-pod":
                    del model.pods[key]
                    c.view.delete_pod(key)
                else:
                    model.pods[key]["status"]["phase"] = "Succeeded"
                    c.view.upsert_pod(c.ingest.pod(model.pods[key]))
        elif change == "validator" and names:
            name = rng.choice(names)
            key = f"gpu-operator/nvidia-operator-validator-{name}"
            if key in model.pods and rng.random() < 0.3:
                del model.pods[key]
                c.view.delete_pod(key)
            else:
                model.pods[key] = validator_pod(name, ready=rng.random() < 0.6)
                c.view.upsert_pod(c.ingest.pod(model.pods[key]))
        elif change == "delete-node" and len(names) > 2:
            name = rng.choice(names)
            del model.nodes[name]
            c.view.delete_node(name)
        elif change == "add-node":
            # a new node, or one deleted earlier coming back (its pods may still be bound to it)
            gone = sorted({pod["spec"].get("nodeName") for pod in model.pods.values()} - set(names) - {None})
            name = rng.choice(gone) if gone and rng.random() < 0.5 else f"n{step + 100}"
            model.nodes[name] = model.make_node(name)
            c.view.upsert_node(c.ingest.node(model.nodes[name]))
        if step % 10 == 0:
            c.now += 7  # reservations age and some expire
        yield step, change, c, model


def _asked(model: _Model, step: int) -> list[str]:
    """What kube-scheduler asks at this step: the nodes its own filters passed (a few left out, others
    back, from step to step), a node it still believes in, and in another order each time (its
    feasible list is filled by parallel workers)."""
    rng = random.Random(step)
    names = [name for name in sorted(model.nodes) if rng.random() > 0.15] + ["gone-node"]
    rng.shuffle(names)
    return names


def test_placement_cache_equals_a_fresh_placement_after_random_changes() -> None:
    seen: set[str] = set()  # verdict codes met along the way: the walk must reach many of them
    for step, change, c, model in _walk(4):
        cached = _answers(c.placement, _asked(model, step))
        fresh = _answers(Placement(c.view, c.config), _asked(model, step))
        for kind in _PODS:
            assert cached[kind] == fresh[kind], f"step {step} ({change}): {kind}: cache differs from a new Placement"
            passed, failed, unresolvable, _, _ = cached[kind]
            seen.update(message.split(":", 1)[0] for message in [*failed.values(), *unresolvable.values()])
            if passed:
                seen.add("pass")
    assert {"pass", "InsufficientGPU", "InsufficientGPUMemory", "NotValidated", "UnknownNode", "DriverUpgrade",
            "NodeNotReady", "NoGPU", "BadLabel", "MIGReconfiguring", "SharingMismatch"} <= seen, seen


def test_incremental_view_equals_a_view_rebuilt_from_the_same_objects() -> None:
    """The same walk, compared with a view built from scratch from the objects the source delivered
    (nodes first, then pods, then the live reservations)."""
    for step, change, c, model in _walk(4):
        cached = _answers(c.placement, _asked(model, step))
        rebuilt = _answers(_build_fresh(model, c.view, c.config), _asked(model, step))
        for kind in _PODS:
            assert cached[kind] == rebuilt[kind], f"step {step} ({change}): {kind}: differs from a rebuilt view"


def test_namespace_memory_default_change_keeps_what_running_pods_hold() -> None:
    """A share charged by its namespace's gpu-memory default keeps that charge when the default
    changes (its process holds what it holds); a pod bound afterwards takes the new default."""
    config = Config()
    view = ClusterView(config)
    ingest = Ingest(config)
    ingest.event(view, "namespaces", "ADDED", namespace("inference", {"gpu-placement.io/gpu-memory": "2Gi"}))
    ingest.event(view, "nodes", "ADDED", make_node("t4", "t4-timeslicing", shared_resource="nvidia.com/gpu.shared"))
    ingest.event(view, "pods", "ADDED", make_pod("inference", "a", gpus={"nvidia.com/gpu.shared": 1}, node="t4"))
    ingest.event(view, "pods", "ADDED", make_pod("inference", "b", gpus={"nvidia.com/gpu.shared": 1}, node="t4",
                                                annotations={"gpu-placement.io/gpu-memory": "1Gi"}))
    assert view.free_mib["nvidia.com/gpu.shared"]["t4"] == 15360 - 2048 - 1024
    ingest.event(view, "namespaces", "MODIFIED", namespace("inference", {"gpu-placement.io/gpu-memory": "4Gi"}))
    assert view.free_mib["nvidia.com/gpu.shared"]["t4"] == 15360 - 2048 - 1024
    ingest.event(view, "pods", "ADDED", make_pod("inference", "c", gpus={"nvidia.com/gpu.shared": 1}, node="t4"))
    assert view.free_mib["nvidia.com/gpu.shared"]["t4"] == 15360 - 2048 - 1024 - 4096
    # a status update of the running pod (same uid) keeps its first charge
    ingest.event(view, "pods", "MODIFIED", make_pod("inference", "a", gpus={"nvidia.com/gpu.shared": 1}, node="t4",
                                                   phase="Running", labels={"app": "a", "restarted": "1"}))
    assert view.free_mib["nvidia.com/gpu.shared"]["t4"] == 15360 - 2048 - 1024 - 4096


def test_a_pod_listed_before_its_namespace_takes_the_namespace_default() -> None:
    """Kinds are listed in parallel: a bound pod may arrive before its namespace. Its charge is fixed
    once the namespace is seen, and from then on no longer follows the default."""
    config = Config()
    view = ClusterView(config)
    ingest = Ingest(config)
    ingest.event(view, "nodes", "ADDED", make_node("t4", "t4-timeslicing", shared_resource="nvidia.com/gpu.shared"))
    ingest.event(view, "pods", "ADDED", make_pod("inference", "a", gpus={"nvidia.com/gpu.shared": 1}, node="t4"))
    assert view.free_mib["nvidia.com/gpu.shared"]["t4"] == 15360 - 1920  # a share's memory, for now
    ingest.event(view, "namespaces", "ADDED", namespace("inference", {"gpu-placement.io/gpu-memory": "2Gi"}))
    assert view.free_mib["nvidia.com/gpu.shared"]["t4"] == 15360 - 2048
    ingest.event(view, "namespaces", "MODIFIED", namespace("inference", {"gpu-placement.io/gpu-memory": "4Gi"}))
    assert view.free_mib["nvidia.com/gpu.shared"]["t4"] == 15360 - 2048


@pytest.mark.parametrize(("spec_claims", "status", "expected"), [
    ([{"name": "gpu", "resourceClaimTemplateName": "t1"}, {"name": "x", "resourceClaimName": "shared"}],
     {"phase": "Pending"}, ("t1",)),
    ([{"name": "gpu", "resourceClaimTemplateName": "t1"}],
     {"phase": "Pending", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-abcde"}]}, ()),
    ([{"name": "gpu", "resourceClaimTemplateName": "t1"}], {"phase": "Succeeded"}, ()),  # done: waits for nothing
    ([{"name": "gpu", "resourceClaimTemplateName": "t1"}], {"phase": "Pending", "resourceClaimStatuses": 5}, ("t1",)),
    ([{"name": "gpu", "resourceClaimTemplateName": 7}, "junk"], {"phase": "Pending"}, ()),
])
def test_a_pod_names_the_templates_it_still_waits_for_claims_from(spec_claims: Any, status: dict[str, Any],
                                                                  expected: tuple[str, ...]) -> None:
    """kube-controller-manager records each claim it made from a template in status.resourceClaimStatuses
    (pkg/controller/resourceclaim/controller.go syncPod): an entry not recorded still needs its template."""
    pod = {"metadata": {"name": "p", "namespace": "ai"}, "spec": {"containers": [], "resourceClaims": spec_claims},
           "status": status}
    assert pod_from_json(pod, CONFIG.is_gpu_resource, lambda ns, labels: False).claim_templates == expected
