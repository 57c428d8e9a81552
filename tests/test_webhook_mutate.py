"""POST /mutate over HTTPS: every patch applied with jsonpatch to the original pod, the result checked
field by field and read as a V1Pod, then sent again to prove the patch is empty (Webhook.mutate)."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from gpu_placement.samples.cluster import namespace
from gpu_placement.web.certs import CertBundle
from tests.support.webhook import TEST_CONFIG, Webhook, as_v1pod, find, patch_of, review, serving, user_pod
from webhook.patches import escape

pytestmark = pytest.mark.timeout(30)

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
TRAINING_TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
KEEP_OFF = {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]}


def admitted(pod: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(pod["metadata"]["annotations"]["gpu-placement.io/admitted"])


def terms(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]


# -- GPU pods ------------------------------------------------------------------------------------------

def test_a_deployment_pod_with_no_name_in_an_exclusive_pool_namespace(hook: Webhook) -> None:
    pod = user_pod("team-a", None, gpus={"nvidia.com/gpu": 2})
    assert "name" not in pod["metadata"] and "namespace" not in pod["metadata"]
    mutated, ops, _ = hook.mutate(pod, "team-a")
    spec, meta = mutated["spec"], mutated["metadata"]
    assert spec["containers"][0]["resources"] == pod["spec"]["containers"][0]["resources"]  # exclusive: untouched
    assert spec["tolerations"] == [GPU_TOLERATION, TRAINING_TOLERATION]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "training"}
    assert spec["schedulerName"] == "gpu-placement"
    assert "affinity" not in spec
    assert admitted(mutated) == {"sharing": "exclusive", "resources": {"nvidia.com/gpu": 2}, "pools": ["training"],
                                 "scheduler": "gpu-placement"}
    assert meta["generateName"] == "web-7d4b9c-" and meta["labels"] == {"app": "x"}
    assert "gpu-placement.io/gpu-memory" not in meta["annotations"]  # no namespace default here
    # Missing parents are created whole, never appended into.
    assert find(ops, "/spec/tolerations") == [{"op": "add", "path": "/spec/tolerations",
                                               "value": [GPU_TOLERATION, TRAINING_TOLERATION]}]
    assert find(ops, "/spec/nodeSelector")[0]["op"] == "add"
    assert find(ops, "/spec/schedulerName") == [{"op": "replace", "path": "/spec/schedulerName",
                                                 "value": "gpu-placement"}]
    v1 = as_v1pod(mutated)
    assert v1.spec.scheduler_name == "gpu-placement" and v1.spec.node_selector["pool"] == "training"
    assert [t.key for t in v1.spec.tolerations] == ["nvidia.com/gpu", "dedicated"]


def test_shared_rewrites_requests_and_limits_of_containers_and_init_containers(hook: Webhook) -> None:
    pod = user_pod("inference", "chat", gpus={"nvidia.com/gpu": 1})
    spec = pod["spec"]
    spec["initContainers"] = [
        {"name": "warmup", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "2"}}},  # limits only
        {"name": "proxy", "image": "envoy", "restartPolicy": "Always",
         "resources": {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}},
        {"name": "fetch", "image": "busybox"},
    ]
    spec["containers"].append({"name": "log", "image": "fluentbit", "resources": {"limits": {"memory": "1Gi"}}})
    mutated, ops, _ = hook.mutate(pod, "inference")
    init, containers = mutated["spec"]["initContainers"], mutated["spec"]["containers"]
    assert init[0]["resources"] == {"limits": {"nvidia.com/gpu.shared": "2"}}
    assert init[1]["resources"] == {"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu.shared": "1"}}
    assert init[2] == pod["spec"]["initContainers"][2]
    assert containers[0]["resources"]["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu.shared": "1"}
    assert containers[0]["resources"]["requests"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu.shared": "1"}
    assert containers[1] == pod["spec"]["containers"][1]
    # `/` in a resource name is escaped as ~1.
    assert {"op": "remove", "path": "/spec/initContainers/0/resources/limits/nvidia.com~1gpu"} in ops
    assert {"op": "add", "path": "/spec/containers/0/resources/requests/nvidia.com~1gpu.shared", "value": "1"} in ops
    # Effective ask: app 1 + sidecar 1 = 2, the init container alone needs 2.
    assert admitted(mutated)["resources"] == {"nvidia.com/gpu.shared": 2}
    assert admitted(mutated)["sharing"] == "shared"
    # The namespace's memory default is written on the pod, for the extender to charge.
    assert mutated["metadata"]["annotations"]["gpu-placement.io/gpu-memory"] == "2Gi"
    v1 = as_v1pod(mutated)
    assert v1.spec.init_containers[0].resources.limits == {"nvidia.com/gpu.shared": "2"}
    assert hook.validate(mutated, "inference")["allowed"] is True


def test_the_pods_own_memory_ask_is_kept(hook: Webhook) -> None:
    pod = user_pod("inference", "chat", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/gpu-memory": "6Gi"})
    mutated, _, _ = hook.mutate(pod, "inference")
    assert mutated["metadata"]["annotations"]["gpu-placement.io/gpu-memory"] == "6Gi"


def test_mig_namespace_rewrites_to_the_profile(hook: Webhook) -> None:
    mutated, _, _ = hook.mutate(user_pod("mig-lab", "nb", gpus={"nvidia.com/gpu": 1}), "mig-lab")
    assert mutated["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"
    assert "nvidia.com/gpu" not in mutated["spec"]["containers"][0]["resources"]["limits"]
    assert admitted(mutated)["resources"] == {"nvidia.com/mig-1g.10gb": 1}


def test_both_names_in_one_container_ask_for_the_sum(hook: Webhook) -> None:
    pod = user_pod("inference", "both", gpus={"nvidia.com/gpu": 1, "nvidia.com/gpu.shared": 2})
    mutated, _, _ = hook.mutate(pod, "inference")
    assert mutated["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "4", "memory": "16Gi",
                                                                       "nvidia.com/gpu.shared": "3"}


def test_the_pod_may_narrow_its_namespace(hook: Webhook) -> None:
    pod = user_pod("flex", "light", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/sharing": "shared"})
    mutated, verdict = hook.admit(pod, "flex")
    assert mutated["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    assert admitted(mutated)["sharing"] == "shared"
    assert verdict["allowed"] is True


def test_a_wider_pod_ask_is_not_applied(hook: Webhook) -> None:
    pod = user_pod("inference", "greedy", gpus={"nvidia.com/gpu": 1},
                   annotations={"gpu-placement.io/sharing": "exclusive"})
    mutated, _, _ = hook.mutate(pod, "inference")
    assert "nvidia.com/gpu.shared" in mutated["spec"]["containers"][0]["resources"]["limits"]
    assert admitted(mutated)["sharing"] == "shared"


def test_existing_tolerations_and_node_selector_are_kept_and_not_duplicated(hook: Webhook) -> None:
    pod = user_pod("team-a", "t", gpus={"nvidia.com/gpu": 1})
    pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                                  {"key": "spot", "operator": "Exists"}]
    pod["spec"]["nodeSelector"] = {"kubernetes.io/arch": "amd64", "pool": "cheap"}
    mutated, ops, _ = hook.mutate(pod, "team-a")
    assert mutated["spec"]["tolerations"] == [*pod["spec"]["tolerations"], TRAINING_TOLERATION]
    assert find(ops, "/spec/tolerations/-") == [{"op": "add", "path": "/spec/tolerations/-",
                                                 "value": TRAINING_TOLERATION}]
    # The namespace's pool wins over the pod's own value for the same label.
    assert mutated["spec"]["nodeSelector"] == {"kubernetes.io/arch": "amd64", "pool": "training",
                                               "nvidia.com/gpu.present": "true"}
    assert {"op": "replace", "path": "/spec/nodeSelector/pool", "value": "training"} in ops
    assert {"op": "add", "path": "/spec/nodeSelector/nvidia.com~1gpu.present", "value": "true"} in ops


def test_a_toleration_equal_but_for_defaults_counts_as_present(hook: Webhook) -> None:
    pod = user_pod("web", "w", gpus={"nvidia.com/gpu": 1})
    pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule",
                                   "value": ""}]
    mutated, _, _ = hook.mutate(pod, "web")
    assert mutated["spec"]["tolerations"] == pod["spec"]["tolerations"]


def test_several_pools_become_one_term_each(hook: Webhook) -> None:
    mutated, ops, _ = hook.mutate(user_pod("multi", "m", gpus={"nvidia.com/gpu": 1}), "multi")
    assert mutated["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert terms(mutated) == [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["training"]}]},
        {"matchExpressions": [{"key": "example.com/pool", "operator": "In", "values": ["inference"]},
                              {"key": "zone", "operator": "In", "values": ["a"]}]},
    ]
    assert find(ops, "/spec/affinity")[0]["op"] == "add"
    assert mutated["spec"]["tolerations"] == [GPU_TOLERATION, TRAINING_TOLERATION]
    assert admitted(mutated)["pools"] == ["training", "inference"]
    v1 = as_v1pod(mutated)
    assert len(v1.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
               .node_selector_terms) == 2


def test_several_pools_are_anded_into_the_pods_own_terms(hook: Webhook) -> None:
    pod = user_pod("multi", "m", gpus={"nvidia.com/gpu": 1})
    zone_b = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}
    arm = {"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]}
    in_training = {"key": "pool", "operator": "In", "values": ["training"]}
    node_field = {"key": "metadata.name", "operator": "In", "values": ["gpu-1", "gpu-2"]}
    preferred = [{"weight": 1, "preference": {"matchExpressions": [arm]}}]
    pod["spec"]["affinity"] = {
        "nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
            {"matchExpressions": [zone_b]},
            {"matchExpressions": [arm], "matchFields": [node_field]},
            {"matchExpressions": [in_training, arm]},  # already inside a pool: kept as it is
            {},  # matches no node in Kubernetes, and must keep matching none
        ]}, "preferredDuringSchedulingIgnoredDuringExecution": preferred},
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "m"}}, "topologyKey": "kubernetes.io/hostname"}]},
    }
    mutated, ops, _ = hook.mutate(pod, "multi")
    inference = [{"key": "example.com/pool", "operator": "In", "values": ["inference"]},
                 {"key": "zone", "operator": "In", "values": ["a"]}]
    assert terms(mutated) == [
        {"matchExpressions": [zone_b, in_training]},
        {"matchExpressions": [zone_b, *inference]},
        {"matchExpressions": [arm, in_training], "matchFields": [node_field]},
        {"matchExpressions": [arm, *inference], "matchFields": [node_field]},
        {"matchExpressions": [in_training, arm]},
        {},
    ]
    affinity = mutated["spec"]["affinity"]
    assert affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == preferred
    assert affinity["podAntiAffinity"] == pod["spec"]["affinity"]["podAntiAffinity"]
    assert [op["op"] for op in find(ops, f"/spec/affinity/nodeAffinity/{REQUIRED}/nodeSelectorTerms")] == ["replace"]
    as_v1pod(mutated)


@pytest.mark.parametrize("affinity", [
    {},
    {"podAffinity": {}},
    {"nodeAffinity": {}},
    {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
    {"nodeAffinity": {REQUIRED: {}}},
    {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}}},
    {"nodeAffinity": None},
])
def test_partial_affinity_parents_are_completed(hook: Webhook, affinity: dict[str, Any]) -> None:
    pod = user_pod("multi", "m", gpus={"nvidia.com/gpu": 1})
    pod["spec"]["affinity"] = copy.deepcopy(affinity)
    mutated, _, _ = hook.mutate(pod, "multi")
    assert len(terms(mutated)) == 2
    for key in ("podAffinity", "preferredDuringSchedulingIgnoredDuringExecution"):
        if key in affinity:
            assert key in mutated["spec"]["affinity"] or key in mutated["spec"]["affinity"]["nodeAffinity"]


@pytest.mark.parametrize(("given", "expected"), [(None, "gpu-placement"), ("", "gpu-placement"),
                                                 ("default-scheduler", "gpu-placement"), ("volcano", "volcano")])
def test_scheduler_name(hook: Webhook, given: str | None, expected: str) -> None:
    pod = user_pod("team-a", "s", gpus={"nvidia.com/gpu": 1})
    if given is None:
        del pod["spec"]["schedulerName"]
    else:
        pod["spec"]["schedulerName"] = given
    mutated, _, _ = hook.mutate(pod, "team-a")
    assert mutated["spec"]["schedulerName"] == expected
    assert admitted(mutated)["scheduler"] == expected


def test_annotations_are_added_beside_existing_ones(hook: Webhook) -> None:
    pod = user_pod("inference", "a", gpus={"nvidia.com/gpu": 1}, annotations={"team": "search"})
    mutated, ops, _ = hook.mutate(pod, "inference")
    assert mutated["metadata"]["annotations"]["team"] == "search"
    assert {op["path"] for op in ops if "annotations" in op["path"]} == {
        "/metadata/annotations/gpu-placement.io~1admitted", "/metadata/annotations/gpu-placement.io~1gpu-memory"}
    pod = user_pod("inference", "b", gpus={"nvidia.com/gpu": 1})
    del pod["metadata"]["annotations"]
    mutated, ops, _ = hook.mutate(pod, "inference")
    assert set(mutated["metadata"]["annotations"]) == {"gpu-placement.io/admitted", "gpu-placement.io/gpu-memory"}
    assert find(ops, "/metadata/annotations")[0]["op"] == "add"


def test_limits_only_and_zero_and_other_gpu_resources(hook: Webhook) -> None:
    pod = user_pod("inference", "z")
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    pod["spec"]["containers"].append({"name": "idle", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "0"},
                                                                                  "limits": {"nvidia.com/gpu": "0"}}})
    mutated, _, _ = hook.mutate(pod, "inference")
    assert mutated["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu.shared": "1"}}
    assert mutated["spec"]["containers"][1]["resources"] == {"requests": {"nvidia.com/gpu.shared": "0"},
                                                             "limits": {"nvidia.com/gpu.shared": "0"}}


def test_json_pointer_escaping() -> None:
    assert escape("nvidia.com/gpu") == "nvidia.com~1gpu"
    assert escape("a~b/c~1") == "a~0b~1c~01"


def test_a_namespace_whose_sharing_does_not_parse_leaves_the_pod_alone_and_says_why(hook: Webhook) -> None:
    odd = namespace("odd", {"gpu-placement.io/sharing": "Shared", "gpu-placement.io/quota": "nvidia.com/gpu=1"})
    hook.ingest.event(hook.view, "namespaces", "MODIFIED", odd)
    response = hook.answer("/mutate", review(user_pod("odd", gpus={"nvidia.com/gpu": 1}), "odd"))
    assert response["allowed"] is True and patch_of(response) == []
    assert response["warnings"] == ['gpu-placement.io/sharing="Shared" on namespace odd: "Shared" is not exclusive, '
                                    "shared or mig-<profile> (values are lower case: shared); write it as exclusive, "
                                    "shared or mig-1g.10gb"]


# -- pods without GPUs ---------------------------------------------------------------------------------

@pytest.mark.parametrize("toleration", [{"operator": "Exists"}, {"key": "nvidia.com/gpu", "operator": "Exists"},
                                        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "present",
                                         "effect": "NoSchedule"}])
def test_a_pod_without_gpus_that_tolerates_the_gpu_taint_is_kept_off_gpu_nodes(
        hook: Webhook, toleration: dict[str, Any]) -> None:
    pod = user_pod("web", None, image="nginx:1.27")
    pod["spec"]["tolerations"] = [toleration]
    mutated, ops, _ = hook.mutate(pod, "web")
    assert terms(mutated) == [{"matchExpressions": [KEEP_OFF]}]
    assert ops == [{"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {REQUIRED: {
        "nodeSelectorTerms": [{"matchExpressions": [KEEP_OFF]}]}}}}]
    assert mutated["spec"]["schedulerName"] == "default-scheduler"  # not ours to schedule


def test_keeping_off_gpu_nodes_is_anded_into_every_term(hook: Webhook) -> None:
    pod = user_pod("web", "tolerant", image="nginx:1.27")
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    field = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    pod["spec"]["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
        {"matchExpressions": [zone]}, {"matchFields": [field]}, {"matchExpressions": [zone, KEEP_OFF]}]}}}
    mutated, _, _ = hook.mutate(pod, "web")
    assert terms(mutated) == [{"matchExpressions": [zone, KEEP_OFF]}, {"matchFields": [field],
                                                                       "matchExpressions": [KEEP_OFF]},
                              {"matchExpressions": [zone, KEEP_OFF]}]


@pytest.mark.parametrize("case", ["daemonset", "no-toleration", "exempt", "node-name", "other-taint"])
def test_pods_left_alone(hook: Webhook, case: str) -> None:
    pod = user_pod("web", "alone", image="nginx:1.27")
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    ns = "web"
    if case == "daemonset":
        pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "fluentbit",
                                               "uid": "ds-1", "controller": True}]
    elif case == "no-toleration":
        del pod["spec"]["tolerations"]
    elif case == "exempt":
        ns = "kube-system"
    elif case == "node-name":
        pod["spec"]["nodeName"] = "gpu-1"
    else:
        pod["spec"]["tolerations"] = [{"key": "spot", "operator": "Exists"}]
    mutated, ops, response = hook.mutate(pod, ns)
    assert ops == [] and mutated == pod and "warnings" not in response


@pytest.mark.parametrize("choice", [
    {"nodeSelector": {"nvidia.com/gpu.present": "true"}},
    {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]}]}}}},
    {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["false", "true"]},
                              {"key": "ib", "operator": "Exists"}]}]}}}},
])
def test_a_pod_that_selects_gpu_nodes_itself_is_not_trapped(hook: Webhook, choice: dict[str, Any]) -> None:
    """An NCCL/InfiniBand health check or a node agent run as a Deployment: no GPU asked, the GPU
    toleration, and GPU nodes chosen on purpose. NotIn [true] would make it unschedulable."""
    pod = user_pod("web", "nccl-check", image="nccl-tests:2.13")
    pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pod["spec"].update(copy.deepcopy(choice))
    mutated, ops, response = hook.mutate(pod, "web")
    assert ops == [] and mutated == pod
    assert response["warnings"] == [
        "pod web/nccl-check asks for no GPU but selects GPU nodes itself (nvidia.com/gpu.present=true), so "
        "protectGpuNodes leaves it alone: it takes room on GPU nodes without using a GPU"]


@pytest.mark.parametrize("selection", [
    {"nodeSelector": {"nvidia.com/gpu.present": "false"}},
    {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]},
                              {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}},
])
def test_a_selection_that_does_not_ask_for_gpu_nodes_is_still_kept_off_them(hook: Webhook,
                                                                            selection: dict[str, Any]) -> None:
    pod = user_pod("web", "tolerant", image="nginx:1.27")
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    pod["spec"].update(copy.deepcopy(selection))
    mutated, _, response = hook.mutate(pod, "web")
    assert "warnings" not in response
    assert all(KEEP_OFF in term["matchExpressions"] for term in terms(mutated))


def test_gpu_daemonset_pods_keep_their_scheduler(hook: Webhook) -> None:
    pod = user_pod("team-a", "dcgm-probe", gpus={"nvidia.com/gpu": 1})
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "probe",
                                           "uid": "ds-1", "controller": True}]
    mutated, ops, _ = hook.mutate(pod, "team-a")
    assert find(ops, "/spec/schedulerName") == [] and mutated["spec"]["schedulerName"] == "default-scheduler"
    assert admitted(mutated)["scheduler"] == "default-scheduler"
    assert mutated["spec"]["nodeSelector"]["nvidia.com/gpu.present"] == "true"  # shaped otherwise as any GPU pod
    del pod["spec"]["schedulerName"]
    mutated, ops, _ = hook.mutate(pod, "team-a")
    assert find(ops, "/spec/schedulerName") == [] and admitted(mutated)["scheduler"] == "default-scheduler"
    replica = user_pod("team-a", "worker", gpus={"nvidia.com/gpu": 1})
    assert hook.mutate(replica, "team-a")[0]["spec"]["schedulerName"] == "gpu-placement"


def test_gpu_pods_in_exempt_namespaces_are_left_alone(hook: Webhook) -> None:
    pod = user_pod("kube-system", "dcgm", gpus={"nvidia.com/gpu": 1})
    mutated, ops, _ = hook.mutate(pod, "kube-system")
    assert ops == [] and mutated == pod


def test_gpu_daemonset_pods_are_shaped_like_any_gpu_pod(hook: Webhook) -> None:
    pod = user_pod("inference", "agent", gpus={"nvidia.com/gpu": 1})
    pod["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "a", "uid": "d"}]
    pod["spec"]["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]}}}
    mutated, _, _ = hook.mutate(pod, "inference")
    assert "nvidia.com/gpu.shared" in mutated["spec"]["containers"][0]["resources"]["limits"]
    assert terms(mutated) == pod["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]


def test_protection_can_be_switched_off(bundle: CertBundle) -> None:
    with serving(bundle, {**TEST_CONFIG, "protectGpuNodes": False}) as hook:
        pod = user_pod("web", "tolerant", image="nginx:1.27")
        pod["spec"]["tolerations"] = [{"operator": "Exists"}]
        _, ops, _ = hook.mutate(pod, "web")
        assert ops == []


# -- not ours --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"operation": "UPDATE"}, {"operation": "DELETE"}, {"sub": "binding"}, {"sub": "ephemeralcontainers"},
    {"kind": {"group": "apps", "version": "v1", "kind": "Deployment"},
     "resource": {"group": "apps", "version": "v1", "resource": "deployments"}},
])
def test_other_operations_and_resources_pass_untouched(hook: Webhook, kwargs: dict[str, Any]) -> None:
    body = review(user_pod("team-a", "p", gpus={"nvidia.com/gpu": 1}), "team-a", **kwargs)
    if kwargs.get("operation") == "UPDATE":  # as the API server sends it; our annotations unchanged
        body["request"]["oldObject"] = body["request"]["object"]
    for path in ("/mutate", "/validate"):
        response = hook.answer(path, body)
        assert response == {"uid": body["request"]["uid"], "allowed": True}
