"""DRA on the real control plane: the resource.k8s.io path and the devices a pod's claims were allocated."""

from __future__ import annotations

from typing import Any

from tests.e2e.conftest import E2E

Obj = dict[str, Any]
RESOURCE = "/apis/resource.k8s.io/v1"


def allocation(e2e: E2E, ns: str, pod: str) -> list[Obj]:
    """The devices the pod's claims were allocated (empty: none yet)."""
    status = e2e.pod(ns, pod).get("status", {})
    names = [c.get("resourceClaimName") for c in status.get("resourceClaimStatuses", [])]
    names.append((status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName"))  # DRAExtendedResource
    results: list[Obj] = []
    for name in filter(None, names):
        got = e2e.api.get(f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}")
        results += got.get("status", {}).get("allocation", {}).get("devices", {}).get("results", [])
    return results
