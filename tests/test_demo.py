"""`make demo`: the embedded cluster end to end over real HTTP(S), and the story it tells."""

from __future__ import annotations

import io
import re

from gpu_placement.demo import run_demo


def rows(text: str, heading: str) -> dict[str, str]:
    """The table under `heading`, as pod -> its whole line."""
    block = text.split(heading, 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return {line.split()[0]: line for line in block if line and not line.startswith("  ")}


def test_demo_admits_places_and_explains() -> None:
    out = io.StringIO()
    assert run_demo(out=out) == 0
    text = out.getvalue()
    assert re.search(r"webhook https://localhost:\d+ \(TLS, self-signed CA\), extender http://127\.0\.0\.1:\d+", text)
    nodes = rows(text, "NODES")
    assert {"DriverUpgrade", "NotValidated", "MIGReconfiguring", "NodeNotReady", "NoGPU", "BadLabel"} <= {
        line.split()[1] for line in nodes.values()}

    admission = rows(text, "ADMISSION")
    assert "nvidia.com/gpu -> nvidia.com/gpu.shared" in admission["inference/chat-api"]
    assert "nvidia.com/gpu -> nvidia.com/mig-1g.10gb" in admission["mig-lab/notebook"]
    assert " DENIED " in admission["research/sweep"]
    assert "denied research/sweep: namespace research may use 2 nvidia.com/gpu (gpu-placement.io/quota)" in text
    assert "denied web/frontend-gpu: namespace web has no GPU access" in text
    assert 'gpu-placement.io/cuda="twelve"' in text

    placed = rows(text, "SCHEDULING")
    assert placed["team-a/llama-finetune"].split()[1] == "h100-train-1"  # binpack: the node already in use
    assert placed["inference/chat-api"].split()[1] == "t4-shared"
    assert placed["mig-lab/notebook"].split()[1] == "h100-mig"
    assert placed["research/cuda13-sim"].split()[1] == "a100-vgpu"
    assert placed["inference/chat-big"].split()[1] == "Pending"
    assert placed["research/huge-model"].split()[1] == "Pending"
    assert placed["web/frontend"].split()[1] == "(default"
    # the second share waits for memory the first one took; preemption could free it
    assert re.search(r"inference/chat-big waits: InsufficientGPUMemory: the pod needs 4096 MiB of "
                     r"nvidia.com/gpu.shared memory free and the node has less .*\(FailedNodes", text)
    assert "research/huge-model waits: InsufficientGPUMemory: the pod asks 122880 MiB per device" in text


def test_demo_shows_every_reason_code_a_scheduler_sees() -> None:
    out = io.StringIO()
    run_demo(out=out)
    text = out.getvalue().split("SCHEDULING", 1)[1].split("WHAT EACH", 1)[0]
    for code in ("NodeNotReady", "NoGPU", "NotValidated", "DriverUpgrade", "MIGReconfiguring", "DriverTooOld",
                 "ComputeCapability", "ProductMismatch", "UnknownDriver", "BadLabel", "InsufficientGPUMemory",
                 "InsufficientGPU"):
        assert re.search(rf"\d+ {code}\b", text), code
    assert rows(out.getvalue(), "SCHEDULING")["vision/detector"].split()[1] == "h100-train-2"
