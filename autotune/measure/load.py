"""Load generation: run sessions at a concurrency or a request rate, and judge a level's SLO.

A *session* is what one user does in sequence: one request for single-turn workloads, a
whole conversation for multi-turn ones (see :mod:`autotune.measure.conversations`).

- Closed loop (``arrival: closed``): ``level`` users (threads); each takes the next
  session as soon as its previous one is done, so ``level`` sessions are in flight.
- Open loop (``arrival: poisson``): sessions start at Poisson arrival times at ``level``
  sessions/s (exponential gaps drawn from the workload's seed), whatever is in flight;
  the client-side wait before a request could be sent counts in its TTFT and e2e.

Every request becomes an :class:`Outcome`. A failed request is counted, never swallowed:
its kind is ``oom`` (MemoryError or an out-of-memory message), ``rejected`` (the server
refused it: HTTP 429/503 or a rejection) or ``error``; :class:`InfeasibleConfig` aborts
the trial as before. Definitions of the level metrics are in docs/metrics.md.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from collections.abc import Generator as PyGenerator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field

import numpy as np

from autotune.errors import InfeasibleConfig
from autotune.measure.types import Generation
from autotune.measure.types import Generator

MAX_OPEN_LOOP_WORKERS = 256


@dataclass(frozen=True)
class Request:
    """One request of a session: the prompt, its output length, and which turn it is (1-based)."""

    prompt: str
    max_tokens: int
    turn: int = 1


# A session yields requests and is sent each request's Generation (None if it failed).
Session = PyGenerator[Request, "Generation | None", None]
SessionFactory = Callable[[int], Session]


@dataclass
class Outcome:
    """One request as measured: who sent it, which turn, its timing or its failure."""

    user: int
    session: int
    turn: int
    gen: Generation | None
    kind: str = "ok"  # ok | oom | rejected | error
    error: str = ""
    memory: dict[str, float] = field(default_factory=dict)
    exc: BaseException | None = field(default=None, repr=False)
    prompt: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.kind == "ok" and self.gen is not None


@dataclass
class LevelRun:
    """All outcomes of one load level and the wall time from first submit to last finish."""

    level: float
    arrival: str
    outcomes: list[Outcome]
    wall_s: float

    @property
    def gens(self) -> list[Generation]:
        return [o.gen for o in self.outcomes if o.ok]

    @property
    def errors(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def error_rate(self) -> float:
        return len(self.errors) / len(self.outcomes) if self.outcomes else 0.0


def classify(exc: BaseException) -> str:
    """``oom``, ``rejected`` or ``error`` for an exception raised by ``generate``."""
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, MemoryError) or "out of memory" in text or "outofmemory" in text:
        return "oom"
    status = getattr(exc, "status", None)
    if status in (429, 503) or "reject" in text or "too many requests" in text:
        return "rejected"
    return "error"


def _shift(gen: Generation, delay_s: float) -> Generation:
    """The generation with ``delay_s`` of client-side waiting added before its submit."""
    if delay_s <= 0:
        return gen
    gen.chunk_times = [t + delay_s for t in gen.chunk_times]
    gen.e2e_s += delay_s
    return gen


def _drive(engine: Generator, session: Session, user: int, index: int, out: list[Outcome],
           lock: threading.Lock, sample_memory: bool, delay_s: float = 0.0,
           ignore_eos: bool = True) -> None:
    """Run one session to its end, appending an Outcome per request."""
    try:
        req = next(session)
    except StopIteration:
        return
    while True:
        try:
            gen = _shift(engine.generate(req.prompt, req.max_tokens, ignore_eos), delay_s)
            outcome = Outcome(user, index, req.turn, gen, prompt=req.prompt)
        except InfeasibleConfig:
            raise
        except Exception as e:  # noqa: BLE001 - counted as a failed request, with its reason
            gen = None
            outcome = Outcome(user, index, req.turn, None, classify(e), f"{type(e).__name__}: {e}",
                              exc=e, prompt=req.prompt)
        delay_s = 0.0
        if sample_memory:
            outcome.memory = dict(engine.memory())
        with lock:
            out.append(outcome)
        if gen is None:
            session.close()  # a conversation cannot go on without its last answer
            return
        try:
            req = session.send(gen)
        except StopIteration:
            return


def run_closed(engine: Generator, sessions: SessionFactory, users: int, n_sessions: int,
               deadline: float = math.inf, sample_memory: bool = False,
               ignore_eos: bool = True) -> LevelRun:
    """``users`` threads run ``n_sessions`` sessions, each user one at a time.

    No new session starts after ``deadline`` (``time.monotonic()``); those in flight finish.
    The users start together: on a busy machine a thread that starts late would otherwise
    find the first sessions done and the level would not be the concurrency it names.
    """
    out: list[Outcome] = []
    lock = threading.Lock()
    counter = iter(range(n_sessions))
    start = threading.Barrier(users)

    def user_loop(user: int) -> None:
        start.wait(timeout=60)
        while time.monotonic() < deadline:
            with lock:
                index = next(counter, None)
            if index is None:
                return
            _drive(engine, sessions(index), user, index, out, lock, sample_memory,
                   ignore_eos=ignore_eos)

    t0 = time.perf_counter()
    if users == 1:
        user_loop(0)
    else:
        with ThreadPoolExecutor(users) as pool:
            for f in [pool.submit(user_loop, u) for u in range(users)]:
                f.result()
    return LevelRun(users, "closed", out, time.perf_counter() - t0)


def arrival_times(rate: float, n: int, seed: int) -> list[float]:
    """Seconds from the start at which ``n`` Poisson arrivals at ``rate``/s happen (seeded)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=n)
    return np.concatenate([[0.0], np.cumsum(gaps)[:-1]]).tolist() if n else []


