"""Prints SectionProfiler's periodic report tables from a thread of their own: built and handed to Lightning's
logger there, not on the training thread. Right after a step, formatting the table and one call of Python's logging
(a record, the handler's lock, a write) took ~150 µs on the training thread, every ``report_every_n_steps``; handing
the rows over takes one queue put. The work is not gone: it runs on this thread (process CPU counts it), beside the
training thread's GIL-free torch work where a core is free.

A table is printed a few microseconds to milliseconds after its step, in the order of the reports. ``flush`` waits
for every table handed over so far; SectionProfiler calls it at each training epoch's end, at the end of training and
on an exception, so that what it prints at the end comes after them. A logging stream that blocks stalls the
training thread's own log lines as it did before (the handler's lock), and a flush waits for it at most
``FLUSH_TIMEOUT_S``.

A fork (a DataLoader's worker processes) waits for the table being written: a child forked mid-write would inherit
the stream's lock held by a thread it does not have, and hang at its first write to that stream."""

from __future__ import annotations

import os
import queue
import threading
from typing import Any, Callable, Optional

from lightning.pytorch.utilities import rank_zero_info

#: how long ``flush`` waits for the tables still queued, and a fork for the table being written
FLUSH_TIMEOUT_S = 5.0


class _Printer:
    def __init__(self) -> None:
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._start_lock = threading.Lock()
        self._writing = threading.Lock()  # held while a table is built and written
        self._held_for_fork = False
        self._put = self._done = 0  # tables handed over and printed: one writer each (this thread, the printer's)

    def put(self, build: Callable[..., str], args: tuple, on_failure: Callable[[BaseException], None]) -> None:
        """``build(*args)`` is the text; ``on_failure(err)`` where building or printing it fails (on that thread)."""
        thread = self._thread
        if thread is None or not thread.is_alive():  # the first table (a forked child's too), or a thread lost
            self._start()
        self._put += 1
        self._queue.put((build, args, on_failure))

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():  # (what is queued waits for the new one)
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
                with self._writing:
                    rank_zero_info(build(*args))
            except Exception as err:  # noqa: BLE001 - a report never stops anything
                try:
                    on_failure(err)
                except Exception:  # noqa: BLE001
                    pass
            self._done += 1

    def pending(self) -> bool:
        """Whether a table handed over is not printed yet."""
        return self._put != self._done

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Waits until every table handed over so far is printed; False if ``timeout`` passed first (or if called on
        the printer's own thread, which cannot wait for itself)."""
        thread = self._thread
        if thread is None or not thread.is_alive() or not self.pending():
            return True
        if threading.current_thread() is thread:
            return False
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    # -- fork: the child must not inherit a stream locked mid-write ------------------------------------------------
    def _before_fork(self) -> None:
        self._held_for_fork = self._writing.acquire(timeout=FLUSH_TIMEOUT_S)

    def _after_fork_in_parent(self) -> None:
        if self._held_for_fork:
            self._held_for_fork = False
            self._writing.release()

    def _after_fork_in_child(self) -> None:
        """The child has no printer thread: it starts its own at its first table, with none of the parent's queued."""
        self._writing, self._held_for_fork = threading.Lock(), False
        self._start_lock, self._thread = threading.Lock(), None
        self._queue, self._put, self._done = queue.SimpleQueue(), 0, 0


PRINTER = _Printer()
if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(before=PRINTER._before_fork, after_in_parent=PRINTER._after_fork_in_parent,
                        after_in_child=PRINTER._after_fork_in_child)
