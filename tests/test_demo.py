"""`make demo`: the embedded cluster end to end over real HTTP(S), and the story it tells."""

from __future__ import annotations

import io
import re

from gpu_placement.app.demo import run_demo
from gpu_placement.decide.rules import CODES


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
    for denied in ("research/sweep", "web/frontend-gpu", "research/typo"):  # nothing of a denied pod is stored
        assert admission[denied].endswith(" DENIED    - (denied: the pod is not created)"), admission[denied]
    assert admission["team-a/llama-finetune"].endswith(" allowed   tolerations, nodeSelector, schedulerName, admitted")
    assert "denied research/sweep: namespace research may use 2 nvidia.com/gpu (gpu-placement.io/quota)" in text
    assert "denied web/frontend-gpu: namespace web has no GPU access" in text
    assert 'gpu-placement.io/cuda="twelve"' in text
    canary = admission["batch-canary/smoke-test"]  # its gpu-placement.io/canary is known: no warning
    assert " allowed " in canary and "warning" not in canary

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
    # an exclusive pod whose only candidates are time-sliced: told what would let it take a replica (the other
    # 20 nodes, the survey's two among them, are not Turing)
    assert placed["media/transcode"].split()[1:] == ["Pending", "-", "1", "NoGPU,", "1", "SharingMismatch,", "20",
                                                     "outside", "its", "node", "selector"]
    assert ("media/transcode waits: SharingMismatch: the pod's sharing level is exclusive (whole GPUs), but "
            "nvidia.com/gpu here is a replica of a shared GPU") in text
    assert "set gpu-placement.io/sharing=shared on the pod" in text
    # the driver wave: the canary namespace's job takes a soaking node of the new driver (the top score),
    # the ordinary job in the same pool is refused there (rollout.soak: strict) and runs on the old driver
    assert placed["batch-canary/smoke-test"].split()[1:3] == ["h100-batch-3", "10/10"]
    assert placed["batch/train"].split()[1] == "h100-batch-1"
    assert "2 DriverSoaking" in placed["batch/train"]
    alerts = text.split("ALERTS", 1)[1].splitlines()
    waiting = [line.split()[1:3] for line in alerts if line.startswith("GpuPodsWaiting")]
    assert waiting == [["InsufficientGPUMemory", "2"], ["SharingMismatch", "1"]]  # each pod under its own reason


def test_demo_shows_every_reason_code_a_scheduler_sees() -> None:
    out = io.StringIO()
    run_demo(out=out)
    text = out.getvalue().split("SCHEDULING", 1)[1].split("WHAT EACH", 1)[0]
    # Every code kube-scheduler can get from /filter, so a new code needs a story here (or a reason below).
    not_shown = {"UnknownNode": "the demo's view knows every node kube-scheduler asks about",
                 "BadAnnotation": "the webhook denies such a pod before it reaches the scheduler (research/typo)",
                 "UnknownGPUMemory": "no demo node lacks nvidia.com/gpu.memory for a pod that asks for memory",
                 "UnknownClaim": "the demo cluster runs no DRA driver (tests/test_dra_extender.py has that story)",
                 "LaunchFailures": "no demo pod has failed to start: the demo plays no kubelet "
                                   "(tests/test_launch_fence.py and e2e scenario 24 have that story)"}
    assert set(not_shown) <= set(CODES)
    for code in CODES:
        if code not in not_shown:
            assert re.search(rf"\d+ {code}\b", text), code
    assert re.search(r"\d+ SharingMismatch\b", text)  # the sharing rule, on a time-sliced node
    assert rows(out.getvalue(), "SCHEDULING")["vision/detector"].split()[1] == "h100-train-2"


def test_demo_shows_the_driver_wave() -> None:
    out = io.StringIO()
    run_demo(out=out)
    text = out.getvalue()
    wave = text.split("DRIVER ROLLOUT", 1)[1].split("ALERTS", 1)[0]
    assert "Driver soak: 60 minutes, strict" in wave
    cells = {line.split()[0]: line.split() for line in wave.splitlines() if line.strip()}
    assert cells["DRIVER"][:9] == ["DRIVER", "RELEASE", "NODES", "DONE", "PENDING", "UPGRADING", "SOAKING", "FAILED",
                                   "GPU"]
    assert cells["580.126.09"][1:8] == ["newest", "3", "1", "0", "0", "2", "0"]  # 2 soaking, 1 done (a100-vgpu)
    assert cells["550.54.15"][1] == "previous"
    for name in ("h100-batch-2", "h100-batch-3"):
        assert cells[name][1:3] == ["580.126.09", "soaking"] and re.fullmatch(r"\d+m", cells[name][3])
    assert cells["h100-batch-4"][2] == "pending"
    assert 'Canary namespaces (gpu-placement.io/canary="true"): batch-canary' in wave
    assert "Next wave: 0 of 2 waiting, to driver 580.126.09 (ClusterPolicy cluster-policy: maxParallelUpgrades 1 " \
           "with 1 in flight" in wave


