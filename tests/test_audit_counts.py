"""Audit mode counts launch outcomes: the baseline docs/outcomes.md tells platform teams to collect before
switching to enforce. A `serve` webhook replica in audit mode, against the fake API server, counts a GPU pod
that ran, as not placed by gpu-placement (audit mode shapes nothing: no `gpu-placement.io/admitted`, no
scheduler), and exports it for Prometheus."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from gpu_placement.samples.cluster import demo_objects, make_pod
from tests.fakeapi import FakeApiServer
from tests.support.serve import NS, SCRIPT, free_port, stop, wait_ready
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # slow: the watermark passes the launch ~30 s in


def _at(moment: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(moment))


def test_audit_mode_counts_launches_as_not_placed(fake_api: FakeApiServer, tmp_path: Path) -> None:
    now = time.time()
    ran = make_pod("team-a", "baseline-0", gpus={"nvidia.com/gpu": 1}, node="h100-train-1", phase="Succeeded")
    # The counter's first watermark trails its start by 120 s (SETTLE_SECONDS); a launch 90 s old is after it,
    # and counted once the watermark passes it, some 30 s after the start.
    ran["metadata"]["creationTimestamp"] = _at(now - 95)
    ran["status"]["startTime"] = _at(now - 90)
    fake_api.load([*demo_objects(), ran])
    fake_api.add({"kind": "Namespace", "metadata": {"name": NS}})
    config = tmp_path / "audit.yaml"
    config.write_text("mode: audit\n")
    port = free_port()
    process = subprocess.Popen(
        [SCRIPT, "serve", "--kubeconfig", str(fake_api.write_kubeconfig(tmp_path / "kubeconfig")), "--config",
         str(config), "--components", "webhook", "--webhook-listen", f"127.0.0.1:{port}", "--self-signed",
         str(tmp_path / "certs"), "--namespace", NS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_ready(f"https://127.0.0.1:{port}/readyz")
        started = re.compile(r'gpu_placement_gpu_pod_starts_total\{cause="none",outcome="started",placed="false",'
                             r'pool="[^"]*"\} 1\.0')
        scraped = wait_for(lambda: _scrape_matching(port, started), timeout=120,
                           what="the launch counted in audit mode")
        assert 'gpu_placement_outcomes_leading{lease="gpu-placement-outcomes"} 1.0' in scraped
        assert not re.search(r'gpu_placement_gpu_pod_starts_total\{[^}]*placed="true"[^}]*\} [1-9]', scraped)
    finally:
        stop(process)


def _scrape_matching(port: int, pattern: re.Pattern[str]) -> str | None:
    """/metrics when it shows `pattern`; else None, after a pause (the counter turns every 10 s)."""
    text = httpx.get(f"https://127.0.0.1:{port}/metrics", verify=False, timeout=5).text
    if pattern.search(text):
        return text
    time.sleep(0.5)
    return None
