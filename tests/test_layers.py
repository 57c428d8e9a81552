"""The tree as docs/architecture.md draws it: the import contracts of pyproject.toml hold (import-linter),
every folder of gpu_placement/ is a layer the contracts and the architecture page name, and no folder
grows past what a reader takes in at a glance."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpu_placement"
MOST_MODULES = 15  # per folder: past it, the folder wants splitting (issue 35)


def test_the_import_contracts_hold() -> None:
    """`lint-imports` as `make test` runs it: a failure names the import that runs the wrong way."""
    linter = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(linter), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]
    assert "0 broken" in result.stdout


def contract_layers() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    return {name.strip() for layer in layers for name in layer.split("|")}


def test_every_folder_is_a_layer_the_contracts_and_the_architecture_page_name() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    named = {name.removeprefix("gpu_placement.") for name in contract_layers() if name.startswith("gpu_placement.")}
    assert folders == named
    page = (ROOT / "docs" / "architecture.md").read_text()
    drawn = set(re.findall(r"gpu_placement/([a-z_]+)/", page))
    assert folders <= drawn, f"not on docs/architecture.md: {sorted(folders - drawn)}"
    assert not [p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py"], "a module outside every layer"


def test_no_folder_holds_more_than_a_reader_takes_in() -> None:
    crowded = {str(folder.relative_to(ROOT)): n for folder in [PACKAGE, *PACKAGE.rglob("*"), ROOT / "extender",
                                                               ROOT / "webhook"]
               if folder.is_dir() and (n := len([p for p in folder.glob("*.py") if p.name != "__init__.py"]))
               > MOST_MODULES}
    assert crowded == {}
