"""POST /validate over HTTPS: GPU access, quota with this replica's reservations, escalation, bad
annotations, exempt namespaces, dry runs and audit mode. Pods go through /mutate first, as the API
server sends them (Webhook.admit), unless a test means to skip it."""

from __future__ import annotations

import copy

import pytest

from gpu_placement.samples.cluster import make_pod
from gpu_placement.web.certs import CertBundle
from tests.support.webhook import TEST_CONFIG, Webhook, denial, review, serving, user_pod

pytestmark = pytest.mark.timeout(30)


# -- access and quota ----------------------------------------------------------------------------------

def test_a_namespace_without_gpu_access(hook: Webhook) -> None:
    _, verdict = hook.admit(user_pod("web", None, gpus={"nvidia.com/gpu": 1}), "web")
    assert denial(verdict) == (
        "namespace web has no GPU access: it has no gpu-placement.io/quota annotation and the default namespace "
        "policy is deny, and this pod asks for 1 nvidia.com/gpu: ask the platform team to set gpu-placement.io/quota "
        "on namespace web, e.g. gpu-placement.io/quota=nvidia.com/gpu=1")


def test_pods_without_gpus_are_always_allowed(hook: Webhook) -> None:
    _, verdict = hook.admit(user_pod("web", None, image="nginx:1.27"), "web")
    assert verdict == {"uid": verdict["uid"], "allowed": True}


def test_over_quota_names_namespace_resource_figures_and_annotation(hook: Webhook) -> None:
    # research: quota 2, two running pods with 1 each; a Succeeded pod with 4 does not count.
    _, verdict = hook.admit(user_pod("research", "sweep", gpus={"nvidia.com/gpu": 4}), "research")
    assert denial(verdict) == (
        "namespace research may use 2 nvidia.com/gpu (gpu-placement.io/quota); 2 are in use and this pod asks 4 "
        "more: lower the request or raise the quota on the namespace")


def held_warning(verdict: dict) -> str:
    assert verdict["allowed"] is True, verdict
    (warning,) = verdict["warnings"]
    return warning


def test_what_this_replica_just_admitted_is_told_not_counted(hook: Webhook) -> None:
    # Any caller that reaches the port can make a hold: it warns, and never refuses a pod.
    first, verdict = hook.admit(user_pod("team-a", "a", gpus={"nvidia.com/gpu": 3}), "team-a")
    assert verdict["allowed"] is True
    _, verdict = hook.admit(user_pod("team-a", "b", gpus={"nvidia.com/gpu": 2}), "team-a")
    assert held_warning(verdict) == (
        "namespace team-a may use 4 nvidia.com/gpu (gpu-placement.io/quota); 0 are in use, 3 more admitted moments "
        "ago may yet be created, and this pod asks 2 more: if they all are, this one goes over the quota (where "
        "gpu-placement mirrors the quota into a ResourceQuota, the API server refuses it)")
    # The view sees the first pod: from then on it is in use, and refuses.
    stored = hook.create(first, "team-a")
    assert hook.app.state.admission.reservations.pending("team-a") == {"nvidia.com/gpu": 2}  # b's hold
    _, verdict = hook.admit(user_pod("team-a", "c", gpus={"nvidia.com/gpu": 2}), "team-a")
    assert denial(verdict) == (
        "namespace team-a may use 4 nvidia.com/gpu (gpu-placement.io/quota); 3 are in use and this pod asks 2 "
        "more: lower the request or raise the quota on the namespace")
    _, verdict = hook.admit(user_pod("team-a", "c", gpus={"nvidia.com/gpu": 1}), "team-a")
    assert "3 are in use, 2 more admitted moments ago may yet be created" in held_warning(verdict)
    # Both gone: the quota is free again.
    hook.ingest.event(hook.view, "pods", "DELETED", stored)
    hook.create(user_pod("team-a", "c", gpus={"nvidia.com/gpu": 1}), "team-a")
    _, verdict = hook.admit(user_pod("team-a", "d", gpus={"nvidia.com/gpu": 3}), "team-a")
    assert verdict["allowed"] is True


