"""The report's PNG export: kaleido in a child process with a time limit (autotune.output.pngs).

A browser that never answers costs the PNGs, never the caller: the export returns within its
limit, says why in one line, and leaves no process behind (the fake browser below starts a
child of its own, as Chromium does). The fake stands in for a hung Chromium, which cannot be
produced on demand; the success path runs the real kaleido and Chromium.
"""

from __future__ import annotations

import time
from pathlib import Path

import plotly.graph_objects as go

from autotune.output.pngs import write_pngs
from tests.helpers.chromium import chromium_or_skip

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _figs() -> dict[str, go.Figure]:
    return {"line": go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2])), "bars": go.Figure(go.Bar(x=[1, 2], y=[2, 5]))}


def _fake_hung_browser(tmp_path: Path) -> tuple[Path, Path]:
    """A fake browser: records its pid and its child's, then never speaks on the DevTools pipe."""
    pids = tmp_path / "pids"
    script = tmp_path / "fake-hung-browser"
    script.write_text(f"#!/bin/sh\necho $$ >> {pids}\nsleep 600 &\necho $! >> {pids}\nwait\n")
    script.chmod(0o755)
    return script, pids


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().rpartition(")")[2].split()[0] != "Z"


def test_a_browser_that_never_answers_costs_only_the_pngs(tmp_path, monkeypatch, capsys):
    script, pids = _fake_hung_browser(tmp_path)
    monkeypatch.setenv("BROWSER_PATH", str(script))
    out = tmp_path / "report"
    t0 = time.monotonic()
    assert write_pngs(_figs(), out, 400, 300, timeout_s=6) == []
    assert time.monotonic() - t0 < 20
    err = capsys.readouterr().err
    assert "PNGs skipped (kaleido did not finish in 6 s; it and its browser were stopped)" in err
    started = [int(x) for x in pids.read_text().split()]
    assert len(started) == 2, "the fake browser was never started: the test proves nothing"
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in started if _alive(p)], "the browser or its child outlived the export"
    assert list(out.iterdir()) == []  # no PNG, no job file


def test_no_browser_is_one_line_with_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chromium"))
    assert write_pngs(_figs(), tmp_path / "report", 400, 300, timeout_s=60) == []
    err = capsys.readouterr().err
    assert "PNGs skipped (no Chrome/Chromium for kaleido; fix: apt-get install chromium" in err
    assert "Traceback" not in err


def test_real_chromium_writes_every_png(tmp_path):
    chromium_or_skip()
    paths = write_pngs(_figs(), tmp_path / "report", 400, 300)
    assert [p.name for p in paths] == ["line.png", "bars.png"]
    for p in paths:
        assert p.read_bytes()[:8] == PNG_MAGIC
    assert sorted(x.name for x in (tmp_path / "report").iterdir()) == ["bars.png", "line.png"]
