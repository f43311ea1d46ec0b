"""The slow tail of a run: what can coincide with an iteration (its causes, and the watches that see them), the K
slowest iterations with their causes, and the time above 2x the median by cause (the advice: ``tail_advice``).
Bounded memory; nothing here runs unless an iteration is slow or flagged."""

from __future__ import annotations

import gc
import heapq
import math
import weakref
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from lightning_perf.measure.stats.streaming import LogHistogram
from lightning_perf.measure.timing import clock

#: What can coincide with an iteration: bits of a flag word the hooks set (and the GC callback, and ``OWN_WORK``).
EPOCH_START, AFTER_VALIDATION, CHECKPOINT, GC, ALLOC_RETRY, OWN = 1, 2, 4, 8, 16, 32
#: Each cause by name, in the order one is named for an iteration that had several. An epoch start comes first: the
#: default ModelCheckpoint saves at every epoch end, so nearly every epoch start also "wrote a checkpoint", and the
#: DataLoader starting its workers again is the cost paid there in every run; the summary counts what else coincided
#: (``also``) so that an epoch-end checkpoint's share stays visible. A CUDA allocator retry (the cache freed and the
#: allocation tried again: a device sync and cudaFree calls) comes before a garbage collection, whose pause is timed.
#: lightning_perf's own periodic work comes last: what it costs is timed, and it is named only where nothing else is.
CAUSES: Tuple[Tuple[str, int], ...] = (("epoch_start", EPOCH_START), ("checkpoint", CHECKPOINT),
                                       ("after_validation", AFTER_VALIDATION), ("alloc_retry", ALLOC_RETRY),
                                       ("gc", GC), ("lightning_perf", OWN))
UNEXPLAINED = "unexplained"
#: An iteration is in the tail when it takes more than this many times the median iteration.
TAIL_FACTOR = 2.0
#: A garbage collection flags its iteration when it is a full one (generation 2) or pauses at least this long.
GC_FLAG_PAUSE_S = 0.001


def cause_names(flags: int) -> List[str]:
    return [name for name, bit in CAUSES if flags & bit]


def primary_cause(flags: int) -> str:
    for name, bit in CAUSES:
        if flags & bit:
            return name
    return UNEXPLAINED