def test_a_finished_pod_frees_its_share(hook: Webhook) -> None:
    running = make_pod("team-a", "run", gpus={"nvidia.com/gpu": 4}, node="gpu-1")
    hook.ingest.event(hook.view, "pods", "ADDED", running)
    _, verdict = hook.admit(user_pod("team-a", "next", gpus={"nvidia.com/gpu": 1}), "team-a")
    assert "4 are in use" in denial(verdict)
    running["status"]["phase"] = "Succeeded"
    hook.ingest.event(hook.view, "pods", "MODIFIED", running)
    assert hook.admit(user_pod("team-a", "next", gpus={"nvidia.com/gpu": 1}), "team-a")[1]["allowed"] is True


def test_reservations_expire(hook: Webhook) -> None:
    assert hook.admit(user_pod("team-a", "a", gpus={"nvidia.com/gpu": 4}), "team-a")[1]["allowed"] is True
    assert "4 more admitted moments ago" in held_warning(hook.admit(user_pod("team-a", "b", gpus={"nvidia.com/gpu": 1}),
                                                                    "team-a")[1])
    hook.clock[0] += hook.config.reservation_ttl_seconds + 1  # the creates failed after us: never seen
    _, verdict = hook.admit(user_pod("team-a", "c", gpus={"nvidia.com/gpu": 1}), "team-a")
    assert verdict == {"uid": verdict["uid"], "allowed": True}
    assert hook.app.state.admission.reservations.pending("team-a") == {"nvidia.com/gpu": 1}  # c's own hold


def test_a_pod_recreated_under_the_same_name_is_not_mistaken_for_the_old_one(hook: Webhook) -> None:
    old = make_pod("team-a", "worker-0", gpus={"nvidia.com/gpu": 1}, node="gpu-1", uid="old-uid")
    hook.ingest.event(hook.view, "pods", "ADDED", old)
    new = user_pod("team-a", "worker-0", gpus={"nvidia.com/gpu": 2}, uid="new-uid")
    assert hook.admit(new, "team-a")[1]["allowed"] is True
    assert hook.app.state.admission.reservations.pending("team-a") == {"nvidia.com/gpu": 2}


def test_a_retried_call_for_the_same_pod_is_not_counted_twice(hook: Webhook) -> None:
    mutated, verdict = hook.admit(user_pod("team-a", "a", gpus={"nvidia.com/gpu": 3}), "team-a")
    assert verdict["allowed"] is True
    assert hook.validate(mutated, "team-a")["allowed"] is True  # the API server timed out and called again
    assert hook.app.state.admission.reservations.pending("team-a") == {"nvidia.com/gpu": 3}


def test_dry_runs_reserve_nothing(hook: Webhook) -> None:
    for _ in range(3):
        _, verdict = hook.admit(user_pod("team-a", "try", gpus={"nvidia.com/gpu": 3}), "team-a", dry_run=True)
        assert verdict["allowed"] is True
    assert len(hook.app.state.admission.reservations) == 0
    assert hook.admit(user_pod("team-a", "real", gpus={"nvidia.com/gpu": 4}), "team-a")[1]["allowed"] is True


def test_a_pod_without_a_name_yet_is_held_by_its_uid(hook: Webhook) -> None:
    for _ in range(2):
        pod = user_pod("team-a", None, gpus={"nvidia.com/gpu": 2})
        assert hook.admit(pod, "team-a")[1]["allowed"] is True
    assert hook.app.state.admission.reservations.pending("team-a") == {"nvidia.com/gpu": 4}  # two holds, by uid
    _, verdict = hook.admit(user_pod("team-a", None, gpus={"nvidia.com/gpu": 1}), "team-a")
    assert "0 are in use, 4 more admitted moments ago may yet be created" in held_warning(verdict)


