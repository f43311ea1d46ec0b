"""The slow tail of a run: the K slowest iterations with what coincided, the time above 2x the median by cause, and
the rules that turn it into advice. Bounded memory; nothing here runs unless an iteration is slow or flagged."""

from __future__ import annotations

import gc
import heapq
import math
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from lightning_perf.measure import clock
from lightning_perf.measure.stats import LogHistogram

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
#: A cause gets an insight when its tail time is at least this share of the measured training time...
RULE_MIN_PCT = 1.0
#: ...the tail without a known cause when at least this share; below RULE_MIN_PCT in all, the tail is called small.
UNEXPLAINED_MIN_PCT = 5.0


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


class SlowestIterations(_Slowest):
    """IterationTimer's ``k`` slowest iterations: (ms, seq, step, epoch, flags, gc ms, the run's iteration number;
    -1 where a checkpoint of an older version did not keep it)."""

    def __init__(self, k: int) -> None:
        super().__init__(k)
        self._seq = 0

    def offer(self, ms: float, step: int, epoch: int, flags: int, gc_pause_ms: float, iteration: int) -> None:
        self._seq += 1
        self._keep((ms, self._seq, step, epoch, flags, gc_pause_ms, iteration))

    def entries(self) -> List[Dict[str, Any]]:
        return [{"step": step, "iteration": iteration if iteration >= 0 else None, "epoch": epoch, "ms": ms,
                 "causes": cause_names(flags), "gc_pause_ms": gc_ms}
                for ms, _, step, epoch, flags, gc_ms, iteration in sorted(self._heap, reverse=True)]

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


#: The sections a cause's own cost lands in: where a slow iteration's grown section is elsewhere, the time is not the
#: cause's (a checkpoint write that cost 4 ms in an iteration whose sampling took 80 ms). A garbage collection, an
#: allocator retry and what validation leaves behind stall whichever section runs: any section is theirs.
OWN_SECTIONS = {"checkpoint": frozenset({"checkpointing"}),
                "epoch_start": frozenset({"data_loading", "transfer", "between_batches", "other"})}


def section_elsewhere(cause: str, entry: Any) -> Optional[Dict[str, Any]]:
    """The cause's ``section`` (a plain dict or a typed one) where it is not one the cause's own cost lands in."""
    section = entry.get("section") if isinstance(entry, dict) else getattr(entry, "section", None)
    if section is None or cause not in OWN_SECTIONS:
        return None
    if not isinstance(section, dict):
        section = section.model_dump() if hasattr(section, "model_dump") else dict(section)
    return section if section.get("name") not in OWN_SECTIONS[cause] else None


def explain_with_sections(block: Dict[str, Any], records: List[Dict[str, Any]]) -> None:
    """Joins SectionProfiler's slowest iterations (``records``) to IterationTimer's tail ``block``, by global step
    where both have it (automatic optimization: a SectionProfiler added at a resume counts its iterations from 0),
    else by iteration number: each kept slow iteration gets ``section`` (the one that exceeded its own median the
    most, or None where SectionProfiler has no record of it), each cause ``section`` (of its kept slow iterations
    with a record, the section that exceeded its median by the most time in all, or None), and the insights are
    said again with it."""
    by_step = {r["step"]: r.get("over_median") for r in records or () if r.get("step") is not None}
    by_iteration = {r.get("iteration"): r.get("over_median") for r in records or () if r.get("step") is None}
    named: Dict[str, List[Dict[str, Any]]] = {}
    for entry in block.get("slowest") or ():
        over = by_step.get(entry.get("step")) if by_step else by_iteration.get(entry.get("iteration"))
        entry["section"] = over
        if over is not None:
            named.setdefault(primary_cause(_flags_of(entry["causes"])), []).append(over)
    for cause, target in (block.get("by_cause") or {}).items():
        overs = named.get(cause)
        if not overs:
            target["section"] = None
            continue
        excess: Dict[str, float] = {}
        for o in overs:
            excess[o["section"]] = excess.get(o["section"], 0.0) + o["excess_ms"]
        top = max(excess, key=lambda n: (excess[n], n))
        same = [o for o in overs if o["section"] == top]
        target["section"] = {"name": top, "iterations": len(same), "of_kept": len(overs),
                             "mean_ms": sum(o["ms"] for o in same) / len(same), "median_ms": same[0]["median_ms"],
                             "runs_in": same[0].get("runs_in"), "of_iterations": same[0].get("of_iterations")}
    if block.get("median_ms") is not None:
        block["insights"] = tail_insights(block)


