"""Scenario 0: adoption without fear, with real Helm (helm_python, the Helm v4 SDK) on the real
control plane, following docs/deploy.md: a failed first install refuses no pod; an install with
its way back (opt-in namespaces, audit mode, rollback, uninstall) leaves nothing behind.

The release's pods run through tests/e2e/release.py (a kubelet for the release namespace), so
`helm install --wait` waits for what it waits for in a cluster: Deployments whose pods are Ready.
This module runs first (file order), before conftest's `e2e` fixture installs its own release under
the same name; it leaves the cluster without it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import helm_python
import httpx
import pytest
import yaml

from tests.e2e.cluster import Api, ControlPlane, DraPlugin, Kubelets, gate_open, namespace, retrying_503, wait_for
from tests.e2e.deploy import CHART, K8S_TAG, NAMESPACE, RELEASE
from tests.e2e.release import ReleaseKubelet

pytestmark = pytest.mark.timeout(900)

Obj = dict[str, Any]
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
TAINT_RULES = "/apis/resource.k8s.io/v1/devicetaintrules"
QUOTA = "gpu-placement.io/quota"


@dataclass
class Adoption:
    plane: ControlPlane
    api: Api
    kubelets: Kubelets
    pods: ReleaseKubelet
    helm: helm_python.Config
    names: int = 0

    def namespace(self, prefix: str, opted_in: bool, annotations: dict[str, str] | None = None) -> str:
        self.names += 1
        labels = {"gpu-placement.io/enabled": "true"} if opted_in else {}
        return namespace(self.api, f"{prefix}-{self.names}", labels, annotations)

    def gpu_pod(self, namespace: str, name: str, gpus: int = 1, group: str = "adopt-nowhere") -> httpx.Response:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
               "spec": {"restartPolicy": "Never", "nodeSelector": {"e2e-group": group},
                        "containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04",
                                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}
        return retrying_503(lambda: self.api.create(f"/api/v1/namespaces/{namespace}/pods", pod))

    def webhooks(self) -> dict[str, list[Obj] | None]:
        """The live webhooks of both configurations (None: the configuration does not exist)."""
        found: dict[str, list[Obj] | None] = {}
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            r = self.api.http.get(f"{ADMISSION}/{kind}/{RELEASE}")
            found[kind] = None if r.status_code == 404 else list(r.json().get("webhooks") or [])
        return found

    def quota(self, namespace: str) -> Obj | None:
        r = self.api.http.get(f"/api/v1/namespaces/{namespace}/resourcequotas/gpu-placement")
        return None if r.status_code == 404 else dict(r.json())

    def gate_open(self, namespace: str) -> None:
        """The webhook's quota gate passes the counted figure (2 s after its watch showed it)."""
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gate-probe"},
               "spec": {"restartPolicy": "Never", "nodeSelector": {"e2e-group": "adopt-nowhere"},
                        "containers": [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04",
                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        gate_open(namespace, [lambda: self.api.create(f"/api/v1/namespaces/{namespace}/pods", pod, dryRun="All")])

    def quota_in_force(self, namespace: str) -> bool:
        """The mirrored quota as the API server enforces it: counted by the quota controller (until then
        /validate refuses the namespace's GPU pods with QuotaPending, docs/webhook.md)."""
        quota = self.quota(namespace)
        status = (quota or {}).get("status") or {}
        return bool(quota) and status.get("hard") == quota["spec"]["hard"] and "used" in status  # type: ignore[index]

    def left_behind(self) -> list[str]:
        """Anything of the release still in the cluster: by name, by label, and its namespace."""
        left = [f"{kind}/{RELEASE}" for kind, hooks in self.webhooks().items() if hooks is not None]
        for path in ("/apis/rbac.authorization.k8s.io/v1/clusterroles",
                     "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"):
            left += [f"{path.rsplit('/', 1)[1]}/{item['metadata']['name']}" for item in self.api.get(
                path, labelSelector=f"app.kubernetes.io/instance={RELEASE}")["items"]]
        left += [f"resourcequota {q['metadata']['namespace']}/{q['metadata']['name']}" for q in self.api.get(
            "/api/v1/resourcequotas", labelSelector="app.kubernetes.io/managed-by=gpu-placement")["items"]]
        left += [f"devicetaintrule {r['metadata']['name']}" for r in self.api.get(
            TAINT_RULES, labelSelector="app.kubernetes.io/managed-by=gpu-placement")["items"]]
        if self.api.http.get(f"/api/v1/namespaces/{NAMESPACE}").status_code != 404:
            left.append(f"namespace/{NAMESPACE}")
        return left

    def taint_rule(self, node: str) -> Obj | None:
        """The DRA DeviceTaintRule the release keeps for an unverified node's devices."""
        r = self.api.http.get(f"{TAINT_RULES}/gpu-placement-{node}")
        return None if r.status_code == 404 else dict(r.json())

    def taint_effect(self, node: str) -> str | None:
        rule = self.taint_rule(node)
        return None if rule is None else str(rule["spec"]["taint"]["effect"])

    def uninstall(self) -> None:
        """docs/deploy.md, Uninstall: `helm uninstall`, then the namespace (and what the service made in it)."""
        self.helm.uninstall(RELEASE, wait="watcher", timeout=120)
        self.api.delete(f"/api/v1/namespaces/{NAMESPACE}")
        wait_for("the release namespace gone", lambda: self.api.http.get(
            f"/api/v1/namespaces/{NAMESPACE}").status_code == 404, timeout=120, interval=0.5)


@pytest.fixture(scope="module")
def adoption(plane: ControlPlane) -> Iterator[Adoption]:
    api = plane.api
    assert api is not None
    assert api.http.get(f"/api/v1/namespaces/{NAMESPACE}").status_code == 404, (
        "tests/e2e/test_0_adoption.py installs the chart itself: run it before the e2e fixture's release "
        "(pytest's file order does), or alone")
    kubelets = Kubelets(api)
    pods = ReleaseKubelet(plane, api, kubelets)
    kubelets.add_node("adopt-system", None, labels={"e2e-group": "adopt-system"})
    kubelets.wait_schedulable(["adopt-system"])
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-operator"}})
    kubeconfig = api.kubeconfig(plane.work / "helm.kubeconfig", api.token, "e2e-admin")
    helm = helm_python.Config(kubeconfig_path=kubeconfig, namespace=NAMESPACE)
    made = Adoption(plane, api, kubelets, pods, helm)
    try:
        yield made
    finally:
        try:
            if helm.list(all_states=True):
                made.uninstall()
        finally:
            pods.close()
            kubelets.stop()
            helm.close()


def install(adoption: Adoption, values: Obj, timeout: int = 180) -> Obj:
    """docs/deploy.md, Install: helm install gpu-placement charts/gpu-placement -n gpu-placement
    --create-namespace --set ... --wait"""
    return adoption.helm.install(str(CHART), RELEASE, values, namespace=NAMESPACE, create_namespace=True,
                                 wait="watcher", timeout=timeout)


def test_a_failed_install_refuses_no_pod_and_its_uninstall_leaves_nothing(adoption: Adoption) -> None:
    opted = adoption.namespace("failed-in", opted_in=True, annotations={QUOTA: "nvidia.com/gpu=1"})
    other = adoption.namespace("failed-out", opted_in=False)
    started = time.monotonic()
    with pytest.raises(helm_python.HelmError):  # the image never pulls: --wait gives up
        install(adoption, {"image": {"repository": "registry.invalid/platform/gpu-placement"}}, timeout=45)
    print(f"\nfailed install: helm gave up after {time.monotonic() - started:.0f} s")
    waiting = [s["state"].get("waiting", {}).get("reason") for p in adoption.api.get(
        f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector="app.kubernetes.io/component=webhook")["items"]
        for s in p.get("status", {}).get("containerStatuses", [])]
    assert waiting and set(waiting) == {"ErrImagePull"}, waiting
    assert adoption.webhooks() == {"mutatingwebhookconfigurations": [], "validatingwebhookconfigurations": []}

    # GPU pods, over the namespace's quota annotation, and a pod tolerating every taint: none refused,
    # none changed.
    for ns in (opted, other):
        for name in ("a", "b"):
            r = adoption.gpu_pod(ns, name)
            assert r.status_code == 201, r.text
            spec = r.json()["spec"]
            assert spec["schedulerName"] == "default-scheduler", spec
            assert spec["nodeSelector"] == {"e2e-group": "adopt-nowhere"}, spec
            assert "gpu-placement.io/admitted" not in (r.json()["metadata"].get("annotations") or {})
    tolerating = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tolerates-all"},
                  "spec": {"containers": [{"name": "main", "image": "busybox"}],
                           "tolerations": [{"operator": "Exists"}]}}
    r = adoption.api.create(f"/api/v1/namespaces/{opted}/pods", tolerating)
    assert r.status_code == 201 and "affinity" not in r.json()["spec"], r.text
    assert adoption.quota(opted) is None

    # The way back of a first install: uninstall. Nothing is left.
    adoption.uninstall()
    assert adoption.left_behind() == []
    # Or let Helm do it: --rollback-on-failure uninstalls the failed release (its namespace stays).
    with pytest.raises(helm_python.HelmError):
        adoption.helm.install(str(CHART), RELEASE, {"image": {"repository": "registry.invalid/gpu-placement"}},
                              namespace=NAMESPACE, create_namespace=True, wait="watcher", timeout=45,
                              rollback_on_failure=True)
    assert adoption.helm.list(all_states=True) == []
    assert adoption.left_behind() == [f"namespace/{NAMESPACE}"]
    assert adoption.gpu_pod(opted, "c").json()["spec"]["schedulerName"] == "default-scheduler"
    adoption.api.delete(f"/api/v1/namespaces/{NAMESPACE}")
    wait_for("the release namespace gone", lambda: adoption.api.http.get(
        f"/api/v1/namespaces/{NAMESPACE}").status_code == 404, timeout=120, interval=0.5)


def test_install_opt_in_audit_rollback_and_uninstall_as_documented(adoption: Adoption) -> None:
    steps: dict[str, float] = {}
    started = time.monotonic()
    release = install(adoption, {})
    steps["install --wait"] = time.monotonic() - started
    assert (release.get("info") or release).get("status") == "deployed", sorted(release)
    # The release's own version of kube-scheduler: Helm asked the cluster (not its built-in default).
    scheduler = adoption.api.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments/gpu-placement-scheduler")
    images = [c["image"] for c in scheduler["spec"]["template"]["spec"]["containers"]]
    assert images == [f"registry.k8s.io/kube-scheduler:{K8S_TAG}"]
    wait_for("the webhooks written by a ready replica",
             lambda: all(adoption.webhooks().values()), timeout=60, interval=0.5)
    steps["webhooks written"] = time.monotonic() - started

    # Opt-in: a namespace labelled in is shaped and quota'd; one that is not is left alone.
    adoption.kubelets.add_node("adopt-gpu", "h100x8", labels={"e2e-group": "adopt-gpu"})
    adoption.kubelets.add_validator("adopt-gpu")
    # A node whose GPUs only the DRA driver publishes, its validator not Ready: the release taints its
    # devices (a DeviceTaintRule owned by the ValidatingWebhookConfiguration, like the quotas).
    dra = DraPlugin(adoption.api)
    dra.install()
    adoption.kubelets.add_node("adopt-dra", "h100", allocatable={}, labels={"e2e-group": "adopt-dra"})
    adoption.kubelets.add_validator("adopt-dra", ready=False)
    adoption.kubelets.wait_schedulable(["adopt-gpu", "adopt-dra"])
    dra.publish("adopt-dra", 2)
    try:
        adopt_gpus(adoption, steps)
    finally:
        dra.stop()


def adopt_gpus(adoption: Adoption, steps: dict[str, float]) -> None:
    """The rest of the documented path, from the first namespace opted in to the uninstall."""
    opted = adoption.namespace("team-in", opted_in=True, annotations={QUOTA: "nvidia.com/gpu=1"})
    other = adoption.namespace("team-out", opted_in=False, annotations={QUOTA: "nvidia.com/gpu=1"})
    wait_for("the mirrored ResourceQuota in force", lambda: adoption.quota_in_force(opted), timeout=30,
             interval=0.5)
    adoption.gate_open(opted)
    owner = adoption.quota(opted)["metadata"]["ownerReferences"]  # type: ignore[index]
    vwc = adoption.api.get(f"{ADMISSION}/validatingwebhookconfigurations/{RELEASE}")
    assert owner == [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                      "name": RELEASE, "uid": vwc["metadata"]["uid"]}]
    assert adoption.quota(other) is None
    wait_for("the unverified DRA node's DeviceTaintRule", lambda: adoption.taint_effect("adopt-dra") == "NoSchedule",
             timeout=30, interval=0.5)
    assert adoption.taint_rule("adopt-dra")["metadata"]["ownerReferences"] == owner  # type: ignore[index]

    def created(ns: str, name: str, group: str = "adopt-nowhere", gpus: int = 1) -> Obj:
        r = adoption.gpu_pod(ns, name, gpus=gpus, group=group)
        assert r.status_code == 201, r.text
        return dict(r.json())

    shaped = created(opted, "shaped", group="adopt-gpu")
    assert shaped["spec"]["schedulerName"] == "gpu-placement"
    # The DRA driver's gpu.nvidia.com class serves nvidia.com/gpu too (extendedResourceName, KEP-5004), so
    # the webhook adds no nvidia.com/gpu.present selector: a node whose GPUs only DRA publishes may lack it.
    assert "nvidia.com/gpu.present" not in shaped["spec"]["nodeSelector"], shaped["spec"]["nodeSelector"]
    wait_for("the shaped pod bound by the release's scheduler", lambda: adoption.api.get(
        f"/api/v1/namespaces/{opted}/pods/shaped")["spec"].get("nodeName") == "adopt-gpu", timeout=60)
    over = adoption.gpu_pod(opted, "over")
    assert over.status_code == 403 and f"namespace {opted} may use 1 nvidia.com/gpu" in over.text, over.text
    for name in ("untouched-1", "untouched-2"):  # over the annotation, but not opted in
        pod = created(other, name)
        assert pod["spec"]["schedulerName"] == "default-scheduler"
        assert "gpu-placement.io/admitted" not in (pod["metadata"].get("annotations") or {})

    # Audit mode (helm upgrade): a true dry run. The mirrored quota goes; nothing a pod runs with changes.
    started = time.monotonic()
    adoption.helm.upgrade(str(CHART), RELEASE, {"config": {"mode": "audit"}}, namespace=NAMESPACE,
                          wait="watcher", timeout=180)
    steps["upgrade to audit --wait"] = time.monotonic() - started
    wait_for("audit mode to delete the mirrored quota", lambda: adoption.quota(opted) is None, timeout=60,
             interval=0.5)
    steps["quota gone"] = time.monotonic() - started
    # The new replicas write their webhooks as they become ready (old ones never write theirs back).
    wait_for("audit mode's webhooks (failurePolicy Ignore) written", lambda: {
        h["failurePolicy"] for kind in adoption.webhooks().values() for h in kind or []} == {"Ignore"},
        timeout=30, interval=0.2)
    steps["audit webhooks written"] = time.monotonic() - started
    wait_for("audit mode's DeviceTaintRule only reporting", lambda: adoption.taint_effect("adopt-dra") == "None",
             timeout=30, interval=0.5)
    r = adoption.gpu_pod(opted, "audited", gpus=2)
    assert r.status_code == 201, r.text
    audited = r.json()
    assert audited["spec"]["schedulerName"] == "default-scheduler"
    assert audited["spec"]["nodeSelector"] == {"e2e-group": "adopt-nowhere"}
    assert "tolerations" not in audited["spec"] or all(
        t.get("key") != "nvidia.com/gpu" for t in audited["spec"]["tolerations"])
    assert "gpu-placement.io/admitted" not in (audited["metadata"].get("annotations") or {})
    warnings = " ".join(r.headers.get_list("warning"))
    assert "audit mode, nothing changed: enforce mode would set schedulerName gpu-placement" in warnings, warnings
    assert f"namespace {opted} may use 1 nvidia.com/gpu" in warnings, warnings

    # The way back (docs/deploy.md): helm rollback to the enforce revision.
    started = time.monotonic()
    adoption.helm.rollback(RELEASE, version=1, wait="watcher", timeout=180)
    steps["rollback --wait"] = time.monotonic() - started
    wait_for("the quota mirrored again", lambda: adoption.quota_in_force(opted), timeout=60, interval=0.5)
    adoption.gate_open(opted)
    wait_for("enforce mode's webhooks written again", lambda: {h["failurePolicy"] for h in adoption.webhooks()[
        "validatingwebhookconfigurations"] or []} == {"Fail"}, timeout=60, interval=0.5)
    wait_for("enforce mode's DeviceTaintRule", lambda: adoption.taint_effect("adopt-dra") == "NoSchedule",
             timeout=30, interval=0.5)
    # An audit replica still terminating may answer /mutate (shaping nothing) while an enforce one
    # answers /validate: NotShaped, whose message says to create the pod again, as a user would.
    full = wait_for("a create decided by enforce mode alone", lambda: (
        r if "was not shaped by gpu-placement" not in (r := adoption.gpu_pod(opted, "over-again")).text else None),
        timeout=30, interval=1)
    assert full.status_code == 403 and f"namespace {opted} may use 1 nvidia.com/gpu" in full.text, full.text
    later = adoption.namespace("team-next", opted_in=True, annotations={QUOTA: "nvidia.com/gpu=4"})
    wait_for("the new namespace's quota", lambda: adoption.quota_in_force(later), timeout=30, interval=0.5)
    adoption.gate_open(later)
    assert created(later, "shaped")["spec"]["schedulerName"] == "gpu-placement"

    # One namespace misbehaves (the way back): remove its label. Its quota goes; its pods are left alone.
    unlabel = {"metadata": {"labels": {"gpu-placement.io/enabled": None}}}
    adoption.api.merge_patch(f"/api/v1/namespaces/{opted}", unlabel)
    wait_for("the quota of the namespace that left", lambda: adoption.quota(opted) is None, timeout=30, interval=0.5)
    names = iter(range(100))
    wait_for("its pods no longer shaped", lambda: created(opted, f"left-{next(names)}", gpus=1)["spec"][
        "schedulerName"] == "default-scheduler", timeout=10, interval=0.2)

    # The emergency stop (the way back): delete both configurations. Admission stops at once, and the
    # quotas go with their owner; `helm upgrade` puts the configurations back, a replica their webhooks.
    started = time.monotonic()
    for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        adoption.api.delete(f"{ADMISSION}/{kind}/{RELEASE}")
    wait_for("the quotas and device taints gone with their owner", lambda: adoption.quota(later) is None and
             adoption.taint_rule("adopt-dra") is None, timeout=60, interval=0.5)
    steps["emergency stop: quotas gone"] = time.monotonic() - started
    assert created(later, "unchecked")["spec"]["schedulerName"] == "default-scheduler"
    started = time.monotonic()
    adoption.helm.upgrade(str(CHART), RELEASE, {}, namespace=NAMESPACE, wait="watcher", timeout=180)
    wait_for("the webhooks written again", lambda: all(adoption.webhooks().values()), timeout=60, interval=0.5)
    steps["helm upgrade: webhooks back"] = time.monotonic() - started
    wait_for("the quota mirrored again", lambda: adoption.quota_in_force(later), timeout=60, interval=0.5)
    adoption.gate_open(later)
    steps["helm upgrade: quota back"] = time.monotonic() - started
    wait_for("the device taint back", lambda: adoption.taint_effect("adopt-dra") == "NoSchedule", timeout=60,
             interval=0.5)
    assert created(later, "shaped-again")["spec"]["schedulerName"] == "gpu-placement"

    # Uninstall: the webhooks, the mirrored quotas (their owner goes) and every cluster-scoped object.
    started = time.monotonic()
    adoption.uninstall()
    steps["uninstall"] = time.monotonic() - started
    wait_for("nothing left behind", lambda: not adoption.left_behind(), timeout=60, interval=0.5)
    assert adoption.left_behind() == []
    assert adoption.api.http.get(f"/api/v1/namespaces/{opted}/pods/shaped").status_code == 200, \
        "running pods are not touched"
    r = adoption.gpu_pod(opted, "after")
    assert r.status_code == 201 and r.json()["spec"]["schedulerName"] == "default-scheduler", r.text
    print("\n" + "\n".join(f"  {step:<26} {seconds:5.1f} s" for step, seconds in steps.items()))


