"""The survey's HTML page rendered in a real browser: headless Chromium from Debian's package (the
Makefile links it into .venv/bin, installing it when missing), its DOM after the page's script ran,
and its pixels: every node a tile in its pool, coloured by its state, the findings listed."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections import Counter
from pathlib import Path

import orjson
import pytest

from gpu_placement.app.demo import write_snapshot
from gpu_placement.survey.page import STATE_COLOURS

# Flags from the machine's notes: no sandbox as root, no GPU, and none of the background connections
# this closed network refuses; a fresh profile each run.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--window-size=1280,2600")


def chromium() -> str:
    found = Path(sys.executable).with_name("chromium")
    path = str(found) if found.exists() else shutil.which("chromium")
    assert path, "no chromium: `make test` installs Debian's package (apt-get install chromium)"
    return path


def browse(tmp: Path, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=True)


def png_pixels(path: Path) -> tuple[int, int, list[bytes], int]:
    """Width, height, unfiltered rows and bytes per pixel of an 8-bit RGB or RGBA PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat, header = 8, b"", b""
    while at < len(data):
        size, kind = struct.unpack(">I4s", data[at:at + 8])
        chunk = data[at + 8:at + 8 + size]
        header = chunk if kind == b"IHDR" else header
        idat += chunk if kind == b"IDAT" else b""
        at += 12 + size
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0
    step = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    rows, previous, stride = [], bytearray(width * step), width * step
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - step] if x >= step else 0
            up, corner = previous[x], previous[x - step] if x >= step else 0
            if kind == 1:
                line[x] = (line[x] + left) & 255
            elif kind == 2:
                line[x] = (line[x] + up) & 255
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[x] = (line[x] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line))
        previous = line
    return width, height, rows, step


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, str, Path]:
    tmp = tmp_path_factory.mktemp("page")
    snapshot = tmp / "cluster.json"
    write_snapshot(str(snapshot))
    page = tmp / "fleet.html"
    made = subprocess.run([sys.executable, "-m", "gpu_placement.app.cli", "survey", "--snapshot", str(snapshot), "-o",
                           "html"], capture_output=True, text=True, timeout=120, check=False)
    assert made.returncode == 1  # the demo cluster has findings
    html = made.stdout
    page.write_text(html)
    report = orjson.loads(subprocess.run([sys.executable, "-m", "gpu_placement.app.cli", "survey", "--snapshot",
                                          str(snapshot), "-o", "json"], capture_output=True, text=True, timeout=120,
                                         check=False).stdout)
    dom = browse(tmp, page, "--dump-dom").stdout
    shot = tmp / "fleet.png"
    browse(tmp, page, f"--screenshot={shot}")
    return report, html, dom, shot


