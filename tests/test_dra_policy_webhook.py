"""A namespace annotated `gpu-placement.io/allocation: dra`: a GPU pod written the usual way
(`nvidia.com/gpu: 2`) comes out of /mutate with ResourceClaims from the namespace's templates and no
`nvidia.com/*` resource; the templates carry the policy (class, products, driver, memory, sharing).
Admission writes nothing: without its template the pod is refused, retriably."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import orjson
import pytest

from gpu_placement.base.config import ConfigError, parse_config
from gpu_placement.decide.claims import wanted_templates
from gpu_placement.facts.namespaces import namespace_from_json
from gpu_placement.facts.policy import parse_policy
from gpu_placement.kube.discovery import DraApi
from gpu_placement.samples.cluster import namespace
from gpu_placement.samples.dra import device_classes
from gpu_placement.web.certs import CertBundle
from tests.support.dra import Obj, set_namespaces, templates_for
from tests.support.webhook import TEST_CONFIG, Webhook, serving, user_pod

pytestmark = pytest.mark.timeout(30)
H100 = "NVIDIA-H100-80GB-HBM3"
POLICY = {"gpu-placement.io/allocation": "dra", "gpu-placement.io/quota": "nvidia.com/gpu=4",
          "gpu-placement.io/pools": "training", "gpu-placement.io/gpu-products": H100,
          "gpu-placement.io/cuda": "12.4", "gpu-placement.io/gpu-memory": "40Gi"}
DRA_NAMESPACES = [namespace("ai", POLICY),
                  namespace("ai-shared", {"gpu-placement.io/allocation": "dra", "gpu-placement.io/sharing": "shared",
                                          "gpu-placement.io/quota": "nvidia.com/gpu.shared=8"}),
                  namespace("ai-mig", {"gpu-placement.io/allocation": "dra",
                                       "gpu-placement.io/sharing": "mig-1g.10gb",
                                       "gpu-placement.io/quota": "nvidia.com/mig-1g.10gb=2"})]


@pytest.fixture
def dra(hook: Webhook) -> Iterator[Webhook]:
    set_namespaces(hook, DRA_NAMESPACES)
    with hook.view.lock:
        hook.ingest.replace(hook.view, "deviceclasses", copy.deepcopy(device_classes()))
        hook.ingest.replace(hook.view, "resourceclaimtemplates",
                            [t for ns in ("ai", "ai-shared", "ai-mig") for t in templates_for(hook, ns)])
    yield hook
    with hook.view.lock:
        for kind in ("deviceclasses", "resourceclaimtemplates"):
            hook.ingest.replace(hook.view, kind, [])
        hook.view.dra.active = False
        hook.view.listed -= {"deviceclasses", "resourceclaimtemplates"}


def stored_template(hook: Webhook, ns: str, name: str) -> Obj:
    [found] = [t for t in templates_for(hook, ns) if t["metadata"]["name"] == name]
    return found


def gpu_keys(container: Obj) -> list[str]:
    resources = container.get("resources") or {}
    return [k for section in ("requests", "limits") for k in resources.get(section) or {}
            if k.startswith("nvidia.com/")]


def test_a_gpu_pod_written_the_usual_way_gets_claims_carrying_the_namespace_policy(dra: Webhook) -> None:
    pod = user_pod("ai", "train", gpus={"nvidia.com/gpu": 2})
    mutated, _, _ = dra.mutate(pod, "ai")  # applied, read as a V1Pod, and idempotent (a second call: no patch)
    spec = mutated["spec"]
    assert gpu_keys(spec["containers"][0]) == []  # no nvidia.com/* left
    assert [c["name"] for c in spec["containers"][0]["resources"]["claims"]] == ["gpu-0", "gpu-1"]
    [template_name] = {c["resourceClaimTemplateName"] for c in spec["resourceClaims"]}
    assert [c["name"] for c in spec["resourceClaims"]] == ["gpu-0", "gpu-1"]
    assert spec["schedulerName"] == "gpu-placement" and spec["nodeSelector"] == {"pool": "training"}
    assert orjson.loads(mutated["metadata"]["annotations"]["gpu-placement.io/admitted"]) == {
        "claims": ["gpu.nvidia.com"], "pools": ["training"], "scheduler": "gpu-placement"}

    exactly = stored_template(dra, "ai", template_name)["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "gpu.nvidia.com" and exactly["count"] == 1
    assert [s["cel"]["expression"] for s in exactly["selectors"]] == [
        "device.attributes['gpu.nvidia.com'].productName.replace(' ', '-') in ['NVIDIA-H100-80GB-HBM3']",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
        # CUDA 12.4 needs driver 550.54.14 (the driver table)
        "device.attributes['gpu.nvidia.com'].driverVersion.compareTo(semver('550.54.14')) >= 0"]
    assert dra.validate(mutated, "ai")["allowed"] is True


def test_containers_get_only_their_own_devices_and_init_containers_reuse_them(dra: Webhook) -> None:
    pod = user_pod("ai", "pipeline", gpus={"nvidia.com/gpu": 1})
    pod["spec"]["containers"].append(copy.deepcopy(pod["spec"]["containers"][0]) | {"name": "second"})
    init = copy.deepcopy(pod["spec"]["containers"][0]) | {"name": "prepare"}
    init["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    pod["spec"]["initContainers"] = [init]
    mutated, _, _ = dra.mutate(pod, "ai")
    spec = mutated["spec"]
    claims = {c["name"]: [x["name"] for x in c["resources"]["claims"]]
              for c in spec["initContainers"] + spec["containers"]}
    # two devices in all, as the effective request rule counts them (max(init 2, 1 + 1))
    assert claims == {"prepare": ["gpu-0", "gpu-1"], "main": ["gpu-0"], "second": ["gpu-1"]}
    assert len(spec["resourceClaims"]) == 2
    assert gpu_keys(spec["initContainers"][0]) == []


def test_a_shared_namespace_gets_nvidias_time_slicing_config(dra: Webhook) -> None:
    mutated, _, _ = dra.mutate(user_pod("ai-shared", "serve", gpus={"nvidia.com/gpu": 1}), "ai-shared")
    name = mutated["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    assert name.startswith("gpu-placement-shared-")
    devices = stored_template(dra, "ai-shared", name)["spec"]["spec"]["devices"]
    assert devices["config"] == [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Default"}}}}}]


def test_a_mig_namespace_claims_the_profile_from_the_mig_class(dra: Webhook) -> None:
    mutated, _, _ = dra.mutate(user_pod("ai-mig", "small", gpus={"nvidia.com/gpu": 1}), "ai-mig")
    name = mutated["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    exactly = stored_template(dra, "ai-mig", name)["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["deviceClassName"] == "mig.nvidia.com"
    assert exactly["selectors"] == [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}}]


def test_a_pod_narrowing_to_shared_in_an_exclusive_dra_namespace_gets_the_shared_template(dra: Webhook) -> None:
    pod = user_pod("ai", "notebook", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/sharing": "shared"})
    mutated, _, _ = dra.mutate(pod, "ai")
    assert mutated["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith("gpu-placement-shared-")


def test_without_its_template_the_pod_is_left_alone_and_refused_retriably(dra: Webhook) -> None:
    with dra.view.lock:
        dra.ingest.replace(dra.view, "resourceclaimtemplates", [])
    pod = user_pod("ai", "early", gpus={"nvidia.com/gpu": 1})
    mutated, ops, response = dra.mutate(pod, "ai")
    assert ops == []
    assert "is not there yet" in response["warnings"][0]
    answer = dra.validate(mutated, "ai")
    assert answer["allowed"] is False and answer["status"]["code"] == 503
    assert "ResourceClaimTemplate it needs is not there yet" in answer["status"]["message"]
    assert "create the pod again in a few seconds" in answer["status"]["message"]


def test_a_pod_the_mutating_webhook_missed_is_refused_as_not_shaped(dra: Webhook) -> None:
    answer = dra.validate(user_pod("ai", "missed", gpus={"nvidia.com/gpu": 1}), "ai")
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert "was not shaped by gpu-placement's mutating webhook" in answer["status"]["message"]


def test_one_annotation_moves_a_namespace_back_to_the_device_plugin(dra: Webhook) -> None:
    back = copy.deepcopy(DRA_NAMESPACES)
    back[0]["metadata"]["annotations"]["gpu-placement.io/allocation"] = "device-plugin"
    set_namespaces(dra, back)
    mutated, _, _ = dra.mutate(user_pod("ai", "train", gpus={"nvidia.com/gpu": 2}), "ai")
    assert "resourceClaims" not in mutated["spec"]
    assert mutated["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    # gpu.nvidia.com serves nvidia.com/gpu through DRA too: no GFD label is required of the node.
    assert mutated["spec"]["nodeSelector"] == {"pool": "training"}


def test_a_bad_allocation_annotation_is_named_and_the_pod_refused(dra: Webhook) -> None:
    bad = copy.deepcopy(DRA_NAMESPACES)
    bad[0]["metadata"]["annotations"]["gpu-placement.io/allocation"] = "DRA"
    set_namespaces(dra, bad)
    _, ops, response = dra.mutate(user_pod("ai", "train", gpus={"nvidia.com/gpu": 1}), "ai")
    assert ops == [] and "gpu-placement.io/allocation" in response["warnings"][0]
    answer = dra.validate(user_pod("ai", "train", gpus={"nvidia.com/gpu": 1}), "ai")
    assert answer["allowed"] is False
    assert "gpu-placement.io/allocation" in answer["status"]["message"] and "device-plugin or dra" in \
        answer["status"]["message"]


def test_where_resource_k8s_io_is_not_served_a_dra_namespace_keeps_the_device_plugin(hook: Webhook) -> None:
    set_namespaces(hook, DRA_NAMESPACES)
    mutated, _, _ = hook.mutate(user_pod("ai", "train", gpus={"nvidia.com/gpu": 1}), "ai")
    assert "resourceClaims" not in mutated["spec"]
    assert mutated["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "training"}
    assert hook.validate(mutated, "ai")["allowed"] is True


def test_where_only_v1beta1_is_served_a_dra_namespace_keeps_the_device_plugin_not_a_refusal(dra: Webhook) -> None:
    # Kubernetes 1.32 serves resource.k8s.io v1beta1 only: no template is ever kept there, so converting
    # would refuse every GPU pod of the namespace as "not there yet", for ever.
    with dra.view.lock:
        dra.ingest.replace(dra.view, "resourceclaimtemplates", [])
    dra.view.dra.templates_kept = False
    try:
        mutated, _, _ = dra.mutate(user_pod("ai", "train", gpus={"nvidia.com/gpu": 1}), "ai")
        assert "resourceClaims" not in mutated["spec"]
        assert mutated["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert dra.validate(mutated, "ai")["allowed"] is True
    finally:
        dra.view.dra.templates_kept = True


def test_claims_are_made_from_templates_only_at_versions_with_the_exactly_shape() -> None:
    assert [DraApi(v).claims_from_templates for v in ("v1", "v1beta2", "v1beta1", None)] == [True, True, False, False]


def test_the_configuration_makes_dra_the_default_and_shared_mps(bundle: CertBundle) -> None:
    config = {**TEST_CONFIG, "dra": {"allocation": "dra", "sharedStrategy": "MPS", "mpsActiveThreadPercentage": 50}}
    with serving(bundle, config) as hook:
        set_namespaces(hook, [namespace("plain", {"gpu-placement.io/quota": "nvidia.com/gpu=2",
                                                  "gpu-placement.io/gpu-memory": "20Gi"})])
        with hook.view.lock:
            hook.ingest.replace(hook.view, "deviceclasses", copy.deepcopy(device_classes()))
            hook.ingest.replace(hook.view, "resourceclaimtemplates", templates_for(hook, "plain"))
        pod = user_pod("plain", "notebook", gpus={"nvidia.com/gpu": 1},
                       annotations={"gpu-placement.io/sharing": "shared"})
        mutated, _, _ = hook.mutate(pod, "plain")  # no allocation annotation: the configuration's default
        name = mutated["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
        devices = stored_template(hook, "plain", name)["spec"]["spec"]["devices"]
        assert devices["config"][0]["opaque"]["parameters"]["sharing"] == {
            "strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50,
                                             "defaultPinnedDeviceMemoryLimit": "20Gi"}}


@pytest.mark.parametrize(("dra", "problem"), [({"allocation": "both"}, "dra.allocation"),
                                               ({"mpsActiveThreadPercentage": 101}, "from 0 to 100")])
def test_bad_dra_configuration_is_named(dra: Obj, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_config({"dra": dra})


def test_validate_counts_the_devices_of_a_converted_pod_against_the_quota(dra: Webhook) -> None:
    # Three devices claimed already in namespace ai (quota nvidia.com/gpu=4: 4 devices of gpu.nvidia.com).
    held = [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": f"held-{i}", "namespace": "ai"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}}
            for i in range(3)]
    with dra.view.lock:
        dra.ingest.replace(dra.view, "resourceclaims", held)
    try:
        two, _, _ = dra.mutate(user_pod("ai", "two", gpus={"nvidia.com/gpu": 2}), "ai")
        answer = dra.validate(two, "ai")
        assert answer["allowed"] is False
        assert answer["status"]["message"] == (
            "namespace ai may use 4 gpu.nvidia.com.deviceclass.resource.k8s.io/devices (gpu-placement.io/quota); "
            "3 are in use and this pod asks 2 more: lower the request or raise the quota on the namespace")
        one, _, _ = dra.mutate(user_pod("ai", "one", gpus={"nvidia.com/gpu": 1}), "ai")
        assert dra.validate(one, "ai")["allowed"] is True
    finally:
        with dra.view.lock:
            dra.ingest.replace(dra.view, "resourceclaims", [])


def test_shared_in_a_mig_dra_namespace_stays_a_mig_slice(dra: Webhook) -> None:
    """Through DRA a claim's device is its own: `shared` would be a whole GPU, more than a MIG slice."""
    pod = user_pod("ai-mig", "narrow", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/sharing": "shared"})
    mutated, _, _ = dra.mutate(pod, "ai-mig")
    assert mutated["spec"]["resourceClaims"][0]["resourceClaimTemplateName"].startswith("gpu-placement-mig-1g-10gb-")
    assert [t["metadata"]["name"].rsplit("-", 1)[0] for t in templates_for(dra, "ai-mig")] == [
        "gpu-placement-mig-1g-10gb"]


def test_a_resource_the_quota_does_not_list_is_refused_as_before(dra: Webhook) -> None:
    """No template is kept for a class the quota gives nothing of: the pod hears why, not 'not there yet'."""
    answer = dra.validate(user_pod("ai", "mig", gpus={"nvidia.com/mig-1g.10gb": 1}), "ai")
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    assert answer["status"]["message"].startswith("namespace ai may not use nvidia.com/mig-1g.10gb")


def test_a_mig_dra_namespace_is_given_no_whole_gpu_template_even_without_quota() -> None:
    config = parse_config({})
    policy = parse_policy(namespace_from_json(namespace("lab", {"gpu-placement.io/allocation": "dra",
                                                                "gpu-placement.io/sharing": "mig-3g.40gb"})), "lab",
                          config)
    templates = wanted_templates(policy, {"1g.10gb", "3g.40gb", "7g.80gb"}, config)
    assert [(t.level.text, t.device_class) for t in templates] == [("mig-3g.40gb", "mig.nvidia.com"),
                                                                   ("mig-1g.10gb", "mig.nvidia.com")]
