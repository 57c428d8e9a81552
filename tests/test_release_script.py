"""image/release.py's own logic that needs no image: the repository a chart names, from a git remote."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("release", Path(__file__).resolve().parent.parent / "image" /
                                               "release.py")
assert _SPEC is not None and _SPEC.loader is not None
release = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(release)


@pytest.mark.parametrize(("remote", "url"), [
    ("git@github.com:acme/gpu-placement.git", "https://github.com/acme/gpu-placement"),
    ("git@gitlab.example.com:platform/gpu/gpu-placement.git\n", "https://gitlab.example.com/platform/gpu/gpu-placement"),
    ("ssh://git@git.example.com:2222/platform/gpu-placement.git", "https://git.example.com/platform/gpu-placement"),
    ("https://ci-token@git.example.com/platform/gpu-placement.git", "https://git.example.com/platform/gpu-placement"),
    ("https://github.com/acme/gpu-placement/", "https://github.com/acme/gpu-placement"),
    ("/srv/git/gpu-placement.git", None),  # a folder: nothing a reader elsewhere can open
    ("file:///srv/git/gpu-placement.git", None),
])
def test_a_git_remote_becomes_the_url_people_browse(remote: str, url: str | None) -> None:
    assert release.https_url(remote) == url
