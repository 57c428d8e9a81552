"""The user docs read as written for a platform team: no notes about the machines gpu-placement is
developed on, and the 2 a.m. paths of docs/operations.md where the symptom sends the reader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "data" / "openb" / "README.md"]
# How notes about the development machine read; a measurement says its conditions (cores, load) instead.
MACHINE_NOTES = re.compile(r"other engineers|this project's (machine|\d-vCPU)|this (\d-core |dev(elopment)? )?machine"
                           r"|e2e lock|as on the project's", re.IGNORECASE)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_notes_about_the_development_machine(doc: Path) -> None:
    found = [f"{doc.name}:{number}: {line.strip()}" for number, line in enumerate(doc.read_text().splitlines(), 1)
             if MACHINE_NOTES.search(line)]
    assert found == []


def _section(markdown: str, title: str) -> str:
    start = markdown.index(f"\n## {title}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start:end if end > 0 else None]


def test_operations_has_the_emergency_paths_beside_their_symptoms() -> None:
    ops = (ROOT / "docs" / "operations.md").read_text()
    extender = _section(ops, "The extender is down")
    assert '@.spec.schedulerName=="gpu-placement"' in extender  # the pods stuck waiting for it
    assert "config.mode=audit" in extender and "kubectl delete pod" in extender
    webhook = _section(ops, "The webhook is down")
    stop = webhook.index("kubectl delete mutatingwebhookconfiguration,validatingwebhookconfiguration gpu-placement")
    after = " ".join(webhook[stop:].split())
    assert "Deleting the configurations also deletes every namespace's quota." in after[:600]
    assert "ResourceQuota `gpu-placement`" in after and "DeviceTaintRule" in after
