"""The extender over HTTP (the real app on a loopback port) and the pods and nodes kube-scheduler sends it,
in the shapes it sends them."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import httpx
import orjson

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config
from gpu_placement.samples.cluster import demo_objects, namespace, validator_pod
from gpu_placement.web.serving import ServerThread, make_server

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"


class Extender:
    def __init__(self, objects: list[dict[str, Any]], config: Config | None = None, max_body: int | None = None,
                 ready: Callable[[], tuple[bool, str]] | None = None) -> None:
        self.core = core_from_objects(config or Config(), objects)
        if ready is not None:
            self.core.readiness = ready
        app = self.core.extender_app(max_body) if max_body is not None else self.core.extender_app()
        self.server = ServerThread(make_server(app, "127.0.0.1", 0)).start()
        self.http = httpx.Client(base_url=self.server.url(""), timeout=5)

    def post(self, verb: str, body: Any) -> httpx.Response:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        return self.http.post(f"/{verb}", content=content, headers={"Content-Type": "application/json"})

    def filter(self, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
        """The answer, with the passing names put back in the order asked: the extender sends them in
        no particular order (kube-scheduler looks each one up), but each at most once and only names
        it was asked about, or kube-scheduler fails the cycle."""
        response = self.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
        assert response.status_code == 200, response.text
        answer = response.json()
        passed = answer["NodeNames"]
        if passed is not None:
            assert len(set(passed)) == len(passed) and set(passed) <= set(names), passed
            answer["NodeNames"] = [name for name in names if name in set(passed)]
        return answer

    def close(self) -> None:
        self.http.close()
        self.server.stop()


DEMO_NODES = sorted(obj["metadata"]["name"] for obj in demo_objects() if obj["kind"] == "Node")


def api_pod(name: str = "train-7f9c", namespace: str = "team-a", gpus: int = 1,
            image: str = "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04", resource: str = GPU,
            annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod as kube-scheduler's cache holds it: no kind or apiVersion, managedFields, status with a
    PodScheduled condition from an earlier attempt, several containers and an init container."""
    return {
        "metadata": {
            "name": name, "generateName": name.rsplit("-", 1)[0] + "-", "namespace": namespace,
            "uid": f"8a1e2f3c-{name}", "resourceVersion": "48213", "creationTimestamp": "2025-06-01T10:00:00Z",
            "labels": {"app": "train", "batch.kubernetes.io/job-name": "train"},
            "annotations": {"gpu-placement.io/admitted": "exclusive", **(annotations or {})},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "0b1c",
                                 "controller": True, "blockOwnerDeletion": True}],
            "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                               "time": "2025-06-01T10:00:00Z", "fieldsType": "FieldsV1",
                               "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}},
                                            "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}}}}}},
                              {"manager": "kube-scheduler", "operation": "Update", "apiVersion": "v1",
                               "time": "2025-06-01T10:00:01Z", "fieldsType": "FieldsV1", "subresource": "status",
                               "fieldsV1": {"f:status": {"f:conditions": {}}}}],
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-x", "projected": {"sources": [{"serviceAccountToken": {
                "expirationSeconds": 3607, "path": "token"}}], "defaultMode": 420}}],
            "initContainers": [{"name": "fetch-weights", "image": "busybox:1.36", "command": ["sh", "-c", "true"],
                                "resources": {"requests": {"cpu": "100m"}}, "imagePullPolicy": "IfNotPresent"}],
            "containers": [
                {"name": "main", "image": image, "command": ["python", "train.py"],
                 "env": [{"name": "RANK", "value": "0"}],
                 "resources": {"limits": {"cpu": "8", "memory": "64Gi", resource: str(gpus)},
                               "requests": {"cpu": "8", "memory": "64Gi", resource: str(gpus)}},
                 "volumeMounts": [{"name": "kube-api-access-x", "readOnly": True,
                                   "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                 "terminationMessagePath": "/dev/termination-log", "imagePullPolicy": "IfNotPresent"},
                {"name": "metrics", "image": "prom/node-exporter:v1.8.1", "resources": {}},
            ],
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "securityContext": {}, "schedulerName": "gpu-placement",
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                             "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Pending", "qosClass": "Burstable",
            "conditions": [{"type": "PodScheduled", "status": "False", "lastProbeTime": None,
                            "lastTransitionTime": "2025-06-01T10:00:01Z", "reason": "Unschedulable",
                            "message": "0/15 nodes are available: 11 NoGPU."}],
        },
    }


def api_node(obj: dict[str, Any]) -> dict[str, Any]:
    """A Node as a NodeList item: no kind or apiVersion, with managedFields."""
    node = {k: copy.deepcopy(v) for k, v in obj.items() if k not in ("kind", "apiVersion")}
    node["metadata"]["managedFields"] = [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                                          "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]
    node["metadata"]["resourceVersion"] = "1001"
    return node


def _shape(value: Any) -> Any:
    """Keys and JSON types, recursively through objects: what a Go decoder of these structs relies on."""
    if isinstance(value, dict):
        return {key: _shape(item) for key, item in value.items()}
    return type(value).__name__


def cluster(*nodes: dict[str, Any], extra: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
    """Nodes with Ready validators, an exclusive namespace and a shared one."""
    objects: list[dict[str, Any]] = [
        namespace("train"),  # no sharing annotation: exclusive, the default
        namespace("serve", {"gpu-placement.io/sharing": "shared"}),
    ]
    for node in nodes:
        objects += [node, validator_pod(node["metadata"]["name"])]
    return [*objects, *extra]


def verdict(answer: dict[str, Any], node: str) -> str:
    """"pass", or which map the node failed in and why."""
    if node in (answer["NodeNames"] or []):
        return "pass"
    if node in answer["FailedNodes"]:
        return "resolvable " + answer["FailedNodes"][node]
    return "unresolvable " + answer["FailedAndUnresolvableNodes"][node]
