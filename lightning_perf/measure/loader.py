"""What a DataLoader's worker processes spend making each batch (fetch and collate), measured inside the workers.

The main process sees only its wait for a batch; whether more workers would shorten it depends on how busy the
workers are. Each worker times its own ``fetch`` (the dataset's items and the ``collate_fn``: torch's
``_MapDatasetFetcher.fetch`` / ``_IterableDatasetFetcher.fetch``, private names, wrapped for the fit) and adds the
seconds and one batch to its own slot of a small shared memory block (``mmap``, inherited by forked workers). The
main process reads the totals where a figure is wanted: nothing per step, no synchronisation, O(1) memory.

Workers started with ``spawn`` or ``forkserver`` import torch afresh, without the wrapper: no figures, and the
reason says so. In the main process (``num_workers=0``) the wrapper only calls through.
"""

from __future__ import annotations

import mmap
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

#: Worker slots (a worker's id modulo this): more than any DataLoader's num_workers in practice.
SLOTS = 256
_FETCHERS = ("_MapDatasetFetcher", "_IterableDatasetFetcher")

#: The timer the wrapped fetches of this process write to (a forked worker inherits the parent's).
_ACTIVE: Optional["WorkerTimer"] = None


def _timed(original: Callable[..., Any]) -> Callable[..., Any]:
    from torch.utils.data import get_worker_info

    clock = time.perf_counter

    def fetch(self: Any, possibly_batched_index: Any) -> Any:
        timer = _ACTIVE
        info = get_worker_info() if timer is not None else None
        if info is None:  # the main process (num_workers=0): its fetch is the loop's wait, timed there
            return original(self, possibly_batched_index)
        start = clock()
        try:
            return original(self, possibly_batched_index)
        finally:
            timer.add(info.id, clock() - start)

    fetch.__wrapped__ = original  # type: ignore[attr-defined]
    return fetch


class WorkerTimer:
    """Busy seconds and batches per worker slot, in memory shared with forked workers; counted while the main process
    trains (``start``/``stop``: not in validation or the sanity check, whose workers may have the same ids)."""

    def __init__(self) -> None:
        self._memory = mmap.mmap(-1, (2 * SLOTS + 1) * 8)  # anonymous and shared: a fork writes into the parent's
        self._values = memoryview(self._memory).cast("d")  # [busy s, batches] per slot, then the counting flag
        self._installed: List[Any] = []  # (class, original fetch)
        self.reason: Optional[str] = None

    def install(self) -> bool:
        """Wraps torch's fetchers for the fit; False (and ``reason``) where they are not there."""
        global _ACTIVE
        try:
            from torch.utils.data._utils import fetch as fetch_module
        except Exception as err:  # noqa: BLE001 - a torch without the module: no figures, and why
            self.reason = f"torch's DataLoader fetchers could not be found ({type(err).__name__}: {err})"
            return False
        for name in _FETCHERS:
            cls = getattr(fetch_module, name, None)
            original = getattr(cls, "fetch", None) if cls is not None else None
            if original is None:
                self.uninstall()
                self.reason = (f"torch.utils.data._utils.fetch.{name}.fetch is not there in this torch: the workers'"
                               " own time is not measured")
                return False
            cls.fetch = _timed(original)
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

    def add(self, worker: int, seconds: float) -> None:
        """In a worker: one batch made in ``seconds`` (counted only while the main process trains)."""
        values = self._values
        if values[2 * SLOTS]:
            slot = 2 * (worker % SLOTS)
            values[slot] += seconds
            values[slot + 1] += 1.0

    def start(self) -> None:
        self._values[2 * SLOTS] = 1.0

    def stop(self) -> None:
        self._values[2 * SLOTS] = 0.0

    def totals(self) -> tuple:
        """(busy seconds, batches) of all workers so far."""
        values = self._values
        return sum(values[0:2 * SLOTS:2]), int(sum(values[1:2 * SLOTS:2]))

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
    if busy is None or per_batch is None:
        return None
    each = f"{busy:.0f}% of the time, {per_batch:.2f} ms a batch in a worker"
    if busy >= WORKERS_BUSY_PCT:
        if cores is None or n < cores:
            return (f"the {n:.0f} workers are saturated ({each}): add workers (`num_workers`"
                    + (f"; {cores:.0f} cores here" if cores is not None else "") + ")")
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
    the workers are saturated and the loop cannot go faster than they make batches. ``reason``: one known already."""
    workers = num_workers(loaders)
    if workers is None:
        return None, "no DataLoader in trainer.train_dataloader"
    row: Dict[str, Any] = {"num_workers": workers, "batches": None, "busy_ms_per_batch": None, "busy_pct": None,
                           "cpu_count": cpu_count()}
    if workers == 0:
        return row, "num_workers=0: batches are made in the main process, and its wait for them is data_loading"
    if timer is None or reason is not None:
        return row, reason
    timer.stop()
    busy, batches = timer.totals()
    if not batches:
        return row, ("no batch made by a worker was timed: workers started by spawn or forkserver do not inherit the"
                     " timer (only forked workers do)" if not uses_fork(loaders) else
                     "no batch made by a worker was timed")
    row["batches"] = batches
    row["busy_ms_per_batch"] = per_batch = 1000.0 * busy / batches
    if iteration_ms:
        row["busy_pct"] = 100.0 * per_batch * batches_per_iteration / (workers * iteration_ms)
    return row, None
