"""What a DataLoader's worker processes spend making each batch (fetch and collate), measured inside the workers.

The main process sees only its wait for a batch; whether more workers would shorten it depends on how busy the
workers are, and on whether they compute or wait (a worker that sleeps on I/O holds no core, so more of them help
even where every core is taken). Each worker times its own ``fetch`` (the dataset's items and the ``collate_fn``:
torch's ``_MapDatasetFetcher.fetch`` / ``_IterableDatasetFetcher.fetch``, private names, wrapped for the fit): its
wall seconds, the CPU seconds of the thread that fetches (``time.thread_time``: the worker's queue thread, which
pickles earlier batches meanwhile, is not in them) and, on Linux, the seconds that thread waited, ready, for a core
(``/proc/thread-self/schedstat``), and adds them and one batch to its own slot of a small shared memory block
(``mmap``, inherited by forked workers). The main process reads the totals where a figure is wanted: nothing
per step, no synchronisation, O(1) memory.

Workers started with ``spawn`` or ``forkserver`` import torch afresh, without the wrapper: no figures, and the
reason says so. In the main process (``num_workers=0``) the wrapper only calls through.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

#: Worker slots (a worker's id modulo this): more than any DataLoader's num_workers in practice.
SLOTS = 256
_FETCHERS = ("_MapDatasetFetcher", "_IterableDatasetFetcher")
#: Per worker slot: wall seconds, batches, CPU seconds, seconds waiting for a core.
_FIGURES = 4
#: Linux's scheduler figures of the calling thread: on-CPU ns, ns waiting on a run queue, time slices.
SCHEDSTAT = "/proc/thread-self/schedstat"
#: Why ``core_wait_pct`` is null where the scheduler's figures cannot be read.
NO_CORE_WAIT = (f"core_wait_pct: {SCHEDSTAT} cannot be read here (Linux only): the time the workers waited for a core"
                " is not known, and the advice reads their CPU share alone")

#: The timer the wrapped fetches of this process write to (a forked worker inherits the parent's).
_ACTIVE: Optional["WorkerTimer"] = None


#: Each thread's open schedstat file, by (process, thread): a forked worker opens its own (``/proc/thread-self`` is
#: resolved at the open), once, and reads it with one ``pread`` a time (about 1 µs).
_SCHEDSTAT_FILES: Dict[Tuple[int, int], int] = {}


def core_wait_s() -> float:
    """Seconds the calling thread has waited so far, ready to run, for a core (the second figure of Linux's
    schedstat); NaN where it cannot be read."""
    key = (os.getpid(), threading.get_ident())
    try:
        fd = _SCHEDSTAT_FILES.get(key)
        if fd is None:
            fd = _SCHEDSTAT_FILES[key] = os.open(SCHEDSTAT, os.O_RDONLY)
        return int(os.pread(fd, 128, 0).split()[1]) * 1e-9
    except (AttributeError, OSError, ValueError, IndexError):  # (no pread, no such file, another format)
        return math.nan


def _timed(original: Callable[..., Any], core_wait: bool) -> Callable[..., Any]:
    from torch.utils.data import get_worker_info

    clock, cpu = time.perf_counter, time.thread_time
    waited = core_wait_s if core_wait else (lambda: 0.0)

    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        timer = _ACTIVE
        info = get_worker_info() if timer is not None else None
        if info is None:  # the main process (num_workers=0): its fetch is the loop's wait, timed there
            return original(self, possibly_batched_index)
        start = clock()  # (the wall time holds the CPU and core-wait reads: a preemption at one is in both)
        cpu_start, wait_start = cpu(), waited()
        try:
            return original(self, possibly_batched_index)
        finally:
            cpu_s, wait_s = cpu() - cpu_start, waited() - wait_start
            timer.add(info.id, clock() - start, cpu_s, wait_s)

    fetch.__wrapped__ = original  # type: ignore[attr-defined]
    return fetch


class WorkerTimer:
    """Busy seconds, batches, CPU seconds and seconds waiting for a core per worker slot, in memory shared with forked
    workers; counted while the main process trains (``start``/``stop``: not in validation or the sanity check, whose
    workers may have the same ids)."""

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, (_FIGURES * SLOTS + 1) * 8)  # anonymous, shared: a fork writes into the parent's
        self._values = memoryview(self._memory).cast("d")  # _FIGURES per slot, then the counting flag
        self._installed: List[Any] = []  # (class, original fetch)
        self.reason: Optional[str] = None
        self.core_wait = False  # the workers read the time they wait for a core (the scheduler's figures are there)

    def install(self) -> bool:
        """Wraps torch's fetchers for the fit; False (and ``reason``) where they are not there."""
        global _ACTIVE
        try:
            from torch.utils.data._utils import fetch as fetch_module
        except Exception as err:  # noqa: BLE001 - a torch without the module: no figures, and why
            self.reason = f"torch's DataLoader fetchers could not be found ({type(err).__name__}: {err})"
            return False
        self.core_wait = not math.isnan(core_wait_s())  # (the workers run on this system: what reads here, reads there)
        for name in _FETCHERS:
            cls = getattr(fetch_module, name, None)
            original = getattr(cls, "fetch", None) if cls is not None else None
            if original is None:
                self.uninstall()
                self.reason = (f"torch.utils.data._utils.fetch.{name}.fetch is not there in this torch: the workers'"
                               " own time is not measured")
                return False
            cls.fetch = _timed(original, self.core_wait)
            self._installed.append((cls, original))
        _ACTIVE = self
        return True

    def uninstall(self) -> None:
        global _ACTIVE
        for cls, original in self._installed:
            if getattr(cls.fetch, "__wrapped__", None) is original:
                cls.fetch = original
        self._installed = []
        if _ACTIVE is self:
            _ACTIVE = None

    def add(self, worker: int, seconds: float, cpu_s: float = 0.0, core_wait: float = 0.0) -> None:
        """In a worker: one batch made in ``seconds``, of which ``cpu_s`` on a core and ``core_wait``
        waiting for a core (NaN where unread: the total is then unknown); counted only while the main process
        trains."""
        values = self._values
        if values[_FIGURES * SLOTS]:
            slot = _FIGURES * (worker % SLOTS)
            values[slot] += seconds
            values[slot + 1] += 1.0
            values[slot + 2] += cpu_s
            values[slot + 3] += core_wait

    def start(self) -> None:
        self._values[_FIGURES * SLOTS] = 1.0

    def stop(self) -> None:
        self._values[_FIGURES * SLOTS] = 0.0

    def totals(self) -> tuple:
        """(busy seconds, batches, CPU seconds, seconds waiting for a core) of all workers so far."""
        values, end = self._values, _FIGURES * SLOTS
        return (sum(values[0:end:_FIGURES]), int(sum(values[1:end:_FIGURES])), sum(values[2:end:_FIGURES]),
                sum(values[3:end:_FIGURES]))

    def close(self) -> None:
        self.uninstall()
        try:
            self._values.release()
            self._memory.close()
        except (BufferError, ValueError):  # (a view still held: the memory goes with the object)
            pass