def _flags_of(names: List[str]) -> int:
    bits = dict(CAUSES)
    flags = 0
    for name in names:
        flags |= bits.get(name, 0)
    return flags


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
    cause (each iteration under its first cause; what none explains under ``unexplained``), the slowest iterations,
    and insights. ``extra`` carries ``gc``, ``alloc_retries``, ``dataloader``."""
    median = host.quantile(0.5) if host.count else None
    measured_ms = host.total
    block: Dict[str, Any] = {"factor": TAIL_FACTOR, "median_ms": median, "threshold_ms": None, "iterations": 0,
                             "time_s": 0.0, "share_pct": None, "by_cause": {}, "slowest": slowest.entries(),
                             "keep_slowest": slowest.k, **extra}
    if median is None or measured_ms <= 0:
        block["insights"] = []
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
    block["insights"] = tail_insights(block)
    return block


def counted(n: int, word: str) -> str:
    """``n`` and ``word``, plural but for one: "1 iteration", "3 iterations"."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _grown(section: Dict[str, Any]) -> str:
    """SectionProfiler's section of a cause's slowest iterations, in words."""
    runs, of = section.get("runs_in"), section.get("of_iterations")
    rare = runs is not None and of and runs * 2 <= of  # its median per iteration is 0: say how often it runs
    usual = f"it runs in {runs} of {of} iterations" if rare else f"its median {section['median_ms']:.1f} ms"
    return (f"{section['name']} took {section['mean_ms']:.0f} ms in {section['iterations']} of the"
            f" {section['of_kept']} slowest with sections ({usual})")


def _each(entry: Dict[str, Any], median: float) -> str:
    text = f"{entry['mean_ms']:.0f} ms each, the median iteration {median:.0f} ms"
    section = entry.get("section")
    if section:  # from SectionProfiler, over the kept slowest iterations of this cause
        text += "; " + _grown(section)
    return text


def _not_the_cause(e: Dict[str, Any], what: str, median: float) -> str:
    """A cause whose slow iterations grew in a section that is not its own: what they are, and where the time is."""
    section = e["section"]
    return (f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} {what}"
            f" ({e['mean_ms']:.0f} ms each, the median iteration {median:.0f} ms), but that is not where their time"
            f" went: {_grown(section)}. Look at {section['name']} first.")