def run_poisson(engine: Generator, sessions: SessionFactory, rate: float, n_sessions: int,
                seed: int = 0, deadline: float = math.inf, sample_memory: bool = False,
                max_in_flight: int = MAX_OPEN_LOOP_WORKERS, ignore_eos: bool = True) -> LevelRun:
    """Open loop: session k starts at its Poisson arrival time, whatever is in flight.

    If ``max_in_flight`` sessions are already running, a new one waits for a worker and
    that wait counts in its first request's TTFT and e2e (the client was late, not the
    server's fault, but the user still waited).
    """
    out: list[Outcome] = []
    lock = threading.Lock()
    times = arrival_times(rate, n_sessions, seed)
    t0 = time.perf_counter()

    def start(index: int, due: float) -> None:
        late = max(0.0, time.perf_counter() - t0 - due)
        _drive(engine, sessions(index), index, index, out, lock, sample_memory, late, ignore_eos)

    with ThreadPoolExecutor(min(max_in_flight, max(1, n_sessions))) as pool:
        futures = []
        for index, due in enumerate(times):
            wait = due - (time.perf_counter() - t0)
            if wait > 0:
                time.sleep(wait)
            if time.monotonic() >= deadline:
                break
            futures.append(pool.submit(start, index, due))
        for f in futures:
            f.result()
    return LevelRun(rate, "poisson", out, time.perf_counter() - t0)


def request_ttft_ms(g: Generation) -> float | None:
    return g.chunk_times[0] * 1e3 if g.chunk_times else None


def request_itl_ms(g: Generation) -> float | None:
    """Mean gap between output chunks of one request (None with fewer than two chunks)."""
    if len(g.chunk_times) < 2:
        return None
    return (g.chunk_times[-1] - g.chunk_times[0]) * 1e3 / (len(g.chunk_times) - 1)


def meets_request_slo(g: Generation, slo) -> bool:
    """Whether one request met every per-request bound of ``slo`` (TTFT, mean ITL, e2e)."""
    ttft, itl = request_ttft_ms(g), request_itl_ms(g)
    if slo.ttft_p95_ms is not None and (ttft is None or ttft > slo.ttft_p95_ms):
        return False
    if slo.itl_p95_ms is not None and itl is not None and itl > slo.itl_p95_ms:
        return False
    return slo.e2e_p99_ms is None or g.e2e_s * 1e3 <= slo.e2e_p99_ms


def slo_violations(metrics: dict[str, float], error_rate: float, slo) -> list[str]:
    """The SLO bounds a level broke, as readable strings ([] = it meets the SLO)."""
    out = []
    for key in ("ttft_p95_ms", "itl_p95_ms", "e2e_p99_ms"):
        bound = getattr(slo, key)
        value = metrics.get(key, math.nan)
        if bound is not None and not value <= bound:  # NaN (no data) breaks the bound too
            out.append(f"{key}={value:.4g} > {bound:g}")
    if error_rate > slo.error_rate:
        out.append(f"error_rate={error_rate:.3g} > {slo.error_rate:g}")
    return out


def fairness_metrics(run: LevelRun) -> dict[str, float]:
    """Spread across concurrent users (closed loop, >= 2 users with finished requests).

    ``fairness_jain``: Jain's index of per-user output tok/s (tokens / time spent in
    requests); 1 = every user got the same speed, 1/n = one user got everything.
    ``ttft_user_spread_ms``: max - min over users of each user's median TTFT.
    """
    if run.arrival != "closed":
        return {}
    tokens: dict[int, float] = {}
    busy: dict[int, float] = {}
    ttfts: dict[int, list[float]] = {}
    for o in run.outcomes:
        if not o.ok:
            continue
        tokens[o.user] = tokens.get(o.user, 0.0) + o.gen.output_tokens
        busy[o.user] = busy.get(o.user, 0.0) + o.gen.e2e_s
        if o.gen.chunk_times:
            ttfts.setdefault(o.user, []).append(o.gen.chunk_times[0] * 1e3)
    rates = np.array([tokens[u] / busy[u] for u in tokens if busy[u] > 0])
    out: dict[str, float] = {}
    if rates.size >= 2 and float((rates**2).sum()) > 0:
        out["fairness_jain"] = float(rates.sum() ** 2 / (rates.size * (rates**2).sum()))
    medians = [float(np.median(v)) for v in ttfts.values()]
    if len(medians) >= 2:
        out["ttft_user_spread_ms"] = max(medians) - min(medians)
    return out


def goodput(run: LevelRun, slo) -> dict[str, float]:
    """Requests/s and output tok/s of the requests that met the per-request SLO."""
    good = [g for g in run.gens if meets_request_slo(g, slo)]
    if run.wall_s <= 0:
        return {}
    return {"goodput_rps": len(good) / run.wall_s,
            "goodput_tps": sum(g.output_tokens for g in good) / run.wall_s}
