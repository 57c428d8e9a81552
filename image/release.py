"""`make release`: what a team pushes to its own registries, in one folder, dist/release/<version>/.

    gpu-placement-<version>.tgz       the Helm chart (`helm package` through helm_python, the Helm v4 SDK):
                                      chart version = appVersion = the image's tag = pyproject's version
    gpu-placement-<version>.oci.tar   the image `make image` built, gpu-placement:<version>, as an OCI archive
                                      (`podman save --format oci-archive`; docker's `save` writes the same
                                      OCI layout since Docker 25)
    gpu-placement-<version>.cdx.json  the image's Python distributions as a CycloneDX SBOM, made by
                                      cyclonedx-py from their own metadata (each *.dist-info the image's
                                      interpreters see: the service's venv and the base's Python)
    SHA256SUMS                        `sha256sum -c SHA256SUMS` verifies the three

The chart records where it comes from when that is known (SOURCE_URL, else the git remote `origin` as an
https URL): Chart.yaml's `home` and `sources`, and the annotation `gpu-placement.io/source`, the source tree
at this commit (`<url>/blob/<commit>`), from which the alerts' runbook links and NOTES.txt's pointers are
made. Without one the chart keeps relative paths and this says so.

    python image/release.py [--out DIR]   (IMAGE=... names another image; SOURCE_URL=... the repository)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from pathlib import Path

import helm_python

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "gpu-placement"
SOURCE_ANNOTATION = "gpu-placement.io/source"

# Run by the image's own interpreter: a tar on stdout of every *.dist-info folder it or its base
# interpreter can import from (the service's venv, the base's site-packages), each under its folder's name.
_DIST_INFO = r"""
import glob, io, os, sys, sysconfig, tarfile
roots = set()
for base in (sys.prefix, sys.base_prefix):
    paths = sysconfig.get_paths(vars={"base": base, "platbase": base})
    roots.update(paths[key] for key in ("purelib", "platlib"))
roots.update(glob.glob("/usr/lib/python3*/dist-packages") + glob.glob("/usr/lib/python3/dist-packages"))
out = io.BytesIO()
with tarfile.open(fileobj=out, mode="w") as tar:
    for root in sorted(r for r in roots if os.path.isdir(r)):
        for info in sorted(glob.glob(os.path.join(root, "*.dist-info"))):
            tar.add(info, arcname=os.path.basename(info))
sys.stdout.buffer.write(out.getvalue())
"""


class ReleaseError(RuntimeError):
    """A step that cannot be done: the message says what to do."""


def say(message: str) -> None:
    print(f"release: {message}", file=sys.stderr, flush=True)


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def engine() -> tuple[list[str], list[str]]:
    """The engine `make image` built with, as a command, and the flags its `run` needs here (the limits
    podman may set: image/build.sh --print-engine)."""
    printed = [*subprocess.run(["bash", str(ROOT / "image" / "build.sh"), "--print-engine"], capture_output=True,
                               text=True, check=True).stdout.splitlines(), ""]
    return printed[0].split(), printed[1].split()


def https_url(remote: str) -> str | None:
    """A git remote as the https URL people browse: git@host:org/repo.git and ssh://, https:// forms."""
    remote = remote.strip()
    match = (re.fullmatch(r"[\w.-]+@([\w.-]+):(?!/)(.+?)(?:\.git)?/?", remote)  # scp-like: git@host:org/repo
             or re.fullmatch(r"(?:ssh|git|https?)://(?:[^@/]+@)?([\w.-]+)(?::\d+)?/(.+?)(?:\.git)?/?", remote))
    if match is None:
        return None  # a local path or file:// URL: nothing a reader elsewhere can open
    host, path = match.groups()
    return f"https://{host}/{path}"


