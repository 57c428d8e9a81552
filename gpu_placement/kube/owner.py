"""The owner of what the service writes into the cluster: the release's ValidatingWebhookConfiguration.

Mirrored ResourceQuotas and DRA DeviceTaintRules carry it as their ownerReference, so the garbage
collector deletes them with it: `helm uninstall`, or the emergency stop (deleting the configurations
by hand), leaves no hard quota and no device taint behind. The writers read it on every turn of their
leader (one GET): while it is missing or being deleted they write nothing (it would be left behind),
and when Helm recreates it (a new uid) they write everything again at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiClient

from gpu_placement.kube.api import OBJECT_TIMEOUT, get_or_none

__all__ = ["Owner"]

log = logging.getLogger("gpu_placement.owner")


@dataclass(slots=True)
class Owner:
    name: str  # the ValidatingWebhookConfiguration
    writer: str  # who reads it, for the log line ("quota mirror", "DRA taints")
    ref: dict[str, Any] | None = None  # the ownerReference for this turn's writes; None: write nothing
    _missing: bool = False

    def read(self, api: ApiClient) -> bool:
        """Read the owner; True when its reference changed (then everything is due again)."""
        before = self.ref
        path = f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{self.name}"
        found = get_or_none(api, path, timeout=OBJECT_TIMEOUT)
        if found is None:
            self.ref = None
            if not self._missing:
                log.warning("%s: ValidatingWebhookConfiguration %s does not exist (the release is being uninstalled, "
                            "or it was deleted by hand): nothing is written until it is back", self.writer, self.name)
            self._missing = True
            return self.ref != before
        meta = found.get("metadata") or {}
        self._missing = False
        self.ref = None if meta.get("deletionTimestamp") else {
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
            "name": self.name, "uid": meta.get("uid")}
        return self.ref != before
