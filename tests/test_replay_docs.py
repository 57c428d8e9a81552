"""docs/replay.md runs from a clone as written: every path its commands name is in the repository
(data/openb, whose files are the ones data/openb/README.md names, byte for byte, and read as traces),
and its recipe for your own cluster runs for real on what `kubectl get ... -o json` would give for the
demo cluster."""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from gpu_placement.replay.trace import read_nodes_csv, read_tasks_csv

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "replay.md"
DATA = ROOT / "data" / "openb"
GPU_PLACEMENT = str(Path(sys.executable).parent / "gpu-placement")


def blocks(markdown: str) -> list[list[str]]:
    """Each fenced block's lines, with backslash continuations joined."""
    found = []
    for body in re.findall(r"^```[^\n]*\n(.*?)^```", markdown, re.MULTILINE | re.DOTALL):
        found.append(body.replace("\\\n", " ").splitlines())
    return found


def commands(markdown: str) -> list[tuple[list[str], set[str]]]:
    """(`gpu-placement replay` command as words, files the block's earlier commands write with `>`)."""
    found = []
    for lines in blocks(markdown):
        written: set[str] = set()
        for line in lines:
            if line.startswith("gpu-placement replay"):
                found.append((shlex.split(line), set(written)))
            written.update(re.findall(r">\s*(\S+)", line))
    return found


def paths(words: list[str]) -> list[str]:
    """The values of --nodes, --pods and --config that are paths (not a synopsis' NODES or PODS)."""
    return [value for flag, value in itertools.pairwise(words)
            if flag in ("--nodes", "--pods", "--config") and not value.isupper()]


def test_every_path_the_replay_doc_names_is_in_a_clone() -> None:
    text = DOC.read_text()
    found = commands(text)
    assert len(found) >= 4, found  # the first example, the synopsis, the figures' two, your own cluster
    named = set()
    for words, written in found:
        for path in paths(words):
            named.add(path)
            inside = (ROOT / path).resolve().is_relative_to(ROOT) and (ROOT / path).is_file()  # a clone has it
            assert path in written or inside, f"{path} (docs/replay.md: {' '.join(words)})"
    mentioned = set(re.findall(r"\bdata/openb/[\w.-]+", text))  # `--pods data/openb/...` in the prose too
    assert {p for p in named if p.startswith("data/")} | mentioned >= {
        "data/openb/openb_node_list_gpu_node.csv", "data/openb/openb_pod_list_default.csv",
        "data/openb/openb_pod_list_gpushare100.csv", "data/openb/openb_pod_list_multigpu20.csv",
        "data/openb/fgd-atc23-expected-allocation.csv"}
    assert all((ROOT / path).is_file() for path in mentioned), mentioned
    for link in re.findall(r"\]\((\.\./[^)#]+)", text):
        assert (DOC.parent / link).resolve().exists(), link


def test_the_traces_are_alibabas_files_byte_for_byte_and_read_as_traces() -> None:
    readme = (DATA / "README.md").read_text()
    listed = dict(re.findall(r"\| `([\w.-]+\.csv)` \| [^|]+ \| `([0-9a-f]{64})` \|", readme))
    listed.update(re.findall(r"`(fgd-atc23-expected-allocation\.csv)` holds.*?sha256 `([0-9a-f]{64})`", readme,
                             re.DOTALL))
    assert set(listed) == {p.name for p in DATA.glob("*.csv")}
    for name, digest in listed.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    for cited in ("cluster-trace-gpu-v2023", "https://github.com/alibaba/clusterdata",
                  "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
                  "USENIX ATC '23", "for study and research", "study purpose"):
        assert cited in " ".join(readme.split()), cited
    nodes = read_nodes_csv(DATA / "openb_node_list_gpu_node.csv")
    assert (len(nodes), sum(n.gpus for n in nodes)) == (1213, 6212)
    for trace, count in (("default", 8152), ("gpushare100", 8152), ("multigpu20", 8324)):
        assert len(read_tasks_csv(DATA / f"openb_pod_list_{trace}.csv")) == count


