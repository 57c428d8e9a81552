"""Which version of resource.k8s.io the API server serves, for the view and for DeviceTaintRules.

Discovery (`GET /apis/resource.k8s.io`, then each version's resource list), as kubectl finds what a
server has. Kubernetes 1.37 serves everything at v1 (DeviceTaintRule GA there, k8s.io/api
resource/v1 types.go at v0.37.2); 1.36 has DeviceTaintRule at v1beta2 behind `DRADeviceTaintRules`,
1.35 at v1alpha3. A server that does not serve the group leaves DRA off: nothing is listed and
nothing changes for device-plugin pods.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from kubernetes.client import ApiClient

from gpu_placement.facts.dra import DRA_KINDS
from gpu_placement.kube.api import OBJECT_TIMEOUT, get, get_or_none

__all__ = ["GROUP", "DraApi", "discover"]

log = logging.getLogger("gpu_placement.dra")
GROUP = "resource.k8s.io"
_VIEW_VERSIONS = ("v1", "v1beta2", "v1beta1")  # the view's four kinds, newest first
_TAINT_VERSIONS = ("v1", "v1beta2", "v1alpha3")  # DeviceTaintRule, newest first


@dataclass(slots=True, frozen=True)
class DraApi:
    version: str | None = None  # serves the view's kinds (resourceslices, deviceclasses, claims, templates)
    taint_version: str | None = None  # serves devicetaintrules

    @property
    def served(self) -> bool:
        return self.version is not None

    @property
    def claims_from_templates(self) -> bool:
        """gpu-placement writes ResourceClaimTemplates only in the `exactly` request shape (v1, v1beta2)."""
        return self.version in ("v1", "v1beta2")

    def path(self, kind: str, version: str | None = None) -> str:
        return f"/apis/{GROUP}/{version or self.version}/{kind}"

    def paths(self) -> dict[str, str]:
        return {kind: self.path(kind) for kind in DRA_KINDS} if self.served else {}


def discover(api: ApiClient) -> DraApi:
    """Raises ApiError or urllib3's HTTPError when the API server cannot say (the caller retries)."""
    group = get_or_none(api, f"/apis/{GROUP}", timeout=OBJECT_TIMEOUT)
    if group is None:
        return DraApi()
    offered = {v.get("version") for v in group.get("versions") or () if isinstance(v, dict)}
    resources: dict[str, set[str]] = {}
    for version in dict.fromkeys((*_VIEW_VERSIONS, *_TAINT_VERSIONS)):
        if version not in offered:
            continue
        body = get(api, f"/apis/{GROUP}/{version}", timeout=OBJECT_TIMEOUT)
        resources[version] = {name for r in body.get("resources") or ()
                              if isinstance(r, dict) and isinstance(name := r.get("name"), str)}
    view = next((v for v in _VIEW_VERSIONS if set(DRA_KINDS) <= resources.get(v, set())), None)
    taints = next((v for v in _TAINT_VERSIONS if "devicetaintrules" in resources.get(v, set())), None)
    return DraApi(view, taints)
