"""``mixle-parallel report``: one self-contained HTML page, rendered in a real headless Chromium.

The browser is Debian's ``chromium`` (``scripts/dev setup`` installs it, like Java for Spark). The page is
loaded from a file with networking off; the test checks the DOM Chromium built holds every figure with its
data points, and that the screenshot is a drawn page (many coloured pixels), not a blank one.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from mixle_parallel.cli import main
from tests.verification.run_folder import make_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PLOTS = ("loss", "step_time", "audits", "em_loglik", "certificates", "verdict")


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("MIXLE_PARALLEL_HOME", str(tmp_path / "home"))


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=180, check=True)


def _pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB/RGBA PNG, unfiltered (the standard's five filters)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        body = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6), (depth, colour)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw, stride, rows, prior = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = prior[i], prior[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(bytes(line))
        prior = line
    return width, height, rows


def test_the_report_is_self_contained_and_every_plot_is_drawn_in_chromium(tmp_path, capsys):
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed: `scripts/dev setup` installs it "
                    "(apt-get install -y chromium)")
    run = make_run(tmp_path / "run")
    out = run / "report.html"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = out.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "the report must not load anything"
    assert "<script" not in page
    dom = _chromium(tmp_path, "--dump-dom", out.as_uri()).stdout
    for plot in PLOTS:
        figure = re.search(rf'<figure class="plot[^"]*" data-plot="{plot}" data-points="(\d+)">(.*?)</figure>', dom,
                           re.S)
        assert figure is not None, f"figure {plot} is not in the DOM Chromium built"
        points = int(figure.group(1))
        assert points > 0 and figure.group(2).count('class="point') >= min(points, 1), plot
    assert 'data-plot="verdict"' in dom and "verify-run verdict: VERIFIED" in dom
    assert dom.count('class="point finding"') == 1  # the one device finding of the run folder
    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1360,1500", out.as_uri())
    width, height, rows = _pixels(shot.read_bytes())
    step = 4 if len(rows[0]) == width * 4 else 3
    colours = {row[i:i + 3] for row in rows[::3] for i in range(0, len(row), step * 3)}
    drawn = sum(1 for row in rows[::3] for i in range(0, len(row), step * 3) if row[i:i + 3] != b"\xff\xff\xff")
    assert len(colours) > 20 and drawn > 2000, (len(colours), drawn)


def test_report_refuses_a_missing_folder(tmp_path):
    assert main(["report", str(tmp_path / "nope"), "-o", str(tmp_path / "r.html")]) == 2
