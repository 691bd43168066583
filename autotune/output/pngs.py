"""PNG images of the report's plots, written by kaleido in a child process with a time limit.

kaleido drives a headless Chromium that it starts in a session of its own. Once, on a loaded
CI machine, it never returned, and the study's end (exports written, the lock released) waited
on it. The export now runs in a child process (``python -m autotune.output.pngs JOB``): past
``timeout_s`` the child and every descendant it started, the browser included, are stopped
(:func:`autotune._process_group.stop_tree`) and the report goes on without PNGs. A stuck
browser costs the PNGs, never the study.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from autotune._process_group import stop_tree

if TYPE_CHECKING:
    import plotly.graph_objects as go

PNG_TIMEOUT_S = 120.0  # for all the figures together; a healthy export of 6 plots takes 5-15 s
NO_CHROME = "no Chrome/Chromium for kaleido; fix: apt-get install chromium (or plotly_get_chrome)"


def write_pngs(figs: dict[str, go.Figure], out: Path, width: int, height: int,
               timeout_s: float = PNG_TIMEOUT_S) -> list[Path]:
    """``out/<name>.png`` for each figure; [] with a one-line warning when kaleido fails or
    takes longer than ``timeout_s`` (then it and its browser are stopped)."""
    if not figs:
        return []
    paths = [out / f"{name}.png" for name in figs]
    job = {"width": width, "height": height,
           "figs": [[str(p), fig.to_json()] for p, fig in zip(paths, figs.values(), strict=True)]}
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="autotune-pngs-", delete=False) as f:
        json.dump(job, f)
    job_path = Path(f.name)
    proc = subprocess.Popen([sys.executable, "-m", "autotune.output.pngs", str(job_path)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
        why = None if proc.returncode == 0 else _last_line(err) or f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        stop_tree(proc, grace_s=2.0)
        proc.communicate()
        why = f"kaleido did not finish in {timeout_s:g} s; it and its browser were stopped"
    finally:
        job_path.unlink(missing_ok=True)
    if why:
        for p in paths:
            p.unlink(missing_ok=True)
        print(f"warning: PNGs skipped ({why}); report.html is complete", file=sys.stderr)
        return []
    return paths


def _last_line(text: str) -> str:
    return next((x.strip() for x in reversed(text.splitlines()) if x.strip()), "")


def main(argv: list[str]) -> int:
    """The child: read the job file, write every PNG; on failure one line on stderr, exit 1."""
    import plotly.io as pio

    job = json.loads(Path(argv[0]).read_text())
    figs = [pio.from_json(text) for _, text in job["figs"]]
    try:
        pio.write_images(figs, [p for p, _ in job["figs"]], width=job["width"], height=job["height"])
    except Exception as e:  # noqa: BLE001 - reported to the parent in one line
        why = next((x.strip() for x in str(e).splitlines() if x.strip()), type(e).__name__)
        if "chrome" in f"{e} {e.__context__}".lower():  # plotly's message starts with blank lines
            why = NO_CHROME
        print(why, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