class GcWatch:
    """Times Python's garbage collections through ``gc.callbacks``. ``on_flag(pause_s)`` is called for a full
    collection or one that paused at least ``GC_FLAG_PAUSE_S``; the young collections that run all the time cost two
    short calls each and are only counted."""

    def __init__(self, on_flag: Callable[[float], None]) -> None:
        self.on_flag = on_flag
        self.collections = 0
        self.full_collections = 0
        self.pause_s = 0.0
        self._start = 0.0
        self._installed = False

    def __call__(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            self._start = clock.now()
            return
        pause = clock.now() - self._start
        self.collections += 1
        self.pause_s += pause
        full = info.get("generation") == 2
        if full:
            self.full_collections += 1
        if full or pause >= GC_FLAG_PAUSE_S:
            self.on_flag(pause)

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            try:
                gc.callbacks.remove(self)
            except ValueError:
                pass
            self._installed = False


class OwnWork:
    """lightning_perf's own periodic work in training (a window report and its printed table, a fold of raw times
    into histograms, scalars handed to the loggers, a memory reading): each place times it and calls :meth:`add`,
    which tells every IterationTimer of a running fit (a ``watch``-ed sink: ``sink(seconds)``). The step path pays
    one bit test for it; an IterationTimer names its iteration for it where that work took at least half the median
    iteration (at most ``GC_FLAG_PAUSE_S``) and the iteration would not be slow without it: on a fast loop, a report
    step of its own making is otherwise a slow iteration nothing explains."""

    __slots__ = ("sinks",)

    def __init__(self) -> None:
        #: Weak references to the sinks (bound methods): this registry keeps no timer alive (a fit that never
        #: reached its teardown, where another callback's exception hook raised first; its GcWatch in
        #: ``gc.callbacks`` still holds it then), and a collected one drops out.
        self.sinks: List[Any] = []

    def add(self, seconds: float) -> None:
        for ref in self.sinks:
            sink = ref()
            if sink is not None:
                sink(seconds)

    def watch(self, sink: Callable[[float], None]) -> None:
        self.unwatch(sink)  # once, however often watched
        self.sinks.append(weakref.WeakMethod(sink))  # type: ignore[arg-type]

    def unwatch(self, sink: Callable[[float], None]) -> None:
        self.sinks = [ref for ref in self.sinks if ref() is not None and ref() != sink]


OWN_WORK = OwnWork()


class _Slowest:
    """The ``k`` largest entries offered (tuples, by their first item), in a min-heap: the caller compares each value
    with :attr:`floor` (the k-th largest so far) and offers only the larger ones."""

    def __init__(self, k: int) -> None:
        self.k = k
        self._heap: List[Tuple[Any, ...]] = []
        self.floor = -1.0 if k > 0 else math.inf

    def _keep(self, entry: Tuple[Any, ...]) -> None:
        if len(self._heap) < self.k:
            heapq.heappush(self._heap, entry)
        elif entry[0] > self._heap[0][0]:
            heapq.heapreplace(self._heap, entry)
        if len(self._heap) >= self.k:
            self.floor = self._heap[0][0]


class SlowIteration(NamedTuple):
    """One of IterationTimer's slowest iterations; ordered by ``ms``, then by ``seq`` (the order offered)."""

    ms: float
    seq: int
    step: int
    epoch: int
    flags: int  # what coincided (the cause bits)
    gc_pause_ms: float
    iteration: int  # the run's iteration number; -1 where a checkpoint of an older version did not keep it


class SlowestIterations(_Slowest):
    """IterationTimer's ``k`` slowest iterations (:class:`SlowIteration`); a checkpoint holds each as a list of its
    seven numbers, in the order of the fields."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self._seq = 0

    def offer(self, ms: float, step: int, epoch: int, flags: int, gc_pause_ms: float, iteration: int) -> None:
        self._seq += 1
        self._keep(SlowIteration(ms, self._seq, step, epoch, flags, gc_pause_ms, iteration))

    def entries(self) -> List[Dict[str, Any]]:
        return [{"step": e.step, "iteration": e.iteration if e.iteration >= 0 else None, "epoch": e.epoch, "ms": e.ms,
                 "causes": cause_names(e.flags), "gc_pause_ms": e.gc_pause_ms}
                for e in sorted(self._heap, reverse=True)]

    def to_state(self) -> List[List[float]]:
        return [list(e) for e in self._heap]

    def load(self, rows: List[List[float]]) -> None:
        for ms, _, step, epoch, flags, gc_ms, *iteration in rows:  # 6 numbers in an older checkpoint
            self.offer(float(ms), int(step), int(epoch), int(flags), float(gc_ms),
                       int(iteration[0]) if iteration else -1)


class SlowestPieces(_Slowest):
    """SectionProfiler's ``k`` slowest iterations with their time per section, in a min-heap, as IterationTimer
    counts an iteration: what was carved out after the previous step (``carried``: sections and checkpoint writes in
    batch-end hooks, nested sections with their parents, which IterationTimer's round trip puts in the next
    iteration) in, this one's (``end``) out. Offered at SectionProfiler's fold (every FOLD_EVERY iterations, off the
    step path), one comparison with :attr:`floor` per iteration."""

    def offer(self, seconds: float, iteration: int, step: Optional[int], pieces: Dict[str, float], calls: Any,
              end: Optional[Dict[str, float]] = None, carried: Optional[Dict[str, float]] = None) -> None:
        sections = dict(pieces)
        for name, call_s, _ in calls:  # a user section called several times: its iteration's sum
            sections[name] = sections.get(name, 0.0) + call_s
        for name, moved in (end or {}).items():
            sections[name] = sections.get(name, 0.0) - moved
        for name, moved in (carried or {}).items():
            sections[name] = sections.get(name, 0.0) + moved
        self._keep((seconds, iteration, step, {name: s for name, s in sections.items() if s > 0}))

    def entries(self, medians: Dict[str, float], runs: Dict[str, int], iterations: int) -> List[Dict[str, Any]]:
        """Slowest first: ``iteration``, ``step``, ``ms``, ``sections_ms`` and ``over_median``, the section that
        exceeded its median per iteration (``medians``, ms) the most: ``section``, ``ms``, ``median_ms``,
        ``excess_ms``, and in how many of the ``iterations`` it ran (``runs``)."""
        out = []
        for seconds, iteration, step, sections in sorted(self._heap, key=lambda e: -e[0]):
            sections_ms = {name: 1000.0 * s for name, s in sections.items()}
            over = None
            for name, ms in sections_ms.items():
                median = medians.get(name, 0.0)
                if over is None or ms - median > over["excess_ms"]:
                    over = {"section": name, "ms": ms, "median_ms": median, "excess_ms": ms - median,
                            "runs_in": runs.get(name), "of_iterations": iterations}
            out.append({"iteration": iteration, "step": step, "ms": 1000.0 * seconds, "sections_ms": sections_ms,
                        "over_median": over if over is not None and over["excess_ms"] > 0 else None})
        return out


def median_per_iteration(hist: LogHistogram, iterations: int, runs: Optional[int] = None) -> float:
    """A section's median time per iteration (ms) over ``iterations`` counted iterations, from its histogram of the
    times it ran (each within the histogram's accuracy) and ``runs``, the iterations it ran in (its count where each
    iteration runs it once): 0 where it ran in half of them or fewer (a checkpoint every 50 steps, a sampling every
    1,000); a section called several times an iteration, its median call times its calls per iteration it ran in."""
    count = hist.count
    runs = count if runs is None else min(runs, count)
    if iterations <= 0 or runs <= 0 or runs * 2 <= iterations:
        return 0.0
    per_run = count / runs
    if runs >= iterations:
        return (hist.quantile(0.5) or 0.0) * per_run
    return (hist.quantile((runs - iterations / 2.0) / runs) or 0.0) * per_run


class CauseBook:
    """The measured iterations that had a cause, by their first cause: a histogram of their times each (bounded:
    one bucket per 1% of time), the GC pause of those named for GC, and lightning_perf's own work in those named for
    it."""

    def __init__(self) -> None:
        self.hists: Dict[str, LogHistogram] = {}
        self.also: Dict[str, Dict[str, int]] = {}  # first cause -> the other causes of those iterations, counted
        self.gc_pause_s = 0.0
        self.own_s = 0.0

    def add(self, ms: float, flags: int, gc_pause_s: float, own_s: float = 0.0) -> None:
        name = primary_cause(flags)
        hist = self.hists.get(name)
        if hist is None:
            hist = self.hists[name] = LogHistogram()
        hist.add(ms)
        others = [other for other in cause_names(flags) if other != name]
        if others:
            also = self.also.setdefault(name, {})
            for other in others:
                also[other] = also.get(other, 0) + 1
        if name == "gc":
            self.gc_pause_s += gc_pause_s
        elif name == "lightning_perf":
            self.own_s += own_s


def above(hist: LogHistogram, threshold: float) -> Tuple[int, float]:
    """Count and sum (each value within the histogram's accuracy) of the values above ``threshold``."""
    n, total = 0, 0.0
    for key, count in hist.bins.items():
        value = hist._bucket_value(key)
        if value > threshold:
            n += count
            total += count * value
    return n, total


def tail_block(host: LogHistogram, book: CauseBook, slowest: SlowestIterations, extra: Dict[str, Any]) -> Dict[str, Any]:
    """The summary's ``tail``: share of measured time in iterations above ``TAIL_FACTOR`` x the median, that time by
    cause (each iteration under its first cause; what none explains under ``unexplained``) and the slowest iterations
    (``tail_advice.tail_insights`` words it). ``extra`` carries ``gc``, ``alloc_retries``, ``dataloader``."""
    median = host.quantile(0.5) if host.count else None
    measured_ms = host.total
    block: Dict[str, Any] = {"factor": TAIL_FACTOR, "median_ms": median, "threshold_ms": None, "iterations": 0,
                             "time_s": 0.0, "share_pct": None, "by_cause": {}, "slowest": slowest.entries(),
                             "keep_slowest": slowest.k, **extra}
    if median is None or measured_ms <= 0:
        return block
    threshold = TAIL_FACTOR * median
    n_all, ms_all = above(host, threshold)
    by_cause: Dict[str, Dict[str, Any]] = {}
    n_known, ms_known = 0, 0.0
    for name, _ in CAUSES:
        hist = book.hists.get(name)
        if hist is None:
            continue
        n, ms = above(hist, threshold)
        n_known, ms_known = n_known + n, ms_known + ms
        entry = {"iterations": n, "time_s": ms / 1000.0, "excess_s": max(0.0, ms - n * median) / 1000.0,
                 "mean_ms": ms / n if n else None, "flagged_iterations": hist.count,
                 "also": dict(book.also.get(name, {}))}
        if name == "gc":
            entry["gc_pause_s"] = book.gc_pause_s
        elif name == "lightning_perf":
            entry["own_s"] = book.own_s
        by_cause[name] = entry
    n_rest, ms_rest = max(0, n_all - n_known), max(0.0, ms_all - ms_known)
    by_cause[UNEXPLAINED] = {"iterations": n_rest, "time_s": ms_rest / 1000.0,
                             "excess_s": max(0.0, ms_rest - n_rest * median) / 1000.0,
                             "mean_ms": ms_rest / n_rest if n_rest else None}
    for entry in by_cause.values():
        entry["share_pct"] = 100.0 * entry["time_s"] * 1000.0 / measured_ms
    block.update(threshold_ms=threshold, iterations=n_all, time_s=ms_all / 1000.0,
                 share_pct=100.0 * ms_all / measured_ms, by_cause=by_cause)
    return block
