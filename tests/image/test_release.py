"""`make release` (image/release.py) on the image `make image` built: the folder a team pushes from.

The checksums verify with `sha256sum -c`; the chart archive is versioned as the image, lints clean, renders
with its packaged values into manifests the Kubernetes schemas accept, deploys that image, and links its
runbook at the release's commit; the OCI archive holds that very image (its config digest) with every
blob intact, and the engine loads it back; the SBOM lists exactly the Python distributions the image's
interpreters see, each with its PyPI purl.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.e2e.container import engine
from tests.support.chart import offline, slugs

ROOT = Path(__file__).resolve().parent.parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SOURCE_URL = "https://git.example.com/platform/gpu-placement"
FILES = {f"gpu-placement-{VERSION}.tgz", f"gpu-placement-{VERSION}.oci.tar", f"gpu-placement-{VERSION}.cdx.json"}
# Every distribution the image's interpreters see: the service's venv, then its base interpreter's own.
_LISTED = r"""
import importlib.metadata, json, os, subprocess, sys
listing = "import importlib.metadata, json; print(json.dumps(sorted({(d.metadata['Name'], d.version) " \
          "for d in importlib.metadata.distributions()})))"
base = subprocess.run([os.path.join(sys.base_prefix, "bin", "python3"), "-c", listing], capture_output=True,
                      text=True, check=True, env={"PATH": "/usr/bin:/bin"}).stdout
print(json.dumps(sorted({(d.metadata["Name"], d.version) for d in importlib.metadata.distributions()}
                        | {tuple(d) for d in json.loads(base)})))
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.fixture(scope="module")
def release(image: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("release")
    result = subprocess.run([sys.executable, str(ROOT / "image" / "release.py"), "--out", str(out)],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "SOURCE_URL": SOURCE_URL, "IMAGE": image})
    assert result.returncode == 0, result.stderr
    return out


def test_the_checksums_verify(release: Path) -> None:
    assert {p.name for p in release.iterdir()} == FILES | {"SHA256SUMS"}
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=release, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert sorted(checked.stdout.splitlines()) == sorted(f"{name}: OK" for name in FILES)


def test_the_chart_is_versioned_as_the_image_and_renders_with_its_values(release: Path) -> None:
    archive = release / f"gpu-placement-{VERSION}.tgz"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert helm_python.lint(str(archive), offline({}), strict=True)["errors"] == []
    with helm_python.Chart.load_archive(archive.read_bytes()) as chart:
        meta = chart.metadata
        assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)
        assert meta["home"] == SOURCE_URL and meta["sources"] == [SOURCE_URL]
        assert meta["annotations"]["gpu-placement.io/source"] == f"{SOURCE_URL}/blob/{commit}"
        files = chart.render(offline({"serviceMonitor": {"enabled": True}}), name="gpu-placement",
                             namespace="gpu-placement")
    docs = [d for path, text in sorted(files.items()) if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    for doc in docs:
        if not doc["apiVersion"].startswith("monitoring.coreos.com/"):  # CRDs kubernetes-validate has no schema for
            kubernetes_validate.validate(doc, kubernetes_validate.utils.latest_version(), strict=True)
    images = {c["image"] for d in docs if d["kind"] == "Deployment"
              for c in d["spec"]["template"]["spec"].get("initContainers", []) + d["spec"]["template"]["spec"][
                  "containers"] if "kube-scheduler" not in c["image"]}
    assert images == {f"gpu-placement:{VERSION}"}
    runbook = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:docs/operations.md"], capture_output=True,
                             text=True, check=True).stdout
    [rule] = [d for d in docs if d["kind"] == "PrometheusRule"]
    for group in rule["spec"]["groups"]:
        for alert in (r for r in group["rules"] if "alert" in r):
            base, _, anchor = alert["annotations"]["runbook_url"].partition("#")
            assert base == f"{SOURCE_URL}/blob/{commit}/docs/operations.md" and anchor in slugs(runbook)


def test_the_oci_archive_holds_the_image_intact(release: Path, image: str) -> None:
    archive = release / f"gpu-placement-{VERSION}.oci.tar"
    with tarfile.open(archive) as tar:
        blobs = {m.name.removeprefix("blobs/sha256/"): m for m in tar.getmembers() if m.name.startswith("blobs/sha256/")
                 and m.isfile()}
        assert json.load(tar.extractfile("oci-layout"))["imageLayoutVersion"] == "1.0.0"  # type: ignore[arg-type]
        for digest, member in blobs.items():
            assert hashlib.sha256(tar.extractfile(member).read()).hexdigest() == digest  # type: ignore[union-attr]
        [entry] = json.load(tar.extractfile("index.json"))["manifests"]  # type: ignore[arg-type]
        manifest = json.load(tar.extractfile(blobs[entry["digest"].removeprefix("sha256:")]))  # type: ignore[arg-type]
    assert set(blobs) >= {layer["digest"].removeprefix("sha256:") for layer in manifest["layers"]}
    eng = engine()
    image_id = eng.run("image", "inspect", "--format", "{{.Id}}", image).stdout.strip()
    assert manifest["config"]["digest"].removeprefix("sha256:") == image_id.removeprefix("sha256:")
    loaded = eng.run("load", "-i", str(archive)).stdout
    assert image_id[:12] in loaded or image.split(":")[0] in loaded, loaded


def test_the_sbom_lists_exactly_the_images_python_distributions(release: Path, image: str) -> None:
    bom: dict[str, Any] = json.loads((release / f"gpu-placement-{VERSION}.cdx.json").read_text())
    assert (bom["bomFormat"], bom["specVersion"]) == ("CycloneDX", "1.6")
    root = bom["metadata"]["component"]
    listed = {(canonical(c["name"]), c["version"]) for c in [root, *bom["components"]]}
    assert len(listed) == 1 + len(bom["components"])
    for component in bom["components"]:
        assert component["purl"] == f"pkg:pypi/{canonical(component['name'])}@{component['version']}", component
    eng = engine()
    seen = json.loads(eng.run("run", "--rm", "--network", "none", *eng.flags, "--entrypoint", "python", image,
                              "-c", _LISTED).stdout)
    assert listed == {(canonical(name), version) for name, version in seen}
    assert ("gpu-placement", VERSION) in listed and ("kubernetes", dict(seen).get("kubernetes")) in listed