def test_the_traces_stay_out_of_the_package_and_the_image() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"data/' not in pyproject.split("[tool.setuptools.package-data]")[1].split("[")[0].replace(
        '"data/*.json"', "")
    assert not re.search(r"^COPY .*\bdata\b", (ROOT / "Dockerfile").read_text(), re.MULTILINE)


@pytest.mark.timeout(120)
def test_the_own_cluster_recipe_runs_as_written(tmp_path: Path) -> None:
    """The recipe's `kubectl get ... -o json` files made from the demo cluster, then its replay command
    word for word: each GPU pod arrives once, none is a copy, the opening says what arrived."""
    from gpu_placement.samples.cluster import demo_objects, demo_pods

    [(words, written)] = [(w, wr) for w, wr in commands(DOC.read_text()) if "nodes.json" in w]
    assert written == {"nodes.json", "pods.json"}
    objects = demo_objects()
    (tmp_path / "nodes.json").write_bytes(orjson.dumps(
        {"apiVersion": "v1", "kind": "List", "items": [o for o in objects if o.get("kind") == "Node"]}))
    pods = [o for o in [*objects, *(pod for _, pod in demo_pods())] if o.get("kind") == "Pod"]
    (tmp_path / "pods.json").write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))
    result = subprocess.run([GPU_PLACEMENT, *words[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=110,
                            env={**os.environ, "COLUMNS": "120"})
    assert result.returncode == 0, result.stderr
    opening = " ".join(result.stdout.split("\n\n")[0].split())
    assert opening.startswith("device-plugin mode: what NVIDIA's device plugin offers"), opening
    assert "each of the" in opening and "listed once" in opening and "tuned" not in result.stdout
    assert "unallocated GPUs at" in result.stdout and "tasks that fit nowhere, of " in result.stdout


def _family_rows(text: str, title: str) -> dict[str, list[float]]:
    """family -> its figures (%) in the first table after `title` in docs/replay.md."""
    table = text[text.index(title):].split("\n\n|", 1)[1].split("\n\n")[0]
    return {cells[0]: [float(m.group(1)) for cell in cells[1:]
                       if (m := re.fullmatch(r"\**([\d.]+) %\**(?: \(min [\d.]+\))?", cell))]
            for line in ("|" + table).splitlines() if (cells := [c.strip() for c in line.strip("|").split("|")])
            and re.fullmatch(r"default|[a-z]+\d+", cells[0])}


def test_the_readme_quotes_each_figure_with_its_mode() -> None:
    """The README's replay figures are the family tables' default-trace rows rounded, each under the mode it
    was made in: the device-plugin ones first (what most clusters run), then DRA's (`--mode dra`), with the
    paper's Best-fit and FGD; and the claim about every family is the dra table's."""
    doc = DOC.read_text()
    [line] = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("- [docs/replay.md]")]
    plugin, _, dra = line.partition("`--mode dra`")
    assert "`--mode device-plugin`" in plugin, line
    dra_rows = _family_rows(doc, "**The chart's default** (`tierSize` 8")
    plugin_rows = _family_rows(doc, "`device-plugin` mode (Best-fit and FGD are defined")
    # fragmentation, binpack, Best-fit, FGD (means over the seeds run), before
    assert len(dra_rows) == 14 and all(len(figures) == 5 for figures in dra_rows.values()), dra_rows
    for part, figures in ((plugin, plugin_rows["default"][:2]), (dra, dra_rows["default"][:4])):
        quoted = [float(f) for f in re.findall(r"([\d.]+) %", part.split("arrived", 1)[-1])]
        assert quoted[:len(figures)] == [round(f, 1) for f in figures], (part, quoted, figures)
    above = sum(f[0] > f[1] for f in dra_rows.values())
    reached = sum(f[0] >= f[2] for f in dra_rows.values())
    assert f"above binpack on {above} of the 14" in line and f"at or above Best-fit on {reached}" in line, line