def test_on_a_cluster_serving_openshift_security_the_ids_are_left_to_the_platform(adoption: Adoption) -> None:
    """`openshift.adaptSecurityContext: auto` asks the cluster (Helm's capabilities, from discovery):
    with security.openshift.io/v1 served (here by a CRD of that group), no fixed UID or GID."""
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "securitycontextconstraints.security.openshift.io"},
           "spec": {"group": "security.openshift.io", "scope": "Cluster",
                    "names": {"plural": "securitycontextconstraints", "singular": "securitycontextconstraints",
                              "kind": "SecurityContextConstraints"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                        "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

    def contexts() -> list[Obj]:
        """`helm install --dry-run=server`: rendered with the capabilities Helm reads from the cluster
        (a fresh configuration each time: Helm keeps what it read once per configuration)."""
        kubeconfig = adoption.plane.work / "helm.kubeconfig"
        with helm_python.Config(kubeconfig_path=kubeconfig, namespace="default") as helm:
            release = helm.install(str(CHART), "probe", {}, namespace="default", dry_run="server")
        docs = [d for d in yaml.safe_load_all(release["manifest"]) if d and d["kind"] == "Deployment"]
        pods = [d["spec"]["template"]["spec"] for d in docs]
        assert len(pods) == 2
        return [p["securityContext"] for p in pods] + [c["securityContext"] for p in pods for c in
                                                       [*p.get("initContainers", []), *p["containers"]]]

    assert all(c.get("runAsUser") == 65532 for c in contexts()), "elsewhere: the image's user"
    assert adoption.api.create(path, crd).status_code == 201
    try:
        wait_for("security.openshift.io/v1 in discovery", lambda: adoption.api.http.get(
            "/apis/security.openshift.io/v1").status_code == 200, timeout=30)
        adapted = contexts()
        assert adapted and all(not {"runAsUser", "runAsGroup", "fsGroup"} & c.keys() for c in adapted), adapted
        assert all(c["runAsNonRoot"] is True for c in adapted)
    finally:
        adoption.api.delete(f"{path}/securitycontextconstraints.security.openshift.io")
