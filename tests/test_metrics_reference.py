"""The metric reference in docs/operations.md is what a running service exports: every family under
`gpu_placement_` is in the table with its labels, and nothing in the table is missing from /metrics."""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.live_metrics import documented, scrape_demo_service

# Suffixes the exposition adds to a family's name, by type (histograms keep their own name).
EXPOSED = {"counter": "_total", "info": "_info"}


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> str:
    return scrape_demo_service(tmp_path_factory.mktemp("metrics"))


def exported(text: str) -> dict[str, set[str] | None]:
    """Exposed family name -> label names of its samples (None: no samples yet)."""
    families: dict[str, set[str] | None] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("gpu_placement_") or family.name.endswith("_created"):
            continue  # _created: prometheus-client's counter creation times, read as families of their own
        name = family.name + EXPOSED.get(family.type, "")
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        families[name] = ({k for s in samples for k in s.labels if k != "le"} if samples else None)
    return families


def test_every_exported_metric_is_documented_and_every_documented_one_exported(scraped: str) -> None:
    docs, live = documented(), exported(scraped)
    assert len(docs) >= 30
    assert sorted(live.keys() - docs.keys()) == [], "exported but not in docs/operations.md"
    assert sorted(docs.keys() - live.keys()) == [], "in docs/operations.md but not exported"
    wrong = {name: (docs[name], labels) for name, labels in live.items() if labels is not None and labels != docs[name]}
    assert wrong == {}, "documented labels (left) differ from the exported ones (right)"


def test_cluster_metrics_are_in_the_scrape(scraped: str) -> None:
    # h100-not-validated, and the survey's hand-installed h100-train-hand (no operator validator there)
    assert 'gpu_placement_gpu_nodes{product="NVIDIA-H100-80GB-HBM3",verdict="NotValidated"} 2.0' in scraped
    assert 'gpu_placement_pods_waiting{reason="InsufficientGPUMemory"} 1.0' in scraped
    assert 'gpu_placement_namespace_quota_limit{enforced="true",namespace="team-a",resource="nvidia.com/gpu"} 16.0' \
        in scraped


def test_names_follow_prometheus_conventions(scraped: str) -> None:
    """`_total` for counters only, base units (`_seconds`, `_bytes`) as the last word."""
    types = {f.name + EXPOSED.get(f.type, ""): f.type for f in text_string_to_metric_families(scraped)
             if f.name.startswith("gpu_placement_") and not f.name.endswith("_created")}
    for name, kind in types.items():
        assert name.endswith("_total") == (kind == "counter"), name
        assert not name.endswith("_info") or kind in ("info", "gauge"), name  # text format 0.0.4: a gauge of 1
        if "seconds" in name or "bytes" in name:
            assert name.removesuffix("_total").endswith(("_seconds", "_bytes")), name
        assert not re.search(r"_(mib|ms|milliseconds|minutes|percent)(_|$)", name), name
