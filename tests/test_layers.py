"""The package layering of docs/architecture.md, checked: the edges never import each other, and the
core never imports the edges (only the CLI and process assembly see both)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ASSEMBLY = {"gpu_placement/app/cli.py", "gpu_placement/app/serve.py", "gpu_placement/app/assembly.py",
            "gpu_placement/app/workload_summary.py", "gpu_placement/report/namespaces.py", "gpu_placement/app/cli_explain.py",
            "gpu_placement/app/demo.py", "gpu_placement/app/explain.py"}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(("package", "forbidden"), [("extender", "webhook"), ("webhook", "extender")])
def test_edges_do_not_import_each_other(package: str, forbidden: str) -> None:
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / package).rglob("*.py") if forbidden in imported(p)]
    assert offenders == []


def test_core_does_not_import_the_edges() -> None:
    offenders = [rel for p in (ROOT / "gpu_placement").rglob("*.py")
                 if (rel := str(p.relative_to(ROOT))) not in ASSEMBLY and imported(p) & {"extender", "webhook"}]
    assert offenders == []
