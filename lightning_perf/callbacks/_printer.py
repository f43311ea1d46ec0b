"""Prints SectionProfiler's periodic report tables from a thread of their own: built and handed to Lightning's
logger there, not on the training thread. Right after a step, formatting the table and one call of Python's logging
(a record, the handler's lock, a write) took ~150 µs on the training thread, every ``report_every_n_steps``; handing
the rows over takes one queue put. A table is printed a few microseconds to milliseconds after its step, in the order
of the reports; :func:`flush` waits for every table handed over so far (the end of training, an exception, teardown,
before the final table), so nothing printed after it comes before it."""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Optional

from lightning.pytorch.utilities import rank_zero_info

#: how long :func:`flush` waits for the tables still queued (a logger's stream that blocks must not hang training)
FLUSH_TIMEOUT_S = 5.0


class _Printer:
    def __init__(self) -> None:
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._start_lock = threading.Lock()

    def put(self, build: Callable[..., str], args: tuple, on_failure: Callable[[BaseException], None]) -> None:
        """``build(*args)`` is the text; ``on_failure(err)`` where building or printing it fails (on that thread)."""
        thread = self._thread
        if thread is None or not thread.is_alive():  # (the first table, or a process forked since)
            self._start()
        self._queue.put((build, args, on_failure))

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._queue = queue.SimpleQueue()  # (a forked child's copy may hold its parent's items)
                self._thread = threading.Thread(target=self._run, name="lightning_perf-report", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            build, args, on_failure = item
            try:
                rank_zero_info(build(*args))
            except Exception as err:  # noqa: BLE001 - a report never stops anything
                try:
                    on_failure(err)
                except Exception:  # noqa: BLE001
                    pass

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Waits until every table handed over so far is printed; False if ``timeout`` passed first."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return True
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)


PRINTER = _Printer()
