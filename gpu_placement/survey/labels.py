"""Who wrote a node's GPU labels, read from the Node's own `metadata.managedFields`.

The API server records, for every write that is not a server-side apply, the writer's field manager:
the request's `fieldManager`, else its User-Agent up to the first `/` (apiserver
pkg/endpoints/handlers/create.go, `managerOrUserAgent`). A field changed by an update moves to its
writer; a field written again with the same value keeps its owner (structured-merge-diff
merge/update.go, `Updater.Update`). So a label a person set by hand still names `kubectl-label`
(kubectl's own --field-manager default, kubectl pkg/cmd/label/label.go) even after GPU Feature
Discovery publishes the same value: that is what a leftover looks like.

The automated writers of GPU labels, checked in their sources:
- `nfd-master`: GPU Feature Discovery writes its labels to a features.d file or a NodeFeature object
  (NVIDIA/k8s-device-plugin internal/lm/output.go); nfd-master copies them onto the Node with a JSON
  patch through client-go's default User-Agent, the binary's name (kubernetes-sigs/
  node-feature-discovery pkg/nfd-master/nfd-master.go `patchNode`), and lists them in the annotation
  `nfd.node.kubernetes.io/feature-labels`. The same for NFD's own `feature.node.kubernetes.io/*`.
- `gpu-operator`: the operator's NodeLabelingReconciler sets `nvidia.com/gpu.present` and the
  `nvidia.com/gpu.deploy.*` labels (NVIDIA/gpu-operator controllers/nodelabeling_controller.go; the
  binary is /usr/bin/gpu-operator), and its upgrade controller `nvidia.com/gpu-driver-upgrade-state`.
- `driver-manager`: k8s-driver-manager, the driver pod's init container, pauses operands and writes
  `nvidia.com/gpu.deploy.driver=pre-installed` (NVIDIA/k8s-driver-manager cmd/driver-manager).
Labels a node is registered with are not set by hand either: the kubelet writes `--node-labels` when
it registers the Node (field manager `kubelet`), which is how node pools label their nodes (EKS node
groups and GKE node pools, including `nvidia.com/gpu.present=true` on GPU pools), and Karpenter copies
its NodePool's labels onto the Node it made (its client's User-Agent, hence manager, is `karpenter`).
They stay as the pool defines them: not leftovers to remove.

The GPU labels counted are NVIDIA's: `nvidia.com/*` and NFD's NVIDIA PCI labels
(`feature.node.kubernetes.io/pci-*10de*`); NFD's CPU, kernel, USB and other PCI labels are no GPU's.
Labels people set by design are not counted: `nvidia.com/mig.config`, `nvidia.com/device-plugin.config`,
`nvidia.com/gpu.workload.config`, `nvidia.com/gpu.deploy.*` (`operands=false` is the documented way
to keep the operator off a node), and the MIG manager's own `nvidia.com/mig.config.state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["AUTOMATED", "REGISTRATION", "LabelWriters", "is_stack_label", "label_writers"]

AUTOMATED: dict[str, str] = {
    "nfd-master": "NFD (GPU Feature Discovery's labels go through nfd-master)",
    "nfd-worker": "NFD worker (NFD before v0.14)",
    "gpu-operator": "the GPU Operator",
    "driver-manager": "the GPU Operator's k8s-driver-manager",
}
# Who labels a node as it is registered, from its pool's definition.
REGISTRATION: dict[str, str] = {
    "kubelet": "the kubelet at registration (--node-labels: a node pool's labels)",
    "karpenter": "Karpenter (its NodePool's labels)",
}
_NFD_PCI = "feature.node.kubernetes.io/pci-"
_NVIDIA_PCI_VENDOR = "10de"
_SET_BY_PEOPLE = frozenset({"nvidia.com/mig.config", "nvidia.com/mig.config.state", "nvidia.com/device-plugin.config",
                            "nvidia.com/gpu.workload.config"})
_DEPLOY_PREFIX = "nvidia.com/gpu.deploy."


def is_stack_label(key: str) -> bool:
    """An NVIDIA GPU label GPU Feature Discovery, NFD or the GPU Operator publishes (not one people set by
    design): nvidia.com/*, and NFD's PCI labels of NVIDIA devices (vendor 10de)."""
    nvidia = key.startswith("nvidia.com/") or (key.startswith(_NFD_PCI) and _NVIDIA_PCI_VENDOR in key)
    return nvidia and key not in _SET_BY_PEOPLE and not key.startswith(_DEPLOY_PREFIX)


@dataclass(slots=True, frozen=True)
class LabelWriters:
    """Each label's field managers, as the Node's managedFields record them."""

    known: bool  # the object carries managedFields (`kubectl get -o json` leaves them out unless --show-managed-fields)
    owners: Mapping[str, frozenset[str]]  # label key -> managers

    def by_hand(self, labels: Mapping[str, str]) -> dict[str, str]:
        """GPU-stack labels present on the node whose only writers are neither the stack's own nor the node's
        registration: key -> writers."""
        found = {}
        for key in sorted(labels):
            owners = self.owners.get(key)
            if is_stack_label(key) and owners and not owners & (AUTOMATED.keys() | REGISTRATION.keys()):
                found[key] = ", ".join(sorted(owners))
        return found

    def written_by(self, key: str, manager: str) -> bool:
        return manager in self.owners.get(key, frozenset())


def label_writers(obj: Mapping[str, Any]) -> LabelWriters:
    """The label owners of a Node (any object) from its managedFields; malformed entries are skipped."""
    entries = (obj.get("metadata") or {}).get("managedFields")
    if not isinstance(entries, list) or not entries:
        return LabelWriters(False, {})
    owners: dict[str, set[str]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("subresource"):  # status writes hold no labels
            continue
        manager = entry.get("manager")
        fields = ((entry.get("fieldsV1") or {}).get("f:metadata") or {}).get("f:labels")
        if not isinstance(manager, str) or not isinstance(fields, dict):
            continue
        for field in fields:
            if isinstance(field, str) and field.startswith("f:"):
                owners.setdefault(field[2:], set()).add(manager)
    return LabelWriters(True, {key: frozenset(managers) for key, managers in owners.items()})