def tail_insights(block: Dict[str, Any]) -> List[str]:
    """One sentence per rule that fires on the tail block (see docs/iteration_timer.md#the-tail)."""
    out: List[str] = []
    by, median = block.get("by_cause") or {}, block.get("median_ms")
    if median is None:
        return out

    def fires(name: str, minimum: float = RULE_MIN_PCT) -> Optional[Dict[str, Any]]:
        entry = by.get(name)
        return entry if entry and entry["iterations"] and entry["share_pct"] >= minimum else None

    e = fires("epoch_start")
    if e and section_elsewhere("epoch_start", e):
        out.append(_not_the_cause(e, "at epoch starts", median))
    elif e:
        per_epoch = e["excess_s"] / e["iterations"]
        loader = block.get("dataloader") or {}
        workers = loader.get("num_workers")
        with_ckpt = (e.get("also") or {}).get("checkpoint", 0)
        head = (f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} at epoch starts"
                f" ({_each(e, median)}" + (f"; {with_ckpt} of the epoch starts followed a checkpoint save" if with_ckpt
                                           else "") + ")")
        if workers and not loader.get("persistent_workers"):
            out.append(f"{head}: the DataLoader starts its {workers} workers again every epoch;"
                       f" `persistent_workers=True` would save about {per_epoch:.2f} s per epoch.")
        elif workers == 0:
            out.append(f"{head}: with `num_workers=0` the first batch of each epoch waits for the dataset's"
                       f" set-up (shuffling, opening files); about {per_epoch:.2f} s per epoch to win there.")
        else:
            out.append(f"{head}: about {per_epoch:.2f} s per epoch goes to starting the epoch (epoch-end hooks,"
                       " the DataLoader's first batch).")
    e = fires("checkpoint")
    if e and section_elsewhere("checkpoint", e):
        out.append(_not_the_cause(e, "that wrote a checkpoint", median))
    elif e:
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} that"
                   f" wrote a checkpoint ({_each(e, median)}): saving less often (`every_n_train_steps`) or"
                   f" asynchronously (`AsyncCheckpointIO`) would save up to {e['excess_s']:.1f} s.")
    e = fires("gc")
    if e:
        pause = e.get("gc_pause_s", 0.0) / max(1, e["flagged_iterations"]) * 1000.0
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} with a"
                   f" full Python garbage collection ({_each(e, median)}; the collection paused {pause:.0f} ms on"
                   " average): fewer reference cycles, or `gc.freeze()` after the model and data are set up, would"
                   " save up to"
                   f" {min(e['excess_s'], e.get('gc_pause_s', e['excess_s'])):.1f} s (the pauses, at most).")
    e = fires("after_validation")
    if e:
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'first iteration')} after a"
                   f" validation ({_each(e, median)}): validating less often (`val_check_interval`) would save up to"
                   f" {e['excess_s']:.1f} s; what validation leaves behind (caches, allocator, workers) costs it.")
    e = fires(UNEXPLAINED, UNEXPLAINED_MIN_PCT)
    if e:
        worst = [s["step"] for s in block.get("slowest") or [] if not s["causes"]][:3]
        at = f" (slowest at steps {', '.join(str(s) for s in worst)})" if worst else ""
        section = e.get("section")
        where = (f"{_grown(section)}: look there first;" if section else "SectionProfiler shows which section grows;")
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'slow iteration')} (over"
                   f" {block['factor']:g}x the median) that no epoch start, validation, checkpoint, allocator retry,"
                   f" garbage collection or lightning_perf's own work explains{at}: {where} the torch profiler around"
                   " those steps shows what runs.")
    e = fires("lightning_perf")
    if e:
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} in which"
                   f" lightning_perf's own periodic work ran ({_each(e, median)}; a window report and its table, a"
                   " fold, logging): fewer reports (`report_every_n_steps`, `log_every_n_steps`) or no printed table"
                   " (`SectionProfiler(print_reports=False)`) would save up to"
                   f" {min(e['excess_s'], e.get('own_s', e['excess_s'])):.1f} s (that work's time, at most).")
    e = fires("alloc_retry")
    if e:
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} in"
                   f" which the CUDA allocator retried ({_each(e, median)}): it freed its cache and allocated again,"
                   " a stall each time; a smaller batch, or `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against"
                   f" fragmentation, would save up to {e['excess_s']:.1f} s.")
    retries = block.get("alloc_retries")
    if retries and not e:
        out.append(f"The CUDA allocator retried {retries} times in training (it freed its cache and allocated again,"
                   " a stall each time): a smaller batch, or `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`"
                   " against fragmentation, would avoid it.")
    share = block.get("share_pct")
    if share is not None and share < RULE_MIN_PCT:
        out.append(f"The tail is small: {share:.1f}% of training time is in iterations over {block['factor']:g}x the"
                   f" median ({median:.1f} ms).")
    return out


def tail_line(block: Dict[str, Any]) -> str:
    """The tail in one line, for the console at the end of fit."""
    share = block.get("share_pct")
    if share is None:
        return "  tail: no iteration measured"
    causes = ", ".join(f"{name} {entry['iterations']}" for name, entry in (block.get("by_cause") or {}).items()
                       if entry["iterations"])
    return (f"  tail: {share:.1f}% of training time in {counted(block['iterations'], 'iteration')} over"
            f" {block['factor']:g}x the median ({block['median_ms']:.2f} ms)" + (f": {causes}" if causes else ""))
