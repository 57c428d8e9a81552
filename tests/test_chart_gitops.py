"""The chart as GitOps renders it (issue 34, P7 of shared/review/ux-trial.md): Argo CD runs `helm template`
with `--kube-version` as major.minor, which Helm reads as X.Y.0; the chart used to deploy
`kube-scheduler:vX.Y.0` for ever, and refused a real `--kube-version v1.37.0` telling the user to pass
`--kube-version`. Rendered by Helm v4 in-process (helm_python; the render options carry kube_version as
`helm template --kube-version` does)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml
from helm_python import _native

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "gpu-placement"


@pytest.fixture(scope="module")
def chart() -> Iterator[helm_python.Chart]:
    with helm_python.Chart.load(CHART) as loaded:
        yield loaded


def render(chart: helm_python.Chart, kube_version: str | None, values: dict[str, Any] | None = None) -> list[dict]:
    opts: dict[str, Any] = {"name": "gpu-placement", "namespace": "gpu-placement"}
    if kube_version is not None:
        opts["kube_version"] = kube_version
    files = json.loads(_native.call_string("helm_render", chart._raw(), json.dumps(values or {}), json.dumps(opts)))
    return [doc for path, text in sorted(files.items()) if path.endswith(".yaml") for doc in yaml.safe_load_all(text)
            if doc]


def scheduler_image(docs: list[dict]) -> str:
    deployment = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-scheduler"))
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c["image"] for c in containers if c["name"] == "kube-scheduler")


def test_the_tested_release_is_the_e2e_suites() -> None:
    tested = re.search(r'define "gpu-placement.testedKubeVersion" -\}\}(v[\d.]+)\{\{', (
        CHART / "templates" / "_helpers.tpl").read_text())
    script = (ROOT / "tests" / "e2e" / "build_control_plane.sh").read_text()
    e2e = re.search(r'K8S_VERSION="\$\{K8S_VERSION:-([\d.]+)\}"', script)
    assert tested and e2e and tested.group(1) == f"v{e2e.group(1)}"


@pytest.mark.parametrize(("kube_version", "image"), [
    ("1.37", "registry.k8s.io/kube-scheduler:v1.37.2"),  # Argo CD on the tested minor: the tested patch, not .0
    ("v1.37.0", "registry.k8s.io/kube-scheduler:v1.37.2"),  # was refused, telling the user to pass --kube-version
    ("v1.36.4", "registry.k8s.io/kube-scheduler:v1.36.4"),  # a patch was given: used
    ("v1.31.4-eks-1552ad0", "registry.k8s.io/kube-scheduler:v1.31.4"),
    ("1.37.2+k3s1", "registry.k8s.io/kube-scheduler:v1.37.2"),
])
def test_kube_scheduler_follows_a_version_with_its_patch(chart: helm_python.Chart, kube_version: str,
                                                         image: str) -> None:
    assert scheduler_image(render(chart, kube_version)) == image


@pytest.mark.parametrize("kube_version", ["1.36", "v1.35.0", None])
def test_a_version_without_its_patch_is_never_guessed(chart: helm_python.Chart, kube_version: str | None) -> None:
    """Argo CD's `--kube-version 1.36` rendered kube-scheduler:v1.36.0 without a word."""
    with pytest.raises(helm_python.HelmRenderError) as caught:
        render(chart, kube_version)
    message = " ".join(str(caught.value).split())
    assert ("scheduler.image.tag: rendered without a cluster to ask (helm template, --dry-run=client, Argo CD)"
            in message)
    assert "set scheduler.image.tag once to your control plane's full version (kubectl version, Server Version)" \
        in message
    assert "or pass --kube-version with the patch" in message and "this chart was tested with v1.37.2" in message


@pytest.mark.parametrize("kube_version", ["1.36", "1.37", None])
def test_a_pinned_tag_wins(chart: helm_python.Chart, kube_version: str | None) -> None:
    docs = render(chart, kube_version, {"scheduler": {"image": {"tag": "v1.36.4"}}})
    assert scheduler_image(docs) == "registry.k8s.io/kube-scheduler:v1.36.4"


def test_deploy_md_has_argo_cd_and_flux_sections() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text()
    for heading in ("## GitOps: Argo CD and Flux", "### Argo CD", "### Flux"):
        assert f"\n{heading}\n" in text
    assert "jqPathExpressions: [.webhooks]" in text and "RespectIgnoreDifferences=true" in text


def test_no_reference_to_a_file_users_do_not_get() -> None:
    """values.yaml, values.schema.json, _helpers.tpl and config.py pointed at CONTRACT.md, which is not in
    the repository users get."""
    offenders = [str(path.relative_to(ROOT)) for folder in ("charts", "gpu_placement", "webhook", "extender", "docs",
                                                           "tests")
                 for path in (ROOT / folder).rglob("*") if path.is_file() and path.suffix in (
                     ".py", ".yaml", ".json", ".tpl", ".md", ".txt") and "CONTRACT.md" in path.read_text()
                 and path.name != "test_chart_gitops.py"]
    offenders += [name for name in ("README.md",) if "CONTRACT.md" in (ROOT / name).read_text()]
    assert offenders == []
