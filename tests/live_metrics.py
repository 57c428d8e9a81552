"""`gpu-placement serve` on the demo snapshot, exercised the way the cluster would (the extender asked
about a pod no node takes and about one that binds; the webhook shown an allowed and a denied pod),
then /metrics scraped: what the metric reference and the dashboard tests check against."""

from __future__ import annotations

import base64
import re
import ssl
import subprocess
from pathlib import Path
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gpu_placement.app.demo import write_snapshot
from gpu_placement.app.explain import admission_review
from gpu_placement.samples.cluster import make_pod
from gpu_placement.web.patching import apply_patch
from tests.prometheus import tool
from tests.support.serve import SCRIPT, free_port, stop, wait_ready

__all__ = ["documented", "promtool", "scrape_demo_service", "selector_problems"]

ROOT = Path(__file__).resolve().parent.parent
ROW = re.compile(r"^\| `(gpu_placement_[a-z_]+)` \|([^|]*)\|", re.MULTILINE)
SELECTOR = re.compile(r"\b(gpu_placement_[a-z_]+)\b\s*(?:\{([^}]*)\})?")
MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"([^"]*)"')
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def documented() -> dict[str, set[str]]:
    """The metric reference of docs/operations.md: metric -> its label names."""
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("### Metrics reference"):]
    return {name: set(re.findall(r"`([a-z_]+)`", labels)) for name, labels in ROW.findall(section)}


RECORD = re.compile(r"\bgpu_placement:[a-z0-9_:]+")


def recorded(groups: list[dict[str, Any]]) -> dict[str, str]:
    """The chart's recording rules: record name -> its expression."""
    return {rule["record"]: rule["expr"] for group in groups for rule in group["rules"] if "record" in rule}


def selector_problems(expressions: list[tuple[str, str]], scraped: str,
                      records: dict[str, str] | None = None) -> list[str]:
    """Every `gpu_placement_*` selector in each (title, PromQL) names an exported metric, and each
    label matcher could select an exported series (a family without series yet: its documented labels).
    A recording rule's name (`gpu_placement:...`) must be one of `records` (the chart's), whose own
    expression is checked in its place."""
    records = records or {}
    expanded = []
    problems: list[str] = []
    for title, expr in expressions:
        names = RECORD.findall(expr)
        problems += [f"{title}: {name} is not a recording rule of the chart" for name in names if name not in records]
        expanded.append((title, " ".join([RECORD.sub("", expr), *(records[n] for n in names if n in records)])))
    return problems + _selector_problems(expanded, scraped)


def _selector_problems(expressions: list[tuple[str, str]], scraped: str) -> list[str]:
    samples: dict[str, list[dict[str, str]]] = {}
    families: set[str] = set()
    for family in text_string_to_metric_families(scraped):
        families.add(family.name)
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample.labels)
    docs = documented()
    problems = []
    for title, expr in expressions:
        selectors = SELECTOR.findall(expr)
        if not selectors:
            problems.append(f"{title}: no gpu_placement_ metric in {expr}")
        for name, matchers in selectors:
            series = samples.get(name)
            if series is None:
                base = next((name.removesuffix(s) for s in SUFFIXES if name.endswith(s)), name)
                if base not in families:
                    problems.append(f"{title}: {name} is not exported")
                    continue
                labels = docs.get(name) or docs.get(base) or set()
                problems += [f"{title}: {name} has no label {label}" for label, _, _ in MATCHER.findall(matchers)
                             if label not in labels]
                continue
            for label, op, value in MATCHER.findall(matchers):
                if not any(label in s for s in series):
                    problems.append(f"{title}: {name} has no label {label}")
                elif op == "=" and not any(s.get(label) == value for s in series):
                    problems.append(f"{title}: no {name} series has {label}={value!r}")
                elif op == "=~" and not any(re.fullmatch(value, s.get(label, "")) for s in series):
                    problems.append(f"{title}: no {name} series has {label} matching {value!r}")
                elif op == "!~" and all(re.fullmatch(value, s.get(label, "")) for s in series):
                    problems.append(f"{title}: every {name} series is excluded by {label}!~{value!r}")
    return problems


def promtool() -> str:
    return tool("promtool")


def scrape_demo_service(tmp: Path) -> str:
    write_snapshot(str(tmp / "cluster.json"))
    ports = {"extender": free_port(), "webhook": free_port()}
    process = subprocess.Popen(
        [SCRIPT, "serve", "--snapshot", str(tmp / "cluster.json"), "--extender-listen",
         f"127.0.0.1:{ports['extender']}", "--webhook-listen", f"127.0.0.1:{ports['webhook']}",
         "--self-signed", str(tmp / "certs")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    try:
        extender = f"http://127.0.0.1:{ports['extender']}"
        wait_ready(f"{extender}/readyz")
        huge = make_pod("research", "huge", gpus={"nvidia.com/gpu": 1},
                        annotations={"gpu-placement.io/gpu-memory": "120Gi"})
        answer = httpx.post(f"{extender}/filter", json={"Pod": huge, "NodeNames": ["h100-single"]}).json()
        assert answer["NodeNames"] == []
        small = make_pod("research", "small", gpus={"nvidia.com/gpu": 1})
        args = {"Pod": small, "NodeNames": ["h100-single", "h100-not-validated"]}
        assert httpx.post(f"{extender}/filter", json=args).json()["NodeNames"] == ["h100-single"]
        assert httpx.post(f"{extender}/prioritize", json=args).status_code == 200
        bound = httpx.post(f"{extender}/bind", json={"PodName": "small", "PodNamespace": "research",
                                                      "PodUID": "", "Node": "h100-single"}).json()
        assert bound == {"Error": ""}

        trust = ssl.create_default_context(cafile=str(tmp / "certs" / "ca.crt"))
        webhook = f"https://localhost:{ports['webhook']}"
        wait_ready(f"{webhook}/readyz", verify=trust)
        for name, gpus, allowed in (("sweep", 4, False), ("one", 1, True)):  # research's quota is 2 GPUs
            pod = make_pod("research", name, gpus={"nvidia.com/gpu": gpus})
            shaped = httpx.post(f"{webhook}/mutate?timeout=10s", json=admission_review(pod, "research"),
                                verify=trust).json()["response"]
            pod = apply_patch(pod, orjson.loads(base64.b64decode(shaped["patch"])))  # as the API server does
            response = httpx.post(f"{webhook}/validate?timeout=10s", json=admission_review(pod, "research"),
                                  verify=trust).json()["response"]
            assert response["allowed"] is allowed
        return httpx.get(f"{extender}/metrics").text
    finally:
        stop(process)