def test_init_containers_count_by_the_effective_request_rule(hook: Webhook) -> None:
    pod = user_pod("research", "init")
    pod["spec"]["initContainers"] = [{"name": "prep", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]
    _, verdict = hook.admit(pod, "research")
    assert "this pod asks 3 more" in denial(verdict)


def test_a_resource_the_quota_does_not_list(hook: Webhook) -> None:
    pod = user_pod("team-a", "light", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/sharing": "shared"})
    _, verdict = hook.admit(pod, "team-a")
    assert denial(verdict) == (
        "namespace team-a may not use nvidia.com/gpu.shared: its gpu-placement.io/quota lists only nvidia.com/gpu=4 "
        "and this pod asks for 1 nvidia.com/gpu.shared: ask for a listed resource, or add "
        "nvidia.com/gpu.shared=<count> to gpu-placement.io/quota on the namespace")


def test_rewritten_resources_count_against_their_own_quota(hook: Webhook) -> None:
    for index in range(4):
        _, verdict = hook.admit(user_pod("inference", f"s{index}", gpus={"nvidia.com/gpu": 1}), "inference")
        assert verdict["allowed"] is True
    _, verdict = hook.admit(user_pod("inference", "s4", gpus={"nvidia.com/gpu": 1}), "inference")
    assert "namespace inference may use 4 nvidia.com/gpu.shared" in held_warning(verdict)
    assert hook.app.state.admission.reservations.pending("inference") == {"nvidia.com/gpu.shared": 5}


# -- escalation --------------------------------------------------------------------------------------

def test_a_pod_may_not_widen_its_namespaces_sharing(hook: Webhook) -> None:
    pod = user_pod("inference", "greedy", gpus={"nvidia.com/gpu": 1},
                   annotations={"gpu-placement.io/sharing": "exclusive"})
    _, verdict = hook.admit(pod, "inference")
    assert denial(verdict) == (
        "pod inference/greedy asks gpu-placement.io/sharing=exclusive, more than namespace inference gives "
        "(gpu-placement.io/sharing=shared on namespace inference): a pod may narrow its namespace's sharing, never "
        "widen it; remove the annotation from the pod")


@pytest.mark.parametrize(("ns", "pod", "lacks"), [
    ("inference", user_pod("inference", "raw", gpus={"nvidia.com/gpu": 1}),
     "the GPU resource rewrite, spec.tolerations, spec.nodeSelector, spec.schedulerName, the "
     "gpu-placement.io/admitted annotation, the gpu-placement.io/gpu-memory annotation"),
    ("team-a", user_pod("team-a", "raw", gpus={"nvidia.com/gpu": 1}),
     "spec.tolerations, spec.nodeSelector, spec.schedulerName, the gpu-placement.io/admitted annotation"),
])
def test_a_pod_the_mutating_webhook_missed(hook: Webhook, ns: str, pod: dict, lacks: str) -> None:
    """/mutate is failurePolicy Ignore: when it could not be reached the API server creates the pod
    unshaped, and /validate (failurePolicy Fail) is the one to say no, and why."""
    message = denial(hook.validate(pod, ns))
    assert message == (
        f"pod {ns}/raw was not shaped by gpu-placement's mutating webhook, which GPU pods in namespace {ns} must be "
        f"(the namespace has a GPU policy); it lacks {lacks}. Most likely the webhook could not be reached when the "
        "pod was created (its failurePolicy is Ignore, so the API server went on without it): create the pod again. "
        "If this keeps happening, check the gpu-placement webhook's pods and its MutatingWebhookConfiguration")


def test_the_admitted_annotation_cannot_be_forged_into_another_shape(hook: Webhook) -> None:
    """What gpu-placement.io/admitted records is checked against the pod: copied from a shaped pod onto
    one that asks for more, or onto a pod without the rest of the shape, it admits neither."""
    shaped, _, _ = hook.mutate(user_pod("team-a", "model", gpus={"nvidia.com/gpu": 1}), "team-a")
    assert hook.validate(shaped, "team-a", dry_run=True)["allowed"] is True
    bigger = copy.deepcopy(shaped)
    for section in ("limits", "requests"):
        bigger["spec"]["containers"][0]["resources"][section]["nvidia.com/gpu"] = "2"
    assert "lacks the gpu-placement.io/admitted annotation." in denial(hook.validate(bigger, "team-a", dry_run=True))
    record = shaped["metadata"]["annotations"]["gpu-placement.io/admitted"]
    bare = user_pod("team-a", "bare", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/admitted": record})
    assert "it lacks spec.tolerations, spec.nodeSelector, spec.schedulerName." in denial(
        hook.validate(bare, "team-a", dry_run=True))
    elsewhere = copy.deepcopy(shaped)  # its own scheduler: a pod may not step around the extender
    elsewhere["spec"]["schedulerName"] = "default-scheduler"
    assert "it lacks spec.schedulerName." in denial(hook.validate(elsewhere, "team-a", dry_run=True))


def test_without_a_gpu_policy_an_unshaped_pod_is_left_to_the_other_checks(bundle: CertBundle) -> None:
    """A namespace with no gpu-placement.io/* annotation under defaultNamespacePolicy allow has no GPU
    policy to keep: the check is for namespaces that have one."""
    with serving(bundle, {**TEST_CONFIG, "defaultNamespacePolicy": "allow"}) as hook:
        assert hook.validate(user_pod("web", "raw", gpus={"nvidia.com/gpu": 1}), "web")["allowed"] is True
        assert hook.validate(user_pod("team-a", "raw", gpus={"nvidia.com/gpu": 1}), "team-a")["allowed"] is False


def test_audit_mode_holds_no_pod_to_its_shaping(audit: Webhook) -> None:
    """Audit /mutate shapes nothing (a dry run, webhook/audit.py): every pod comes unshaped, so saying
    so would be noise; what enforce would do is /mutate's warning."""
    verdict = audit.validate(user_pod("team-a", "raw", gpus={"nvidia.com/gpu": 1}), "team-a", dry_run=True)
    assert verdict["allowed"] is True and "warnings" not in verdict


@pytest.mark.parametrize(("ns", "resource", "annotations"), [
    ("inference", "nvidia.com/mig-1g.10gb", {}),
    ("mig-lab", "nvidia.com/mig-3g.40gb", {}),
    ("mig-lab", "nvidia.com/gpu.shared", {"gpu-placement.io/sharing": "mig-3g.40gb"}),
])
def test_other_escalations(hook: Webhook, ns: str, resource: str, annotations: dict[str, str]) -> None:
    _, verdict = hook.admit(user_pod(ns, "x", gpus={resource: 1}, annotations=annotations), ns)
    message = denial(verdict)
    assert f"more than namespace {ns} gives" in message


def test_narrower_asks_are_fine(hook: Webhook) -> None:
    pod = user_pod("flex", "share", gpus={"nvidia.com/gpu.shared": 2})  # asked directly, no annotation
    assert hook.admit(pod, "flex")[1]["allowed"] is True
    pod = user_pod("flex", "share2", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/sharing": "shared"})
    assert hook.admit(pod, "flex")[1]["allowed"] is True


# -- annotations ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("annotations", "phrase"), [
    ({"gpu-placement.io/cuda": "twelve"}, 'gpu-placement.io/cuda="twelve" on pod team-a/odd: '),
    ({"gpu-placement.io/gpu-memory": "４Gi"}, "U+FF14 FULLWIDTH DIGIT FOUR"),
    ({"gpu-placement.io/sharing": "shared\u200f"}, 'gpu-placement.io/sharing="shared\\u200f" on pod team-a/odd'),
    ({"gpu-placement.io/gpu-products": "H100 🚀"}, "U+1F680 ROCKET"),
    ({"gpu-placement.io/gpu-memory": "1e999999999"}, '"1e999999999" is not a quantity'),
    ({"gpu-placement.io/min-compute-capability": "eight"}, "gpu-placement.io/min-compute-capability"),
])
def test_bad_pod_annotations_are_clean_denials(hook: Webhook, annotations: dict[str, str], phrase: str) -> None:
    _, verdict = hook.admit(user_pod("team-a", "odd", gpus={"nvidia.com/gpu": 1}, annotations=annotations), "team-a")
    message = denial(verdict)
    assert phrase in message
    assert message.startswith(next(iter(annotations)))


def test_several_problems_are_numbered(hook: Webhook) -> None:
    pod = user_pod("research", "typo", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/cuda": "twelve"})
    message = denial(hook.admit(pod, "research")[1])
    assert message.startswith('2 problems: (1) gpu-placement.io/cuda="twelve" on pod research/typo')
    assert "; (2) namespace research may use 2 nvidia.com/gpu" in message


def test_unknown_namespace_annotations_warn_in_enforce_mode_too(hook: Webhook) -> None:
    hook.ingest.event(hook.view, "namespaces", "MODIFIED", {"metadata": {"name": "team-a", "annotations": {
        "gpu-placement.io/quota": "nvidia.com/gpu=4", "gpu-placement.io/pool": "training"}}})
    _, verdict = hook.admit(user_pod("team-a", "w", gpus={"nvidia.com/gpu": 1}), "team-a")
    assert verdict["allowed"] is True
    assert verdict["warnings"][0].startswith("annotation gpu-placement.io/pool on namespace team-a is not read")


# -- exempt, audit ---------------------------------------------------------------------------------------

def test_exempt_namespaces_are_always_allowed(hook: Webhook) -> None:
    pod = user_pod("kube-system", "anything", gpus={"nvidia.com/gpu": 64},
                   annotations={"gpu-placement.io/sharing": "🙂"})
    mutated, verdict = hook.admit(pod, "kube-system")
    assert mutated == pod
    assert verdict == {"uid": verdict["uid"], "allowed": True}


def test_audit_mode_allows_and_warns_with_the_same_text(hook: Webhook, audit: Webhook) -> None:
    cases = [(user_pod("research", "sweep", gpus={"nvidia.com/gpu": 4}), "research"),
             (user_pod("web", "gpu", gpus={"nvidia.com/gpu": 1}), "web"),
             (user_pod("inference", "greedy", gpus={"nvidia.com/gpu": 1},
                       annotations={"gpu-placement.io/sharing": "exclusive"}), "inference"),
             (user_pod("team-a", "typo", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/cuda": "x"}),
              "team-a")]
    for pod, ns in cases:
        enforced = denial(hook.admit(pod, ns, dry_run=True)[1])
        _, verdict = audit.admit(pod, ns, dry_run=True)
        assert verdict["allowed"] is True and "status" not in verdict
        assert verdict["warnings"] == [enforced]


def test_audit_mode_still_counts_what_it_let_in(audit: Webhook) -> None:
    _, verdict = audit.admit(user_pod("team-a", "a", gpus={"nvidia.com/gpu": 4}), "team-a")
    assert verdict == {"uid": verdict["uid"], "allowed": True}
    _, verdict = audit.admit(user_pod("team-a", "b", gpus={"nvidia.com/gpu": 1}), "team-a")
    assert verdict["allowed"] is True
    assert verdict["warnings"] == ["namespace team-a may use 4 nvidia.com/gpu (gpu-placement.io/quota); 0 are in use, "
                                   "4 more admitted moments ago may yet be created, and this pod asks 1 more: if they "
                                   "all are, this one goes over the quota (where gpu-placement mirrors the quota into "
                                   "a ResourceQuota, the API server refuses it)"]


def test_default_allow_lets_namespaces_without_quota_use_gpus(bundle: CertBundle) -> None:
    with serving(bundle, {**TEST_CONFIG, "defaultNamespacePolicy": "allow"}) as hook:
        for index in range(3):
            _, verdict = hook.admit(user_pod("web", f"g{index}", gpus={"nvidia.com/gpu": 8}), "web")
            assert verdict == {"uid": verdict["uid"], "allowed": True}


# -- UPDATE: gpu-placement.io/* annotations are fixed at admission ---------------------------------------

def update_review(old: dict, new: dict, ns: str) -> dict:
    body = review(new, ns, operation="UPDATE")
    body["request"]["oldObject"] = old
    return body


def test_an_annotation_edit_on_a_running_pod_is_denied(hook: Webhook) -> None:
    admitted, verdict = hook.admit(user_pod("team-a", "train", gpus={"nvidia.com/gpu": 2}), "team-a")
    assert verdict["allowed"] is True
    running = hook.create(admitted, "team-a")
    cheaper = copy.deepcopy(running)
    cheaper["metadata"]["annotations"]["gpu-placement.io/gpu-memory"] = "1Gi"
    verdict = hook.answer("/validate", update_review(running, cheaper, "team-a"))
    assert denial(verdict) == (
        "pod team-a/train: gpu-placement.io/gpu-memory is fixed at admission (they decide what the pod is charged "
        "and how it is placed) and cannot be changed on a running pod: delete the pod and create it again with "
        "the annotations you want")
    gone = copy.deepcopy(running)
    del gone["metadata"]["annotations"]["gpu-placement.io/admitted"]
    gone["metadata"]["annotations"]["gpu-placement.io/sharing"] = "exclusive"
    assert denial(hook.answer("/validate", update_review(running, gone, "team-a"))).startswith(
        "pod team-a/train: gpu-placement.io/admitted, gpu-placement.io/sharing are fixed at admission")


def test_ordinary_pod_updates_are_allowed(hook: Webhook) -> None:
    running = hook.create(hook.admit(user_pod("team-a", "train", gpus={"nvidia.com/gpu": 1}), "team-a")[0], "team-a")
    relabelled = copy.deepcopy(running)
    relabelled["metadata"]["labels"]["stage"] = "eval"
    relabelled["metadata"]["annotations"]["team.example.com/owner"] = "bob"
    body = update_review(running, relabelled, "team-a")
    assert hook.answer("/validate", body) == {"uid": body["request"]["uid"], "allowed": True}
    # Exempt namespaces are never held to it.
    system = make_pod("kube-system", "agent", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/x": "1"})
    edited = copy.deepcopy(system)
    edited["metadata"]["annotations"]["gpu-placement.io/x"] = "2"
    assert hook.answer("/validate", update_review(system, edited, "kube-system"))["allowed"] is True


def test_an_update_without_the_old_pod_is_a_bad_request(hook: Webhook) -> None:
    verdict = hook.answer("/validate", review(user_pod("team-a", "x"), "team-a", operation="UPDATE"))
    assert verdict["allowed"] is False and verdict["status"]["code"] == 400


def test_audit_mode_warns_about_an_annotation_edit(audit: Webhook) -> None:
    running = make_pod("team-a", "train", gpus={"nvidia.com/gpu": 1},
                       annotations={"gpu-placement.io/sharing": "shared"})
    edited = copy.deepcopy(running)
    edited["metadata"]["annotations"]["gpu-placement.io/sharing"] = "exclusive"
    verdict = audit.answer("/validate", update_review(running, edited, "team-a"))
    assert verdict["allowed"] is True
    assert verdict["warnings"][0].startswith("pod team-a/train: gpu-placement.io/sharing is fixed at admission")


@pytest.mark.parametrize(("side", "metadata", "phrase"), [
    ("object", 1, "request.object.metadata: expected an object, got a number 1"),
    ("oldObject", "x", 'request.oldObject.metadata: expected an object, got a string "x"'),
    ("oldObject", {"annotations": {"gpu-placement.io/sharing": 7}},
     "request.oldObject.metadata.annotations[gpu-placement.io/sharing]: expected a string, got a number 7"),
    ("object", {"annotations": []}, "request.object.metadata.annotations: expected an object, got a list"),
])
def test_an_update_of_the_wrong_shape_is_a_bad_request_naming_the_field(hook: Webhook, side: str, metadata: object,
                                                                         phrase: str) -> None:
    """Checked at the edge like a CREATE: the fuzz suite found HTTP 500s here (an int has no .get)."""
    running = make_pod("team-a", "train", gpus={"nvidia.com/gpu": 1},
                       annotations={"gpu-placement.io/sharing": "shared"})
    body = update_review(running, copy.deepcopy(running), "team-a")
    body["request"][side]["metadata"] = metadata
    verdict = hook.answer("/validate", body)
    assert verdict["allowed"] is False and verdict["status"]["code"] == 400, verdict
    assert verdict["status"]["message"] == phrase


def test_an_annotation_edit_through_pods_status_is_denied_too(hook: Webhook) -> None:
    """kube-apiserver 1.37 keeps metadata changes made through the pods/status subresource
    (pkg/registry/core/pod/strategy.go: podStatusStrategy resets only the spec, ownerReferences and
    deletionTimestamp), so the guard covers it; the chart sends pods/status updates too."""
    running = make_pod("team-a", "train", gpus={"nvidia.com/gpu": 1},
                       annotations={"gpu-placement.io/sharing": "shared"})
    edited = copy.deepcopy(running)
    edited["metadata"]["annotations"]["gpu-placement.io/gpu-memory"] = "1Mi"
    body = update_review(running, edited, "team-a")
    body["request"]["subResource"] = "status"
    assert denial(hook.answer("/validate", body)).startswith(
        "pod team-a/train: gpu-placement.io/gpu-memory is fixed at admission")
    body["request"]["subResource"] = "ephemeralcontainers"  # its strategy resets metadata: nothing to guard
    assert hook.answer("/validate", body)["allowed"] is True
