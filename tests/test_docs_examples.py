"""The docs' example sessions are what the commands print today: each `$ gpu-placement ...` transcript is
run for real in an empty folder (the demo snapshot it writes, the files the doc shows beside it) and its
output compared line by line, so an example cannot go stale. Only what carries the clock is left out of
the comparison: explain's `judged at:` line and a soaking node's SOAK LEFT."""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPU_PLACEMENT = str(Path(sys.executable).parent / "gpu-placement")
# What moves with the wall clock, kept as a placeholder on both sides.
CLOCK = ((re.compile(r"^judged at: .*$", re.MULTILINE), "judged at: <the clock>"),
         (re.compile(r"(  soaking +)\d+m "), r"\1<left> "))


def _section(markdown: str, title: str) -> str:
    start = markdown.index(f"\n{title}\n")
    end = markdown.find("\n## ", start + 1)
    return markdown[start:end if end > 0 else None]


def _blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of each fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def _transcript(body: str) -> list[tuple[list[str], str]]:
    """(`$ ` command as words, the lines printed under it) of a shell session."""
    steps: list[tuple[list[str], str]] = []
    for line in body.splitlines(keepends=True):
        if line.startswith("$ "):
            steps.append((shlex.split(line[2:], comments=True), ""))
        else:
            assert steps, f"output before any command: {line!r}"
            steps[-1] = (steps[-1][0], steps[-1][1] + line)
    return steps


def _masked(text: str) -> str:
    for pattern, placeholder in CLOCK:
        text = pattern.sub(placeholder, text)
    return text


EXAMPLES = [("docs/explain.md", "## Reading `explain`"), ("docs/rollouts.md", "## `gpu-placement rollout`")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("doc", "title"), EXAMPLES, ids=[doc for doc, _ in EXAMPLES])
def test_the_docs_example_session_is_todays_output(doc: str, title: str, tmp_path: Path) -> None:
    blocks = _blocks(_section((ROOT / doc).read_text(), title))
    sessions = [body for _, body in blocks if body.startswith("$ gpu-placement demo --write-snapshot")]
    assert len(sessions) == 1, blocks
    if doc == "docs/explain.md":  # the Job it judges is shown just before the session
        [job] = [body for info, body in blocks if info == "yaml"]
        (tmp_path / "train.yaml").write_text(job)
    steps = _transcript(sessions[0])
    assert [words[:2] for words, _ in steps] == [["gpu-placement", "demo"],
                                                ["gpu-placement", title.split("`")[1].split()[-1]]]
    for words, shown in steps:
        result = subprocess.run([GPU_PLACEMENT, *words[1:]], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=110, env={**os.environ, "COLUMNS": "120"})
        assert result.returncode == 0, result.stdout
        assert _masked(shown).splitlines() == _masked(result.stdout).splitlines(), f"{doc}: $ {' '.join(words)}"


def test_the_outcomes_doc_shows_the_demos_table_with_its_dates_relative() -> None:
    """`make demo`'s outcome table counts yesterday's history, so its dates move every day: the doc shows
    them as placeholders and the figures as the demo prints them."""
    from gpu_placement.outcomes.demo import table

    text = (ROOT / "docs" / "outcomes.md").read_text()
    [shown] = [body for _, body in _blocks(text) if body.startswith("GPU cluster outcomes, ")]
    midnight = math.floor(time.time() / 86400) * 86400  # as gpu_placement/app/demo.py: yesterday from midnight UTC
    printed = table(midnight - 86400)
    dates = {time.strftime("%Y-%m-%d", time.gmtime(midnight - 2 * 86400)): "DAY-2",
             time.strftime("%Y-%m-%d", time.gmtime(midnight)): "DAY"}
    title, _, rest = printed.partition("\n")
    for date, placeholder in dates.items():
        title = title.replace(date, placeholder)
    assert shown.splitlines() == [title, *rest.splitlines()]
    assert not re.search(r"\b20\d\d-\d\d-\d\d \d\d:\d\d UTC to", shown)