def test_demo_surveys_its_cluster() -> None:
    """The demo ends with the survey of its cluster: the hand-installed node and the hand-labelled one
    are each found, with their codes and fixes, beside what the demo's other nodes show."""
    out = io.StringIO()
    run_demo(out=out)
    text = out.getvalue().split("\nSURVEY (gpu-placement survey", 1)[1]
    nodes = {line.split()[0]: line for line in text.split("\nNODES\n", 1)[1].split("\n\n", 1)[0].splitlines()[1:]}
    assert nodes["h100-train-hand"].split()[6:9] == ["not", "managed", "NotValidated"]
    assert "16 by kubectl-label" in nodes["h100-train-hand"]
    assert "nvidia.com/gpu.memory, nvidia.com/gpu.present, nvidia.com/gpu.product" in nodes["l40s-relabelled"]
    codes = re.findall(r"^- (\w+): ", text, re.MULTILINE)
    assert codes == ["UnmanagedNode", "HandSetLabels", "GpusNotPublished", "DriverSkew", "DriverTooOldForWorkloads",
                     "DriverTooOldForWorkloads", "UntaintedGpuNode", "UntoleratedTaint", "SelectorMatchesNoGpuNode",
                     "BypassedGpuPlacement"]
    assert "fix: Move them to the managed stack one node at a time: gpu-placement migrate NODE" in text
    assert "pool training runs 2 driver versions with no rollout under way: 535.129.03 on h100-train-1; " \
           "535.104.05 on h100-train-hand" in text
    assert "taint maintenance=bios-update:NoSchedule on l40s-relabelled" in text
    assert "research/CronJob/nightly-eval asks for a GPU, but its node selection" in text
    plan = out.getvalue().split("\nMIGRATION PLAN (gpu-placement migrate h100-train-hand", 1)[1]
    steps = re.findall(r"^(\d)\. \[(\w+)\] (\w+):", plan, re.MULTILINE)
    assert steps == [("1", "next", "save"), ("2", "pending", "cordon"), ("3", "pending", "drain"),
                     ("4", "pending", "labels"), ("5", "pending", "plugin"), ("6", "pending", "operator"),
                     ("7", "pending", "validator"), ("8", "pending", "uncordon")]
    assert "$ kubectl drain h100-train-hand --ignore-daemonsets --delete-emptydir-data" in plan


def test_demo_ends_with_the_outcome_table_report_prints() -> None:
    """The same computation as `gpu-placement report` (gpu_placement/outcomes/report.py), over the demo's
    own counters after a day of its history (gpu_placement/samples/history.py, whose Truth it must match)."""
    out = io.StringIO()
    run_demo(out=out)
    text = out.getvalue()
    table = text.split("OUTCOMES", 1)[1]
    assert table.strip().splitlines()[-1].startswith("GPU-hours idle while pods waited")  # the demo ends with it
    cells = {line.split("  ")[0]: line.split("  ")[-1].strip() for line in table.splitlines()[2:] if "  " in line}
    assert cells["GPU pod launches"] == "112"
    assert cells["Launch success"] == "89.3 % (100 of 112)"
    assert cells["Failed on the node"] == "6.2 %: device_plugin 3, container_toolkit 2, cuda_init 2"
    assert cells["Failed, not the node's"] == "exit_code 2, image_pull 2"
    assert cells["Bound, not started in an hour"] == "1"
    assert cells["Node recovery p50 / p90, NotValidated"] == "37.5 min / 43.5 min (1 outage)"
    assert cells["Node preparation p50 / p90"] == "7.0 min / 14.0 min (2 nodes)"
    assert cells["GPU pods that waited > 10 min"] == "3: InsufficientGPU 2, NotValidated 1"
    assert cells["GPU-hours idle while pods waited"].startswith("22.4: fragmented 17.1")