def test_the_page_is_self_contained(rendered: tuple[dict, str, str, Path]) -> None:
    _, html, _, _ = rendered
    assert html.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(?:src|href)\s*=\s*(?!["']?#)""", html), "the page loads nothing from outside"
    assert "<link" not in html and "@import" not in html and "url(" not in html


def test_the_browser_draws_every_node_in_its_pool_with_its_state(rendered: tuple[dict, str, str, Path]) -> None:
    report, _, dom, _ = rendered
    assert 'data-ready="true"' in dom  # the page's script ran in the browser
    nodes = {n["node"]: n for group in report["inventory"] for n in group["nodeDetails"]}
    tiles = re.findall(r'<div class="tile (\w+)" id="node-([\w.-]+)" data-node="[\w.-]+" data-state="([\w-]+)" '
                       r'data-management="([^"]+)"', dom)
    assert len(tiles) == len(nodes) == 21
    for frame, name, state, management in tiles:
        assert (state, management) == (nodes[name]["state"], nodes[name]["management"]), name
        assert frame == {"gpu-operator": "managed", "gpu-operator, pre-installed driver": "preinstalled",
                         "not managed": "unmanaged"}[management]
    pools = re.findall(r'<section class="pool" data-pool="([^"]+)">', dom)
    assert pools == ["batch", "training", "-"]
    training = dom.split('data-pool="training"', 1)[1].split("</section>", 1)[0]
    assert 'data-node="h100-train-hand"' in training and "UnmanagedNode" in training and "DriverSkew" in training
    rows = re.findall(r'<tr class="finding" data-code="(\w+)" data-nodes="([^"]*)">', dom)
    assert [code for code, _ in rows] == [f["code"] for f in report["findings"]]
    assert ("HandSetLabels", "l40s-relabelled") in rows
    assert '<b>1</b>not managed' in dom


def test_the_screenshot_shows_the_states_in_their_colours(rendered: tuple[dict, str, str, Path]) -> None:
    """Tile backgrounds are flat colours: count the pixels of each state's colour in the rendered page."""
    report, _, _, shot = rendered
    width, height, rows, step = png_pixels(shot)
    assert (width, height) == (1280, 2600)
    counts: Counter[bytes] = Counter()
    for row in rows:
        counts.update(row[x:x + 3] for x in range(0, len(row), step))
    tiles = Counter(n["state"] for g in report["inventory"] for n in g["nodeDetails"])
    for state, colour in STATE_COLOURS.items():
        if state not in tiles:
            continue
        rgb = bytes.fromhex(colour[1:])
        area = 168 * 92 // 2  # at least half a tile's area per tile of that colour
        assert counts[rgb] >= area * tiles[state], (state, counts[rgb])


def test_each_state_has_a_colour_of_its_own(rendered: tuple[dict, str, str, Path]) -> None:
    """A driver upgrade and a MIG reconfiguration are different stories: the page tells them apart, as it
    does every state; on the screenshot each one's tile shows its own colour."""
    assert len(set(STATE_COLOURS.values())) == len(STATE_COLOURS)
    report, _, dom, shot = rendered
    states = {n["node"]: n["state"] for g in report["inventory"] for n in g["nodeDetails"]}
    assert (states["h100-upgrading"], states["h100-mig-pending"]) == ("DriverUpgrade", "MIGReconfiguring")
    for name in ("h100-upgrading", "h100-mig-pending"):
        tile = re.search(rf'id="node-{name}"[^>]*style="background:(#[0-9a-f]+)"', dom)
        assert tile and tile.group(1) == STATE_COLOURS[states[name]]
    _, _, rows, step = png_pixels(shot)
    seen = {bytes(row[x:x + 3]) for row in rows for x in range(0, len(row), step)}
    assert bytes.fromhex(STATE_COLOURS["DriverUpgrade"][1:]) in seen
    assert bytes.fromhex(STATE_COLOURS["MIGReconfiguring"][1:]) in seen


def test_tiles_are_in_the_order_a_person_reads_node_names(tmp_path: Path) -> None:
    """x2, x13, x103: numbers in names sort as numbers, in the browser's DOM as in the text."""
    from gpu_placement.samples.cluster import make_node, validator_pod, with_label_writers

    names = ["gpu-x103", "gpu-x13", "gpu-x2", "gpu-x13b"]
    objects = [o for name in names for o in (with_label_writers(make_node(name, "h100")), validator_pod(name))]
    snapshot = tmp_path / "nodes.json"
    snapshot.write_bytes(orjson.dumps({"kind": "List", "items": objects}))
    page = tmp_path / "fleet.html"
    made = subprocess.run([sys.executable, "-m", "gpu_placement.app.cli", "survey", "--snapshot", str(snapshot), "-o",
                           "html"], capture_output=True, text=True, timeout=120, check=False)
    page.write_text(made.stdout)
    dom = browse(tmp_path, page, "--dump-dom").stdout
    assert re.findall(r'<div class="tile \w+" id="node-([\w.-]+)"', dom) == ["gpu-x2", "gpu-x13", "gpu-x13b",
                                                                          "gpu-x103"]
