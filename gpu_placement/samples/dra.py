"""What NVIDIA's DRA driver publishes, built as the API serves it: for tests, the e2e harness (which
plays the driver's kubelet plugin) and the demo.

Shapes from dra-driver-nvidia-gpu v0.4.1: `cmd/gpu-kubelet-plugin/deviceinfo.go` (GPU attributes,
capacity `memory` in bytes), `mig.go` (MIG attributes), `driver.go` (one pool per node, named after
it), and the chart's `deviceclass-gpu.yaml` / `deviceclass-mig.yaml` (the gpu.nvidia.com class
names `extendedResourceName: nvidia.com/gpu` when served as resource.k8s.io/v1). `consumable`: what
kubernetes-sigs/dra-driver-nvidia-gpu v0.5 publishes with its `ConsumableShares` feature gate and
`--consumable-shares=memory` (cmd/gpu-kubelet-plugin/consumable_shares.go `applyConsumableShares`):
`allowMultipleAllocations: true`, `memory` rounded down to whole MiB (BinarySI), `requestPolicy` with
default all of it and validRange min 1Mi, max all of it, step 1Mi.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["H100", "Gpu", "device_classes", "resource_slice", "shareable"]

Obj = dict[str, Any]
DRIVER = "gpu.nvidia.com"


@dataclass(slots=True, frozen=True)
class Gpu:
    product: str = "NVIDIA H100 80GB HBM3"
    memory_bytes: int = 85520809984  # nvidia-smi's 81559 MiB
    driver: str = "570.124.6"  # semver, as the plugin normalises it (570.124.06 on nvidia-smi)
    cuda: str = "12.8.0"
    compute: str = "9.0.0"
    architecture: str = "Hopper"
    brand: str = "Nvidia"


H100 = Gpu()


def _device(node: str, minor: int, gpu: Gpu, taints: list[Obj] | None) -> Obj:
    device: Obj = {
        "name": f"gpu-{minor}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{node}-{minor:04d}"},
            "productName": {"string": gpu.product},
            "brand": {"string": gpu.brand},
            "architecture": {"string": gpu.architecture},
            "cudaComputeCapability": {"version": gpu.compute},
            "driverVersion": {"version": gpu.driver},
            "cudaDriverVersion": {"version": gpu.cuda},
            "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x18 + minor:02x}:00.0"},
        },
        "capacity": {"memory": {"value": str(gpu.memory_bytes)}},
    }
    if taints:
        device["taints"] = taints
    return device


def shareable(device: Obj) -> Obj:
    """The device as `--consumable-shares=memory` publishes it: shared by memory."""
    mib = int(device["capacity"]["memory"]["value"]) // 2**20
    whole = f"{mib}Mi"
    device["allowMultipleAllocations"] = True
    device["capacity"]["memory"] = {"value": whole, "requestPolicy": {
        "default": whole, "validRange": {"min": "1Mi", "max": whole, "step": "1Mi"}}}
    return device


def _mig(node: str, index: int, gpu: Gpu, profile: str, memory_bytes: int) -> Obj:
    """One MIG device of GPU 0 (mig.go: type `mig`, `profile` as go-nvlib prints it, `parentUUID`)."""
    device = _device(node, 0, gpu, None)
    device["name"] = f"gpu-0-mig-{profile.replace('.', '-')}-{index}"
    device["attributes"].update({"type": {"string": "mig"}, "profile": {"string": profile},
                                 "uuid": {"string": f"MIG-{node}-{index:04d}"},
                                 "parentUUID": {"string": f"GPU-{node}-0000"}})
    device["capacity"] = {"memory": {"value": str(memory_bytes)}}
    return device


def resource_slice(node: str, count: int = 1, gpu: Gpu = H100, *, version: str = "v1", generation: int = 1,
                   taints: dict[int, list[Obj]] | None = None, mig: tuple[str, int, int] | None = None,
                   consumable: bool = False) -> Obj:
    """The kubelet plugin's one ResourceSlice for a node with `count` whole GPUs (`taints`: by minor,
    the driver's own health taints); `mig` (profile, how many, memory in bytes): GPU 0 partitioned
    into that many MIG devices instead; `consumable`: every device shared by memory (`shareable`)."""
    devices = [_device(node, minor, gpu, (taints or {}).get(minor)) for minor in range(count)]
    if mig is not None:
        profile, how_many, memory_bytes = mig
        devices = [_mig(node, i, gpu, profile, memory_bytes) for i in range(how_many)] + devices[1:]
    if consumable:
        devices = [shareable(device) for device in devices]
    return {
        "apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-gpus"},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices},
    }


def device_classes(version: str = "v1") -> list[Obj]:
    """gpu.nvidia.com and mig.nvidia.com, as the driver's chart installs them."""
    def cel(kind: str) -> list[Obj]:
        return [{"cel": {"expression": f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == "
                                       f"'{kind}'"}}]

    gpu: Obj = {"selectors": cel("gpu")}
    if version == "v1":
        gpu["extendedResourceName"] = "nvidia.com/gpu"
    return [{"apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
             "spec": gpu},
            {"apiVersion": f"resource.k8s.io/{version}", "kind": "DeviceClass", "metadata": {"name": "mig.nvidia.com"},
             "spec": {"selectors": cel("mig")}}]