def source() -> tuple[str | None, str]:
    """(the repository's URL or None, the commit)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    if "SOURCE_URL" in os.environ:
        url = os.environ["SOURCE_URL"].strip().removesuffix("/") or None
    else:
        remote = subprocess.run(["git", "-C", str(ROOT), "remote", "get-url", "origin"], capture_output=True,
                                text=True)
        url = https_url(remote.stdout) if remote.returncode == 0 else None
    if subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                      capture_output=True, text=True, check=True).stdout.strip():
        say(f"the tree has changes not committed: the chart is packaged from the tree, its links name {commit[:12]}")
    return url, commit


def package_chart(out: Path, release: str, url: str | None, commit: str) -> Path:
    """The chart at `release`, with where it comes from in Chart.yaml when that is known."""
    with tempfile.TemporaryDirectory() as work:
        chart = Path(work) / CHART.name
        shutil.copytree(CHART, chart)
        meta = chart / "Chart.yaml"
        text = meta.read_text()
        if url is not None:
            if re.search(r"^(home|sources|annotations):", text, re.MULTILINE):
                raise ReleaseError(f"{meta.relative_to(Path(work))} already has home, sources or annotations: "
                                   "merge the release's into them in image/release.py")
            meta.write_text(f"{text.rstrip()}\nhome: {url}\nsources:\n  - {url}\nannotations:\n"
                            f"  {SOURCE_ANNOTATION}: {url}/blob/{commit}\n")
        else:
            say("no SOURCE_URL and no git remote origin: the chart's runbook links stay relative "
                "(docs/operations.md); set SOURCE_URL=https://HOST/ORG/gpu-placement")
        return Path(helm_python.package(chart, destination=out, version=release, app_version=release))


def save_image(out: Path, image: str, release: str) -> Path:
    command, _ = engine()
    if subprocess.run([*command, "image", "inspect", image], capture_output=True).returncode != 0:
        raise ReleaseError(f"no image {image}: run `make image` first")
    archive = out / f"gpu-placement-{release}.oci.tar"
    archive.unlink(missing_ok=True)
    oci = ["--format", "oci-archive", "--quiet"] if command[0] == "podman" else []
    subprocess.run([*command, "save", *oci, "-o", str(archive), image], check=True, stdout=subprocess.DEVNULL)
    return archive


def sbom(out: Path, image: str, release: str) -> Path:
    """cyclonedx-py over the image's distributions: their *.dist-info folders, taken out of the image by
    its own interpreter, laid in an empty venv here (cyclonedx-py reads an environment's metadata)."""
    command, flags = engine()
    taken = subprocess.run([*command, "run", "--rm", "--network", "none", *flags, "--entrypoint", "python", image,
                            "-c", _DIST_INFO], capture_output=True, check=True).stdout
    document = out / f"gpu-placement-{release}.cdx.json"
    with tempfile.TemporaryDirectory() as work:
        env = Path(work) / "image-python"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
        purelib = subprocess.run([str(env / "bin" / "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        with tarfile.open(fileobj=io.BytesIO(taken)) as tar:
            tar.extractall(purelib, filter="data")
        cyclonedx = Path(sys.executable).with_name("cyclonedx-py")
        subprocess.run([str(cyclonedx), "environment", "--pyproject", str(ROOT / "pyproject.toml"),
                        "--mc-type", "application", "--output-reproducible", "--of", "JSON", "-o", str(document),
                        str(env)], check=True)
    return document


def checksums(out: Path, files: list[Path]) -> Path:
    """SHA256SUMS in sha256sum's own format (two spaces, the name), so `sha256sum -c` reads it."""
    sums = out / "SHA256SUMS"
    lines = []
    for path in files:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        lines.append(f"{digest.hexdigest()}  {path.name}\n")
    sums.write_text("".join(lines))
    return sums


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="image/release.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the folder (default dist/release/<version>)")
    args = parser.parse_args(argv)
    release = version()
    image = os.environ.get("IMAGE") or f"gpu-placement:{release}"
    out: Path = args.out or ROOT / "dist" / "release" / release
    out.mkdir(parents=True, exist_ok=True)
    try:
        url, commit = source()
        files = [package_chart(out, release, url, commit)]
        say(f"chart {files[-1].name}")
        files.append(save_image(out, image, release))
        say(f"image {image} as {files[-1].name}: {files[-1].stat().st_size / 1e6:.0f} MB")
        files.append(sbom(out, image, release))
        say(f"SBOM {files[-1].name}")
    except ReleaseError as exc:
        say(str(exc))
        return 1
    say(f"{checksums(out, files).name}: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
