"""explain on workloads: a GPU pod, the webhook's name, an object created at a time."""

from __future__ import annotations

from typing import Any

import orjson

from gpu_placement.decide.bypass import Webhook
from gpu_placement.samples.cluster import make_pod

GPU_POD = make_pod("research", "p", gpus={"nvidia.com/gpu": 1})
HOOK = Webhook("gpu-placement", "2026-01-10T00:00:00Z", "Ignore")


def _created(pod: dict[str, Any], at: str, **meta: Any) -> dict[str, Any]:
    pod = orjson.loads(orjson.dumps(pod))
    pod["metadata"] |= {"creationTimestamp": at, **meta}
    return dict(pod)
