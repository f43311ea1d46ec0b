"""Prints SectionProfiler's periodic report tables from a thread of their own: built and handed to Lightning's
logger there, not on the training thread. Right after a step, formatting the table and one call of Python's logging
(a record, the handler's lock, a write) took ~150 µs on the training thread, every ``report_every_n_steps``; handing
the rows over takes one append. The work is not gone: it runs on this thread (process CPU counts it), beside the
training thread's GIL-free torch work where a core is free.

Where reports come less than ``POLL_S * IDLE_POLLS`` (10 s) apart, the training thread does not wake the printer for
each table: waking a waiting thread (a queue's put) took ~45 µs of the training thread's time right after a step on
a 2-core machine, at every report. While tables come, the printer looks for them every ``POLL_S`` (at most four
wakes a second of its own, each taking the GIL for a moment, whatever the step's length); after ``IDLE_POLLS`` looks
that found none it sleeps until the next table wakes it. A printer thread that dies (a logging handler's
``SystemExit``) is replaced at the next table or flush. So a table is printed up to
``POLL_S`` after its step, in the order of the reports. ``flush`` wakes the printer and waits for every table handed
over so far; SectionProfiler calls it at each training epoch's end, at the end of training and on an exception, so
that what it prints at the end comes after them. A logging stream that blocks stalls the training thread's own log
lines as it did before (the handler's lock), and a flush waits for it at most ``FLUSH_TIMEOUT_S``.

A fork (a DataLoader's worker processes) waits for the table being written: a child forked mid-write would inherit
the stream's lock held by a thread it does not have, and hang at its first write to that stream."""

from __future__ import annotations

import collections
import os
import queue
import threading
from typing import Any, Callable, Deque, Optional

from lightning.pytorch.utilities import rank_zero_info

#: how long ``flush`` waits for the tables still queued, and a fork for the table being written
FLUSH_TIMEOUT_S = 5.0
#: while tables come, how often the printer looks for them (seconds)
POLL_S = 0.25
#: looks that found no table before the printer sleeps until a table wakes it (10 s at POLL_S)
IDLE_POLLS = 40


class _Printer:
    def __init__(self) -> None:
        self._tables: Deque[Any] = collections.deque()  # handed over, not printed yet (appended without a wake)
        self._queue: "queue.SimpleQueue[Any]" = queue.SimpleQueue()  # wakes the printer: a flush's event, or None
        self._thread: Optional[threading.Thread] = None
        self._start_lock = threading.Lock()
        self._writing = threading.Lock()  # held while a table is built and written
        self._held_for_fork = False
        self._sleeping = False  # the printer waits to be woken (no table for IDLE_POLLS looks)
        self._running = False  # the printer's thread runs (set by that thread: Thread.is_alive took ~7 µs right
        # after a step, so ``put`` reads this flag and only ``_start`` asks the thread)
        self._put = self._done = 0  # tables handed over and printed: one writer each (this thread, the printer's)

    def put(self, build: Callable[..., str], args: tuple, on_failure: Callable[[BaseException], None]) -> None:
        """``build(*args)`` is the text; ``on_failure(err)`` where building or printing it fails (on that thread)."""
        if not self._running:  # the first table (a forked child's too), or a thread lost
            self._start()
        self._put += 1
        self._tables.append((build, args, on_failure))
        if self._sleeping:  # (read after the append: the printer sets it before its last look, see ``_serve``)
            self._queue.put(None)

    def _start(self) -> None:
        """A printer thread, where none is alive (what is queued waits for the new one). A thread that fails to
        start is not alive: the next table tries again (the caller records the error); one whose start is
        interrupted after it runs sets ``_running`` itself."""
        with self._start_lock:
            if self._thread is None or not self._thread.is_alive():
                self._sleeping = False
                self._thread = threading.Thread(target=self._run, name="lightning_perf-report", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        self._running = True
        try:
            self._serve()
        finally:  # (a BaseException out of a logging handler, say: the next table or flush starts another)
            self._running = False

    def _serve(self) -> None:
        idle = 0
        while True:
            if self._tables:
                idle = 0
                self._print_tables()
            if idle < IDLE_POLLS:
                try:
                    item = self._queue.get(timeout=POLL_S)
                except queue.Empty:
                    idle += 1
                    continue
            else:
                self._sleeping = True  # before the last look: a table appended after it sees the flag and wakes us
                if self._tables:
                    self._sleeping = False
                    continue
                item = self._queue.get()
                self._sleeping, idle = False, 0
            if isinstance(item, threading.Event):  # a flush: the tables handed over before it are printed first
                self._print_tables()
                item.set()

    def _print_tables(self) -> None:
        tables = self._tables
        while tables:
            build, args, on_failure = tables.popleft()
            try:
                with self._writing:
                    rank_zero_info(build(*args))
            except Exception as err:  # noqa: BLE001 - a report never stops anything
                try:
                    on_failure(err)
                except Exception:  # noqa: BLE001
                    pass
            finally:  # (counted whatever happened to it: ``pending`` never waits for a table no thread holds)
                self._done += 1

    def pending(self) -> bool:
        """Whether a table handed over is not printed yet."""
        return self._put != self._done

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> bool:
        """Waits until every table handed over so far is printed; False if ``timeout`` passed first (or if called on
        the printer's own thread, which cannot wait for itself)."""
        if not self.pending():
            return True
        thread = self._thread
        if threading.current_thread() is thread:
            return False
        if thread is None or not thread.is_alive():  # tables queued and no printer (it died): a new one prints them
            try:
                self._start()
            except Exception:  # noqa: BLE001 - no thread to be had: the tables wait, the caller goes on
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
        self._start_lock, self._thread, self._sleeping, self._running = threading.Lock(), None, False, False
        self._queue, self._tables, self._put, self._done = queue.SimpleQueue(), collections.deque(), 0, 0


PRINTER = _Printer()
if hasattr(os, "register_at_fork"):  # (POSIX)
    os.register_at_fork(before=PRINTER._before_fork, after_in_parent=PRINTER._after_fork_in_parent,
                        after_in_child=PRINTER._after_fork_in_child)
