"""DCGM telemetry narrows free memory, lowers scores on XID errors, and goes stale on its own."""

from __future__ import annotations

from gpu_placement.config import Config, Telemetry
from gpu_placement.demo_cluster import demo_objects, make_pod
from gpu_placement.service import core_from_objects
from gpu_placement.telemetry import TelemetrySource, parse_dcgm

DCGM = """# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).
# TYPE DCGM_FI_DEV_FB_FREE gauge
DCGM_FI_DEV_FB_FREE{gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="h100-single"} 1024
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-b",Hostname="a100-vgpu",err_code="79"} 79
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-c",hostname="h100-train-1"} 0
"""


def test_parse_sums_devices_and_notes_xid() -> None:
    readings = parse_dcgm(DCGM, now=5.0)
    assert readings["h100-single"].free_mib == 1024
    assert readings["a100-vgpu"].xid_errors == 1
    assert "h100-train-1" not in readings  # no errors and no memory reading: nothing to say


def test_telemetry_narrows_memory_and_goes_stale() -> None:
    clock = [100.0]
    config = Telemetry(url="http://127.0.0.1:9400/metrics", refresh_seconds=1, stale_seconds=30)
    core = core_from_objects(Config(telemetry=config), demo_objects())
    source = TelemetrySource(core.view, config, fetch=lambda url: DCGM, clock=lambda: clock[0])
    pod = make_pod("research", "p", gpus={"nvidia.com/gpu": 1}, image="nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04")
    req = core.placement.requirements(pod)
    assert "h100-single" in core.placement.filter(req, ["h100-single"]).passed
    source.refresh()
    result = core.placement.filter(req, ["h100-single", "a100-vgpu"])
    assert result.failed["h100-single"].startswith("InsufficientGPUMemory: ")
    assert core.view.free_mib["nvidia.com/gpu"]["h100-single"] == 1024  # what DCGM says is left
    before = dict(core.placement.scores(req, ["a100-vgpu"]))["a100-vgpu"]
    assert before <= 10 - Config().scoring.xid_errors  # XID errors cost their weight

    def dead(url: str) -> str:
        raise OSError("connection refused")

    source.fetch = dead
    clock[0] += 31  # readings are now older than staleSeconds
    source.refresh()
    assert source.last_error == "connection refused"
    assert "h100-single" in core.placement.filter(req, ["h100-single"]).passed
    assert dict(core.placement.scores(req, ["a100-vgpu"]))["a100-vgpu"] == 10
