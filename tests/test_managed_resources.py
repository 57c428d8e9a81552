"""Nodes offering a GPU resource that kube-scheduler will not send to the extender: a warning and a gauge."""

from __future__ import annotations

import logging

import pytest

from extender.managed import UnmanagedResources
from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config
from gpu_placement.observe import metrics
from gpu_placement.samples.cluster import make_node

ME = "nvidia.com/mig-1g.10gb.me"
MANAGED = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb",
           "nvidia.com/mig-3g.40gb")


def _gauge(resource: str) -> float:
    return metrics.UNMANAGED_GPU_NODES.labels(resource)._value.get()


def test_a_gpu_resource_outside_managed_resources_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    mig = make_node("h100-mig-1", "h100-mig-mixed")  # offers 1g.10gb, 2g.20gb, 3g.40gb: all managed
    media = make_node("h100-me-1", "h100", allocatable={ME: "1", "nvidia.com/mig-1g.10gb": "6"})
    core = core_from_objects(Config(), [mig, media, make_node("cpu-1", None)])
    with caplog.at_level(logging.WARNING, logger="gpu_placement.extender"):
        watcher = UnmanagedResources(core.view, MANAGED)
    assert watcher.offering == {ME: {"h100-me-1"}} and _gauge(ME) == 1
    [warning] = [r.getMessage() for r in caplog.records]
    assert f"offers {ME}, which is not in kube-scheduler's managedResources" in warning
    assert "extraMigResources" in warning
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpu_placement.extender"):  # a second node: counted, not re-warned
        core.ingest.event(core.view, "nodes", "ADDED", make_node("h100-me-2", "h100", allocatable={ME: "1"}))
    assert _gauge(ME) == 2 and not caplog.records
    core.ingest.event(core.view, "nodes", "MODIFIED", make_node("h100-me-2", "h100"))  # reconfigured: gone
    core.ingest.event(core.view, "nodes", "DELETED", media)
    assert _gauge(ME) == 0 and watcher.offering == {ME: set()}


def test_serve_takes_the_managed_list() -> None:
    from gpu_placement.app.cli import build_parser

    args = build_parser().parse_args(["serve", "--managed-resources", ",".join(MANAGED)])
    assert args.managed_resources == MANAGED
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--managed-resources", "gpu"])
