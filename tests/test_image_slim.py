"""image/slim.py's pruning: what kubernetes requires for kubernetes.aio alone goes, nothing another
distribution needs (the image build runs it; make image-test checks the image it made)."""

from __future__ import annotations

import importlib.util
import py_compile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("slim", ROOT / "image" / "slim.py")
assert _spec and _spec.loader
slim = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slim)


def _site(tmp_path: Path, requires: dict[str, list[str]]) -> Path:
    for name, needs in requires.items():
        info = tmp_path / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        lines = [f"Name: {name}", "Version: 1.0", *(f"Requires-Dist: {n}" for n in needs)]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
    return tmp_path


GRAPH = {
    "kubernetes": ["aiohttp", "aiohttp-retry", "requests", "pyyaml"],
    "aiohttp-retry": ["aiohttp"],
    "aiohttp": ["yarl>=1.17", "multidict", "brotli; extra == 'speedups'"],
    "yarl": ["multidict", "idna>=2.0"],
    "multidict": [],
    "idna": [],
    "requests": ["idna"],
    "pyyaml": [],
}


def _pruned(tmp_path: Path, graph: dict[str, list[str]]) -> list[str]:
    dists = slim._distributions(_site(tmp_path, graph))
    return list(slim.exclusive_dependencies(dists, slim.PRUNED_ROOTS, slim.PRUNED_OWNER))


def test_the_aio_stack_goes_when_only_kubernetes_needs_it(tmp_path: Path) -> None:
    graph = {**GRAPH, "gpu-placement": ["kubernetes", "pyyaml"]}
    assert _pruned(tmp_path, graph) == ["aiohttp", "aiohttp-retry", "multidict", "yarl"]  # idna: requests


def test_what_the_service_itself_requires_stays(tmp_path: Path) -> None:
    graph = {**GRAPH, "gpu-placement": ["kubernetes", "aiohttp>=3.10"]}
    assert _pruned(tmp_path, graph) == ["aiohttp-retry"]


def test_bytecode_for_what_the_runs_imported_and_all_of_the_service(tmp_path: Path) -> None:
    """The .pyc files the runs left are rewritten, every module of gpu-placement's own is compiled
    (DRA's, imported only where a cluster serves resource.k8s.io), nothing else is."""
    site = _site(tmp_path, {"gpu-placement": [], "dep": []})
    (site / "gpu_placement-1.0.dist-info" / "RECORD").write_text(
        "gpu_placement/__init__.py,,\ngpu_placement/controllers/dra_taints.py,,\ngpu_placement-1.0.dist-info/METADATA,,\n")
    for name in ("gpu_placement/__init__.py", "gpu_placement/controllers/dra_taints.py", "dep/seen.py",
                 "dep/unseen.py"):
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text("X = 1\n")
    py_compile.compile(str(site / "dep/seen.py"))  # what a run imported: a timestamp .pyc
    compiled, modules = slim.freeze_bytecode(site, slim.own_sources(site))
    assert (compiled, modules) == (3, 4)
    pycs = {p.relative_to(site).parent.parent / p.name.split(".")[0]: p.read_bytes() for p in site.rglob("*.pyc")}
    assert sorted(map(str, pycs)) == ["dep/seen", "gpu_placement/__init__", "gpu_placement/controllers/dra_taints"]
    assert all(int.from_bytes(data[4:8], "little") == 0b01 for data in pycs.values()), "unchecked-hash flags"
