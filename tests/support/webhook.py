"""Shared by the webhook tests: the real service app over HTTPS, a client that trusts only the
generated CA, and the checks every returned patch goes through.
"""

from __future__ import annotations

import base64
import copy
import itertools
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import orjson
from kubernetes.client import ApiClient, V1Pod

from gpu_placement.base.config import Config, parse_config
from gpu_placement.samples.cluster import make_pod, namespace
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import KINDS, Ingest
from gpu_placement.web.certs import CertBundle, write_bundle
from gpu_placement.web.patching import apply_patch
from gpu_placement.web.serving import ServerThread
from gpu_placement.web.tls import ReloadingTLS, make_server
from webhook.app import create_app

Obj = dict[str, Any]

TEST_CONFIG: Obj = {
    "defaultNamespacePolicy": "deny",
    "pools": {
        "training": {"nodeSelector": {"pool": "training"},
                     "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "training",
                                      "effect": "NoSchedule"}]},
        "inference": {"nodeSelector": {"example.com/pool": "inference", "zone": "a"}},
    },
}

NAMESPACES = [
    namespace("team-a", {"gpu-placement.io/quota": "nvidia.com/gpu=4", "gpu-placement.io/pools": "training"}),
    namespace("multi", {"gpu-placement.io/quota": "nvidia.com/gpu=8", "gpu-placement.io/pools": "training,inference"}),
    namespace("inference", {"gpu-placement.io/sharing": "shared", "gpu-placement.io/gpu-memory": "2Gi",
                            "gpu-placement.io/quota": "nvidia.com/gpu.shared=4"}),
    namespace("mig-lab", {"gpu-placement.io/sharing": "mig-1g.10gb",
                          "gpu-placement.io/quota": "nvidia.com/mig-1g.10gb=2"}),
    namespace("research", {"gpu-placement.io/quota": "nvidia.com/gpu=2"}),
    namespace("flex", {"gpu-placement.io/quota": "nvidia.com/gpu=4,nvidia.com/gpu.shared=8"}),
    namespace("web"),
    namespace("broken", {"gpu-placement.io/quota": "nvidia.com/gpu=４"}),
    namespace("kube-system"),
]
RUNNING = [
    make_pod("research", "old-a", gpus={"nvidia.com/gpu": 1}, node="gpu-1"),
    make_pod("research", "old-b", gpus={"nvidia.com/gpu": 1}, node="gpu-2"),
    make_pod("research", "done", gpus={"nvidia.com/gpu": 4}, node="gpu-3", phase="Succeeded"),
]
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
PODS = {"group": "", "version": "v1", "resource": "pods"}
_uids = itertools.count(1)


def certificates(directory: Path) -> CertBundle:
    return write_bundle(directory, "gpu-placement-webhook", "gpu-placement", ("localhost", "127.0.0.1"))


def trusting(bundle: CertBundle) -> ssl.SSLContext:
    """A client context that trusts the bundle's CA and nothing else (no system roots)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(bundle.ca_cert))
    assert len(context.get_ca_certs()) == 1
    return context


def user_pod(ns: str, name: str | None = "job", gpus: dict[str, int] | None = None, **kwargs: Any) -> Obj:
    """A pod as a user or a controller sends it: no status; name None = from a Deployment (generateName)."""
    pod = make_pod(ns, name or "x", gpus=gpus, **kwargs)
    del pod["status"]
    if name is None:
        meta = pod["metadata"]
        del meta["name"], meta["namespace"], meta["uid"]
        meta["generateName"] = "web-7d4b9c-"
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d4b9c",
                                    "uid": "rs-1", "controller": True}]
    return pod


def review(pod: Any, ns: str, *, operation: str = "CREATE", dry_run: bool = False, uid: str | None = None,
           kind: Obj | None = None, resource: Obj | None = None, sub: str | None = None) -> Obj:
    request: Obj = {"uid": uid or f"uid-{next(_uids)}", "kind": kind or POD_KIND, "resource": resource or PODS,
                    "namespace": ns, "operation": operation, "userInfo": {"username": "alice"},
                    "object": pod, "dryRun": dry_run}
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get("name", ""), str):
        request["name"] = meta.get("name", "")
    if sub:
        request["subResource"] = sub
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def as_v1pod(pod: Obj) -> V1Pod:
    """The pod through the kubernetes client's own deserializer: pydantic models reject wrong shapes."""
    result = ApiClient().deserialize(orjson.dumps(pod).decode(), "V1Pod", "application/json")
    assert isinstance(result, V1Pod)
    return result


