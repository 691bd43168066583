"""The GPU check in stages, each one command of under 10 minutes, each row kept as it finishes.

A lent GPU machine runs one command for at most 10 minutes; what a killed command wrote
under ``$OUT`` still comes back, and ignored folders inside the checkout survive to the next
command on the same machine. So the check is a sequence of :data:`STAGES`
(``python -m bench.gpu.kit.check --stage NAME``; docs/gpu.md):

``env``      environment and imports;
``ext``      CUDA extension builds (exllamav2, exllamav3) into ``TORCH_EXTENSIONS_DIR`` under
             the state folder, so the next command reuses them (an interrupted build resumes);
``models``   the tiny HF models and their EXL2 / EXL3 / GGUF conversions;
``exl2-a``, ``exl2-b``, ``llamacpp``, ``exl3``  the trial rows, in groups;
``table``    the table of every row so far.

State lives in the git-ignored ``bench/gpu/.work/`` (:func:`default_state`): ``env.json``,
``variants.json``, the models, the extensions and ``rows.jsonl``. Each row is appended,
flushed and fsynced to ``rows.jsonl`` in the state folder *and* in the output folder the moment
it finishes (:class:`RowLog`), so a stage killed at the limit leaves its finished rows. A
stage re-run alone skips what is done: conversions with their ``.done`` marker, rows whose
case already has a row other than ``skipped``. A stage starts no new trial or conversion
past its budget (``--budget-s``, 540 s) and caps each one's timeout at what is left.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from collections.abc import Iterable
from dataclasses import asdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
STAGES = ("env", "ext", "models", "exl2-a", "exl2-b", "llamacpp", "exl3", "table")
ROW_STAGES = ("exl2-a", "exl2-b", "llamacpp", "exl3")
BUDGET_S = 540.0  # a stage's own budget: under the 10-minute command limit with start-up to spare
DONE = ".done"


def default_state() -> Path:
    """``bench/gpu/.work`` in this checkout (git-ignored; kept between commands on one machine)."""
    return ROOT / "bench" / "gpu" / ".work"


def select_stages(names: Iterable[str]) -> list[str]:
    """The stages to run, in check order; ``all`` is every stage. Unknown names raise ValueError."""
    names = list(names) or ["all"]
    wanted: set[str] = set()
    for n in names:
        if n == "all":
            wanted.update(STAGES)
        elif n in STAGES:
            wanted.add(n)
        else:
            raise ValueError(f"unknown stage {n!r}; expected all or one of: {', '.join(STAGES)}")
    return [s for s in STAGES if s in wanted]


class Deadline:
    """The stage's budget: whether to start more work, and how long the next step may take."""

    def __init__(self, budget_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.end = clock() + budget_s

    def left(self) -> float:
        return self.end - self.clock()

    def timeout(self, wanted_s: float, floor_s: float = 30.0) -> float:
        """``wanted_s`` capped at what is left of the budget (at least ``floor_s``)."""
        return max(floor_s, min(wanted_s, self.left()))

    def expired(self) -> bool:
        return self.left() <= 0


class RowLog:
    """Rows as JSON lines, appended to every path and fsynced one by one.

    A reader takes the last row of each case (:meth:`latest`); a killed writer leaves at most
    one partial last line, which :meth:`read` ignores.
    """

    def __init__(self, *paths: Path) -> None:
        self.paths = [Path(p) for p in dict.fromkeys(Path(p).resolve() for p in paths)]
        for p in self.paths:
            p.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, default=str) + "\n"
        for p in self.paths:
            with open(p, "a+b") as f:
                if f.tell() and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n":
                    line_bytes = b"\n" + line.encode()  # end a row cut off by a kill first
                else:
                    line_bytes = line.encode()
                f.write(line_bytes)
                f.flush()
                os.fsync(f.fileno())

    def read(self) -> list[dict]:
        """Every complete row of the first path (the state)."""
        out = []
        p = self.paths[0]
        if not p.exists():
            return out
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a row cut off by a kill
        return out

    def latest(self) -> dict[str, dict]:
        """The last row of each case, in first-seen order of the cases."""
        out: dict[str, dict] = {}
        for r in self.read():
            out[r["row"]["case"]] = r
        return out

    def done(self) -> set[str]:
        """Cases that ran (any status but ``skipped``): a re-run does not repeat them."""
        return {c for c, r in self.latest().items() if r["row"]["status"] != "skipped"}


@dataclass(frozen=True)
class StageResult:
    """What a stage did: rows run, rows skipped as done, and whether the budget stopped it."""

    ran: list[str]
    already_done: list[str]
    out_of_time: list[str]


def run_rows(cases: list, run_one: Callable[[Any, float], tuple[Any, dict]], log: RowLog,
             deadline: Deadline, wanted_timeout_s: float, say: Callable[[str], None] = print) -> StageResult:
    """Run each case not yet done, logging its row the moment it finishes.

    ``run_one(case, timeout_s) -> (Row, raw)``; a row is a dataclass with ``case`` and
    ``status``. Cases left when the budget runs out are named in the result.
    """
    done = log.done()
    ran, skipped, left = [], [], []
    for case in cases:
        if case.name in done:
            skipped.append(case.name)
            continue
        if deadline.expired():
            left.append(case.name)
            continue
        row, raw = run_one(case, deadline.timeout(wanted_timeout_s))
        log.append({"row": asdict(row), "raw": raw, "at": time.time()})
        ran.append(case.name)
        say(f"row: {row.case}: {row.status}")
    if left:
        say(f"budget spent: {len(left)} case(s) left ({', '.join(left)}); run this stage again")
    return StageResult(ran, skipped, left)


def mark_done(folder: Path, what: dict | None = None) -> None:
    """Mark a made product (a converted model) complete."""
    (folder / DONE).write_text(json.dumps(what or {}) + "\n")


def is_done(folder: Path) -> bool:
    return (folder / DONE).exists()


def load_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return default
