"""What a user is told when a GPU pod reaches /validate without /mutate's shaping.

With the chart's `failurePolicy: Ignore` on /mutate, a mutating call that fails or times out lets the
pod through as it was written: no `gpu-placement.io/admitted` annotation, the default scheduler, no
GPU node selection, no sharing rewrite. /validate sees such a pod; the sentence says what happened,
what it means and what to do.
"""

from __future__ import annotations

from gpu_placement import names as n

__all__ = ["UNSHAPED", "unshaped"]

UNSHAPED = "Unshaped"


def unshaped(namespace: str, name: str) -> str:
    return (f"pod {namespace}/{name} was not shaped by gpu-placement's mutating webhook (no {n.ANN_ADMITTED} "
            "annotation: the call to /mutate failed or timed out, and its failurePolicy is Ignore), so it keeps "
            "its scheduler and its GPU resources as written and runs without gpu-placement's node checks, pools "
            "and sharing: delete it and create it again, and check the gpu-placement webhook pods")