def patch_of(response: Obj) -> list[Obj]:
    if "patch" not in response:
        assert "patchType" not in response
        return []
    assert response["patchType"] == "JSONPatch"
    ops = orjson.loads(base64.b64decode(response["patch"]))
    assert ops, "an empty patch must be left out"
    return ops


@dataclass
class Webhook:
    config: Config
    view: ClusterView
    ingest: Ingest
    app: Any
    client: httpx.Client
    clock: list[float]

    def post(self, path: str, body: bytes | Obj, **headers: str) -> httpx.Response:
        content = body if isinstance(body, bytes) else orjson.dumps(body)
        return self.client.post(path, content=content, headers={"Content-Type": "application/json", **headers})

    def answer(self, path: str, body: Obj) -> Obj:
        """The AdmissionReview response, checked for shape and the echoed uid."""
        http = self.post(path, body)
        assert http.status_code == 200, http.text
        assert http.headers["content-type"] == "application/json"
        reply = http.json()
        assert reply["apiVersion"] == "admission.k8s.io/v1" and reply["kind"] == "AdmissionReview"
        assert reply["response"]["uid"] == body["request"]["uid"]
        return reply["response"]

    def mutate(self, pod: Obj, ns: str, **kwargs: Any) -> tuple[Obj, list[Obj], Obj]:
        """/mutate, the patch applied with jsonpatch (and with the project's own applier: same result),
        the result read as a V1Pod, then sent again: it must come back with no patch."""
        response = self.answer("/mutate?timeout=10s", review(pod, ns, **kwargs))
        assert response["allowed"] is True
        ops = patch_of(response)
        mutated = jsonpatch.apply_patch(pod, ops)
        assert mutated == apply_patch(pod, ops)
        as_v1pod(mutated)
        again = self.answer("/mutate", review(copy.deepcopy(mutated), ns, **kwargs))
        assert again["allowed"] is True
        assert patch_of(again) == [], f"not idempotent: {patch_of(again)}"
        return mutated, ops, response

    def validate(self, pod: Obj, ns: str, **kwargs: Any) -> Obj:
        return self.answer("/validate?timeout=10s", review(pod, ns, **kwargs))

    def admit(self, pod: Obj, ns: str, **kwargs: Any) -> tuple[Obj, Obj]:
        """Mutate, then validate the mutated pod, as the API server does."""
        mutated, _, _ = self.mutate(pod, ns, **kwargs)
        return mutated, self.validate(mutated, ns, **kwargs)

    def create(self, pod: Obj, ns: str, name: str | None = None) -> Obj:
        """What the API server then stores: named, namespaced, pending, and seen by the view."""
        stored = copy.deepcopy(pod)
        meta = stored.setdefault("metadata", {})
        meta["namespace"] = ns
        meta["name"] = meta.get("name") or name or f"{meta.get('generateName', 'pod-')}{next(_uids)}"
        meta.setdefault("uid", f"uid-{ns}-{meta['name']}")
        stored["status"] = {"phase": "Pending"}
        self.ingest.event(self.view, "pods", "ADDED", stored)
        return stored

    def reset(self) -> None:
        with self.view.lock:
            self.ingest.replace(self.view, "namespaces", copy.deepcopy(NAMESPACES))
            self.ingest.replace(self.view, "nodes", [])
            self.ingest.replace(self.view, "pods", copy.deepcopy(RUNNING))
        self.app.state.admission.reservations._by_namespace.clear()


@contextmanager
def serving(bundle: CertBundle, config: Obj | None = None) -> Iterator[Webhook]:
    """The real app (`webhook.app.create_app`) on a free loopback port, TLS with the bundle's pair."""
    parsed = parse_config(TEST_CONFIG if config is None else config)
    clock = [1000.0]
    view = ClusterView(parsed, clock=lambda: clock[0])
    ingest = Ingest(parsed)
    for kind in KINDS:
        ingest.replace(view, kind, [])
    app = create_app(view, parsed, lambda: (True, ""))
    tls = ReloadingTLS(bundle.cert, bundle.key)
    with ServerThread(make_server(app, "127.0.0.1", 0, tls=tls)) as server, \
            httpx.Client(base_url=f"https://localhost:{server.port}", verify=trusting(bundle), timeout=10) as client:
        hook = Webhook(parsed, view, ingest, app, client, clock)
        hook.reset()
        yield hook


def find(ops: list[Obj], path: str) -> list[Obj]:
    return [op for op in ops if op["path"] == path]


def denial(verdict: dict) -> str:
    assert verdict["allowed"] is False, verdict
    status = verdict["status"]
    assert status["code"] == 403 and status["reason"] == "Forbidden" and status["status"] == "Failure"
    return status["message"]