def cpu_count() -> Optional[int]:
    """The cores this process may run on (its affinity where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


def _data_loaders(loaders: Any) -> List[Any]:
    """The DataLoaders in ``loaders`` (``trainer.train_dataloader``: one loader, or a list, tuple or dict of them,
    nested), in order."""
    from torch.utils.data import DataLoader

    if isinstance(loaders, DataLoader):
        return [loaders]
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return [found for node in loaders for found in _data_loaders(node)]
    return []


def num_workers(loaders: Any) -> Optional[int]:
    """The workers of the training DataLoaders in ``loaders`` (``trainer.train_dataloader``: one loader, or a list,
    tuple or dict of them), None where none is a DataLoader."""
    found = [int(loader.num_workers) for loader in _data_loaders(loaders)]
    return sum(found) if found else None


def uses_fork(loaders: Any) -> Optional[bool]:
    """Whether the training DataLoaders' workers start by fork (their ``multiprocessing_context``, else the default
    start method): only forked workers inherit the timer."""
    import multiprocessing

    methods = [loader.multiprocessing_context.get_start_method() if loader.multiprocessing_context is not None
               else (multiprocessing.get_start_method(allow_none=True)
                     or multiprocessing.get_context().get_start_method())
               for loader in _data_loaders(loaders)]
    return all(m == "fork" for m in methods) if methods else None


#: Workers busy at least this % of the training time are saturated: they make batches as fast as they can.
WORKERS_BUSY_PCT = 80.0
#: Saturated workers that compute less than this % of the fetch time they do not spend waiting for a core mostly wait
#: (sleep, I/O, a lock): more of them overlap their waits, even where every core is taken.
WORKERS_CPU_PCT = 50.0


def computing_pct(cpu_pct: float, core_wait_pct: Optional[float]) -> float:
    """Of the workers' fetch time not spent ready and waiting for a core, the % they computed (on a core); the rest
    they slept or waited on I/O or a lock. A core-bound worker on a crowded machine reads a small ``cpu_pct`` and a
    large ``core_wait_pct``: still all computing. Without the core wait (off Linux), ``cpu_pct`` itself."""
    free = 100.0 - (core_wait_pct or 0.0)
    return 100.0 if free <= 0.0 else min(100.0, 100.0 * cpu_pct / free)


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def _field(node: Any, key: str) -> Any:
    if node is None:
        return None
    return node.get(key) if isinstance(node, dict) else getattr(node, key, None)


def wait_advice(workers: Any) -> Optional[str]:
    """Where the training loop waits for batches: what would shorten the wait, from what the workers themselves
    spend (SectionProfiler's ``workers`` block, a dict or the typed section). None where nothing is known of them."""
    n = _number(_field(workers, "num_workers"))
    if n is None:
        return None
    if n == 0:
        return ("batches are made in the main process (`num_workers=0`), which waits for each: DataLoader workers"
                " (`num_workers`, with `persistent_workers=True`) make them meanwhile")
    busy, per_batch = _number(_field(workers, "busy_pct")), _number(_field(workers, "busy_ms_per_batch"))
    cores = _number(_field(workers, "cpu_count"))
    cpu, core_wait = _number(_field(workers, "cpu_pct")), _number(_field(workers, "core_wait_pct"))
    if busy is None or per_batch is None:
        return None
    each = f"{busy:.0f}% of the time, {per_batch:.2f} ms a batch in a worker"
    here = f"; {cores:.0f} cores here" if cores is not None else ""
    if busy >= WORKERS_BUSY_PCT and cpu is not None and computing_pct(cpu, core_wait) < WORKERS_CPU_PCT:
        queued = f", waiting for one {core_wait:.0f}%" if core_wait else ""
        rest = max(0.0, 100.0 - cpu - (core_wait or 0.0))
        return (f"the {n:.0f} workers are busy ({each}) but mostly waiting, not computing (on a core {cpu:.0f}% of"
                f" that time{queued}, the rest, {rest:.0f}%, sleep, I/O or a lock): more workers can help even with"
                f" every core busy, a waiting worker holds none (`num_workers`{here}), as can faster storage or"
                " reading ahead")
    if cpu is not None:  # (computing: on a core, or ready and waiting for one)
        each += f", computing {cpu:.0f}% of it" + (f" and waiting for a core {core_wait:.0f}%" if core_wait else "")
    if busy >= WORKERS_BUSY_PCT:
        if cores is None or n < cores:
            return f"the {n:.0f} workers are saturated ({each}): add workers (`num_workers`{here})"
        return (f"the {n:.0f} workers are saturated ({each}) and already as many as the {cores:.0f} cores: more"
                " workers cannot help; make loading and the transform cheaper (precompute, cache, or augment on the"
                " GPU)")
    return (f"the workers are busy only {each}, while the loop waits: more workers will not help; the wait is in"
            " handing batches over (large batches through shared memory, `pin_memory`) or in the main process")


def workers_block(timer: Optional[WorkerTimer], loaders: Any, batches_per_iteration: int,
                  iteration_ms: Optional[float], reason: Optional[str]) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """SectionProfiler's ``workers`` block and why a figure of it is missing: what the training DataLoader's workers
    spent making each batch (their fetch and collate, timed inside them by ``timer``), beside the main process's wait
    (``data_loading``); ``busy_pct`` at the loop's measured pace (``iteration_ms``, counted iterations): 100% or more,
    the workers are saturated and the loop cannot go faster than they make batches; ``cpu_pct``, their CPU time in
    that work (near 100: computing, near 0: waiting on sleep or I/O) and ``core_wait_pct``, their time ready but
    waiting for a core (Linux), both % of it. ``reason``: one known already."""
    workers = num_workers(loaders)
    if workers is None:
        return None, "no DataLoader in trainer.train_dataloader"
    row: Dict[str, Any] = {"num_workers": workers, "batches": None, "busy_ms_per_batch": None, "busy_pct": None,
                           "cpu_pct": None, "core_wait_pct": None, "cpu_count": cpu_count()}
    if workers == 0:
        return row, "num_workers=0: batches are made in the main process, and its wait for them is data_loading"
    if timer is None or reason is not None:
        return row, reason
    timer.stop()
    busy, batches, cpu, core_wait = timer.totals()
    if not batches:
        return row, ("no batch made by a worker was timed: workers started by spawn or forkserver do not inherit the"
                     " timer (only forked workers do)" if not uses_fork(loaders) else
                     "no batch made by a worker was timed")
    row["batches"] = batches
    row["busy_ms_per_batch"] = per_batch = 1000.0 * busy / batches
    missing = []
    if iteration_ms:
        row["busy_pct"] = 100.0 * per_batch * batches_per_iteration / (workers * iteration_ms)
    else:
        missing.append("busy_pct: no training iteration was measured (the fit stopped in its warm-up or before), so"
                       " there is no pace to weigh the workers' time against")
    if busy > 0:
        row["cpu_pct"] = 100.0 * cpu / busy
        if timer.core_wait and not math.isnan(core_wait):
            row["core_wait_pct"] = 100.0 * core_wait / busy
        else:
            missing.append(NO_CORE_WAIT)
    return row, "; ".join(missing) or None
