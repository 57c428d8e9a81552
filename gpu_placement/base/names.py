"""Label and annotation keys, in one place: what the GPU Operator publishes and what we read."""

from __future__ import annotations

# GPU Feature Discovery / GPU Operator node labels.
GPU_PRESENT = "nvidia.com/gpu.present"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_MEMORY = "nvidia.com/gpu.memory"
GPU_REPLICAS = "nvidia.com/gpu.replicas"
GPU_SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
GPU_FAMILY = "nvidia.com/gpu.family"
COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
MIG_PREFIX = "nvidia.com/mig-"
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
DRIVER_UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
# Driver version: the current labels first, then the deprecated ones GFD still writes.
DRIVER_FULL = "nvidia.com/cuda.driver-version.full"
DRIVER_PARTS = ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor",
                "nvidia.com/cuda.driver-version.revision")
DRIVER_PARTS_OLD = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev")
# Highest CUDA the driver supports (GFD calls it "runtime"; it is not an installed runtime).
CUDA_RUNTIME = ("nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor")
CUDA_RUNTIME_OLD = ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor")

UPGRADE_DONE = "upgrade-done"
UPGRADE_REQUIRED = "upgrade-required"
UPGRADE_FAILED = "upgrade-failed"

# Resources.
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
# Every DeviceClass also answers to this extended resource name with its own name after it
# (resourceapi.ResourceDeviceClassPrefix, k8s.io/api resource/v1; DRAExtendedResource, GA in 1.37).
IMPLICIT_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
# The stand-in extended resources a claim pod of a `dra` namespace asks one of per device, by level
# (gpu_placement/facts/sharing.py `standin_of`): the API server's pod quota charges them atomically at the
# pod's create. No node has them; the chart's scheduler profile ignores the group for node fit.
STANDIN_GROUP = "gpu-placement.io"

# Our annotations (pods and namespaces).
PREFIX = "gpu-placement.io/"
ANN_CUDA = PREFIX + "cuda"
ANN_CUDA_COMPAT = PREFIX + "cuda-compat"
ANN_MIN_DRIVER = PREFIX + "min-driver"
ANN_MIN_COMPUTE = PREFIX + "min-compute-capability"
ANN_PRODUCTS = PREFIX + "gpu-products"
ANN_GPU_MEMORY = PREFIX + "gpu-memory"
ANN_SHARING = PREFIX + "sharing"
ANN_QUOTA = PREFIX + "quota"
ANN_POOLS = PREFIX + "pools"
ANN_ADMITTED = PREFIX + "admitted"
ANN_CANARY = PREFIX + "canary"  # namespace: "true" takes new drivers first (docs/rollouts.md)
ANN_ALLOCATION = PREFIX + "allocation"  # namespace: device-plugin | dra
# Node annotation the rollout leader writes: the driver version the node last ran settled (past its soak,
# or excused from it). A driver pod of that version is a reinstall, not a change (docs/rollouts.md).
ANN_SETTLED_DRIVER = PREFIX + "settled-driver"
# Node annotation the fence leader writes: the node's launch fences per GPU resource, with when each began
# and what lifted the last (JSON; gpu_placement/facts/fence.py, docs/rules.md LaunchFailures).
ANN_LAUNCH_FENCE = PREFIX + "launch-fence"
# Node label the refused-nodes leader writes (gpu_placement/controllers/refused_nodes.py): the code of the
# node-level reason gpu-placement refuses every GPU pod there for (NotValidated, DriverUpgrade, ...); GPU pods
# the webhook shapes require it absent (webhook/shaping.py), so kube-scheduler leaves those nodes out itself.
LABEL_REFUSED = PREFIX + "refused"
# Namespace label: "true" opts a namespace in (namespaceSelection optIn), "false" out (optOut).
LABEL_ENABLED = PREFIX + "enabled"
# On the webhook configurations: "<RFC 3339 time> by <replica>" once a ready replica wrote the webhooks in.
REGISTERED_ANNOTATION = PREFIX + "webhooks-registered"

# Taint effects that keep what is tainted from use: a node from a pod that does not tolerate the taint
# (kube-scheduler's TaintToleration), a device from such a claim (the DRA allocator's
# taintPreventsAllocation). PreferNoSchedule only weighs on scores; None only reports.
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
