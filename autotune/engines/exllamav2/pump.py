"""One thread that drives exllamav2's dynamic generator and routes its results to requests.

:class:`JobPump` needs only the generator's ``enqueue(job)``, ``iterate() -> list[dict]`` and
``num_remaining_jobs() -> int`` and ``cancel(job)``
(``exllamav2/generator/dynamic.py::ExLlamaV2DynamicGenerator``),
so it runs on CPU with a fake generator in the tests. Each request gets a queue of
``(arrival time, result)``; when ``iterate()`` raises (an OOM in a batch, a CUDA error) the
exception is kept and every waiting request is woken at once and raises it, instead of
waiting ``request_timeout_s`` on an empty queue.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

_FAILED = object()


class PumpFailed(RuntimeError):
    """The generator's ``iterate()`` raised; ``cause`` is that exception."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the exllamav2 generator failed: {type(cause).__name__}: {cause}")
        self.cause = cause


class JobPump:
    """Thread-safe front of a dynamic generator: ``submit`` from any thread, one pump thread.

    Lifecycle: construct (starts the thread) -> ``submit``/``results`` -> ``close``.
    """

    def __init__(self, generator: Any, idle_s: float = 0.0005) -> None:
        self.generator = generator
        self.idle_s = idle_s
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._queues: dict[int, queue.Queue] = {}
        self._jobs: dict[int, Any] = {}
        self._next_id = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="exl2-pump", daemon=True)
        self._thread.start()

    def submit(self, make_job: Callable[[int], Any]) -> tuple[int, float, queue.Queue]:
        """Enqueue ``make_job(identifier)``; returns (identifier, submit time, result queue).

        The submit time is taken before waiting for the lock: the pump thread holds it for a
        whole ``iterate()``, and that wait is part of the request's time to first token.
        """
        t0 = time.perf_counter()
        with self._lock:
            if self.error is not None:
                raise PumpFailed(self.error)
            ident = self._next_id
            self._next_id += 1
            q: queue.Queue = queue.Queue()
            self._queues[ident] = q
            job = make_job(ident)
            self._jobs[ident] = job
            self.generator.enqueue(job)
        return ident, t0, q

    def results(self, ident: int, q: queue.Queue, timeout_s: float) -> Iterator[tuple[float, dict]]:
        """The job's results with their arrival times, up to the one with ``eos``.

        Raises PumpFailed as soon as the pump thread fails, TimeoutError after ``timeout_s``
        without a result. A job that does not finish (timeout, or the caller stops reading) is
        cancelled in the generator (``ExLlamaV2DynamicGenerator.cancel(job)``), so it does not
        keep its cache pages and its place in the batch.
        """
        finished = False
        try:
            while True:
                try:
                    item = q.get(timeout=timeout_s)
                except queue.Empty:
                    raise TimeoutError(f"no result from the exllamav2 generator for {timeout_s:g} s "
                                       "(request_timeout_s)") from None
                if item is _FAILED:
                    raise PumpFailed(self.error or RuntimeError("unknown error"))
                yield item
                if item[1].get("eos"):
                    finished = True
                    return
        finally:
            with self._lock:
                self._queues.pop(ident, None)
                job = self._jobs.pop(ident, None)
                cancel = getattr(self.generator, "cancel", None)
                if not finished and job is not None and self.error is None and cancel is not None:
                    cancel(job)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    results = self.generator.iterate() if self.generator.num_remaining_jobs() else None
                if not results:
                    time.sleep(self.idle_s)
                    continue
                now = time.perf_counter()
                for r in results:
                    q = self._queues.get(r.get("identifier"))
                    if q is not None:
                        q.put((now, r))
        except BaseException as e:  # noqa: BLE001 - handed to every waiting request
            with self._lock:
                self.error = e
                waiting = list(self._queues.values())
            for q in waiting:
                q.put(_FAILED)

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout=timeout_s)
