"""The iteration ledger: IterationTimer's counts and clocks of training iterations, driven by its events in order and
read from an injected clock (a virtual one in tests)."""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Dict, List, Optional, Tuple

from lightning_perf.measure.stats.streaming import FOLD_EVERY, BlockSeries, LogHistogram
from lightning_perf.measure.timing.clock import now
from lightning_perf.measure.timing.epochs import MAX_EPOCH_RECORDS, EpochRecords
from lightning_perf.measure.timing.flops import mfu_pct, tflops_per_s
from lightning_perf.measure.timing.tail import (AFTER_VALIDATION, CHECKPOINT, EPOCH_START, GC, GC_FLAG_PAUSE_S, OWN,
                                                OWN_WORK, TAIL_FACTOR, CauseBook, SlowestIterations)


class LoggingWindow:
    """Seconds, iterations, batches, samples and items of the measured iterations since the last log, and the
    seconds of those over the tail threshold. The step path adds to the fields; :meth:`rates` reads them once."""

    __slots__ = ("seconds", "iterations", "batches", "samples", "items", "tail_s")

    def __init__(self) -> None:
        self.seconds, self.iterations, self.batches, self.samples, self.items, self.tail_s = 0.0, 0, 0, 0, 0, 0.0

    def rates(self, samples_known: bool, items_known: bool, tail_known: bool, flops_per_batch: Optional[float],
              peak_flops: Optional[float]) -> Dict[str, Optional[float]]:
        """The window's logged scalars (``perf/it_per_s``, ``perf/ms_per_iter``, ...); each of samples/s, items/s,
        the tail's share and TFLOP/s (and MFU, with the device's peak) only where it is known. The window must hold
        an iteration and time."""
        seconds = self.seconds
        metrics: Dict[str, Optional[float]] = {
            "perf/it_per_s": self.iterations / seconds,
            "perf/ms_per_iter": 1000.0 * seconds / self.iterations,
            "perf/batches_per_s": self.batches / seconds,
        }
        if samples_known:
            metrics["perf/samples_per_s"] = self.samples / seconds
        if items_known:
            metrics["perf/items_per_s"] = self.items / seconds
        if tail_known:
            metrics["perf/tail_time_pct"] = 100.0 * self.tail_s / seconds
        if flops_per_batch is not None:
            tflops = tflops_per_s(flops_per_batch, self.batches, seconds)
            metrics["perf/tflops_per_s"] = tflops
            if peak_flops is not None:
                metrics["perf/mfu_pct"] = mfu_pct(tflops, peak_flops)
        return metrics


class IterationLedger:
    """Training iterations from the loop's events, each read at ``clock()`` (seconds): the counts (iterations,
    batches, samples, items: all, and those of the measured iterations), the warm-up left out of the distribution,
    each measured iteration's ms (a list folded into the histogram and the block series every ``fold_every``), the
    evaluation time cut out of the iteration it interrupts, the logging window, the slowest iterations with what
    coincided with each, per-epoch records, and what a checkpoint keeps of it all (:meth:`to_state`, :meth:`load`).

    An iteration runs from the end of the previous one (or the training start) to :meth:`end_iteration`, which
    takes its last batch; the ones before (gradient accumulation) come through :meth:`add_batch`. What coincided with it (tail bits of ``measure.timing.tail``) is
    or-ed into ``flags`` by the events (and by :meth:`gc_flagged`, :meth:`own_work`) and taken at its end.
    ``position()``, where set, gives (global step, epoch) for a slow iteration's record; ``slow_flags()``, where set,
    more bits for a slow one (the allocator's retries on CUDA). Both are called only for slow iterations."""

    def __init__(self, warmup_steps: int = 0, keep_slowest: int = 10, clock: Callable[[], float] = now,
                 fold_every: int = FOLD_EVERY) -> None:
        self.warmup_steps = warmup_steps
        self.keep_slowest = keep_slowest
        self.clock = clock
        self.fold_every = fold_every
        self.position: Optional[Callable[[], Tuple[int, int]]] = None  # None: (the iteration's number, epoch 0)
        self.slow_flags: Optional[Callable[[], int]] = None
        # Cumulative over the whole run (kept through checkpoints).
        self.iterations = 0
        self.batches = 0
        self.samples = 0
        self.items = 0
        self.counted_batches = 0
        self.counted_samples = 0
        self.counted_items = 0
        self.prior_train_time_s = 0.0
        self.prior_eval_time_s = 0.0
        self.pending_ms: List[float] = []  # measured iterations not yet folded into host and blocks
        self.host = LogHistogram()
        self.blocks = BlockSeries()
        self.slowest = SlowestIterations(keep_slowest)
        self.causes = CauseBook()
        self.excluded: Dict[str, int] = {"warmup": 0}
        self.warmup_time_s = 0.0
        self.startup_time_s: Optional[float] = 0.0  # None: an older checkpoint's fits did not record theirs
        self.validation_runs = 0
        self.fits = 0
        self.epochs = EpochRecords()
        self.resumed_at: Optional[int] = None
        # This fit only.
        self.fit_start: Optional[float] = None
        self.fit_iterations = 0
        self.train_start: Optional[float] = None
        self.train_end: Optional[float] = None
        self.eval_time_fit = 0.0
        self.sanity_time_s = 0.0
        self.eval_start: Optional[float] = None
        self.last_mark: Optional[float] = None
        self.iter_batches = self.iter_samples = self.iter_items = 0  # the iteration in progress: added at its end
        self.window = LoggingWindow()
        self.flags = 0  # what coincided with the iteration in progress
        self.gc_pause_s = 0.0  # pauses of the flagged garbage collections in the iteration in progress
        self.own_s = 0.0  # lightning_perf's own periodic work in the iteration in progress (timing.tail.OwnWork)
        self.tail_threshold_s = math.inf  # 2x the median as of the last log window: the window's tail share

    # -- reads ---------------------------------------------------------------------------------------------------
    def fold(self) -> None:
        """The measured iterations' ms waiting in ``pending_ms`` into the histogram and the block series."""
        pending, self.pending_ms = self.pending_ms, []
        if pending:
            self.host.add_many(pending)
            self.blocks.add_many(pending)

    def histogram(self) -> LogHistogram:
        """The measured iterations' ms, every one of them folded in."""
        self.fold()
        return self.host

    def series(self) -> BlockSeries:
        """The measured iterations' ms in blocks (for the speed verdict's interval), every one folded in."""
        self.fold()
        return self.blocks

    def train_time_s(self) -> float:
        """Training wall time so far: this fit's time in the training loop minus its validation, plus earlier fits."""
        if self.train_start is None:
            return self.prior_train_time_s
        end = self.train_end if self.train_end is not None else self.clock()
        eval_running = (end - self.eval_start) if self.eval_start is not None else 0.0
        return self.prior_train_time_s + max(0.0, end - self.train_start - self.eval_time_fit - eval_running)

    def eval_time_s(self) -> float:
        return self.prior_eval_time_s + self.eval_time_fit

    # -- events --------------------------------------------------------------------------------------------------
    def fit_setup(self) -> None:
        """A fit's setup: the warm-up cost (the startup) runs from here to the training start."""
        self.fit_start = self.clock()

    def sanity_start(self) -> None:
        self.eval_start = self.clock()

    def sanity_end(self) -> None:
        if self.eval_start is not None:
            self.sanity_time_s += self.clock() - self.eval_start
        self.eval_start = None

    def start_training(self, epoch: int) -> None:
        """The training loop starts (in ``epoch``): the first iteration runs from here."""
        self.fits += 1
        self.train_start = self.last_mark = self.clock()
        if self.startup_time_s is not None and self.fit_start is not None:
            self.startup_time_s += self.train_start - self.fit_start
        self.epochs.resume(epoch, self.train_start, self.eval_time_fit, self.iterations)

    def epoch_start(self, epoch: int) -> None:
        # The round trip goes on across the epoch boundary: epoch-end hooks and a DataLoader starting its workers
        # are real training time, paid again every epoch, and belong to the first iteration of the next epoch.
        if self.epochs.begin(epoch, self.clock(), self.eval_time_fit, self.iterations):
            self.flags |= EPOCH_START

    def epoch_end(self, epoch: int) -> None:
        self.epochs.end(epoch, self.clock(), self.eval_time_fit, self.iterations)

    def add_batch(self, samples: Optional[int], items: Optional[int]) -> None:
        """A training batch ended, not the last of its iteration (gradient accumulation), with its samples and items
        where known."""
        self.batches += 1
        self.iter_batches += 1
        if samples is not None:
            self.samples += samples
            self.iter_samples += samples
        if items is not None:
            self.items += items
            self.iter_items += items

    def end_iteration(self, samples: Optional[int] = None, items: Optional[int] = None) -> None:
        """The iteration in progress ends now with a batch of ``samples`` and ``items`` (where known), its last (the
        others came through :meth:`add_batch`): counted (after the warm-up) or left out as warm-up."""
        t = self.clock()
        # the last batch added here: one call a step less than through add_batch (the step path's one call)
        self.batches += 1
        batches = self.iter_batches + 1
        it_samples, it_items = self.iter_samples, self.iter_items
        if samples is not None:
            self.samples += samples
            it_samples += samples
        if items is not None:
            self.items += items
            it_items += items
        index = self.fit_iterations  # of this iteration in the fit, 0-based
        self.iterations += 1
        self.fit_iterations += 1
        seconds = t - self.last_mark if self.last_mark is not None else 0.0
        flags = self.flags
        # what coincided with this iteration, taken at its end: what runs from here on is the next one's
        gc_pause_s, own_s = self.gc_pause_s, self.own_s
        self.flags, self.gc_pause_s, self.own_s = 0, 0.0, 0.0
        if flags & OWN and not self.own_work_named(seconds, own_s):
            flags &= ~OWN
        if index >= self.warmup_steps:
            ms = seconds * 1000.0
            # folded every fold_every: 6 µs a step less than 2 adds (benchmarks/overhead.py --per-hook IterationTimer)
            pending = self.pending_ms
            pending.append(ms)
            if len(pending) >= self.fold_every:
                start = self.clock()
                self.fold()
                OWN_WORK.add(self.clock() - start)  # the next iteration's
            slowest = self.slowest
            if self.slow_flags is not None and (ms > slowest.floor or seconds > self.tail_threshold_s):
                flags |= self.slow_flags()  # a slow iteration on CUDA: did the allocator retry?
            if ms > slowest.floor:  # the tail: one comparison with the K-th slowest so far
                step, epoch = self.position() if self.position is not None else (self.iterations, 0)
                slowest.offer(ms, step, epoch, flags, gc_pause_s * 1000.0, self.iterations)
            if flags:
                self.causes.add(ms, flags, gc_pause_s, own_s)
            window = self.window
            if seconds > self.tail_threshold_s:
                window.tail_s += seconds
            self.counted_batches += batches
            self.counted_samples += it_samples
            self.counted_items += it_items
            window.seconds += seconds
            window.iterations += 1
            window.batches += batches
            window.samples += it_samples
            window.items += it_items
        else:
            self.excluded["warmup"] += 1
            self.warmup_time_s += seconds
        self.last_mark = t
        self.iter_batches = self.iter_samples = self.iter_items = 0

    def take_window(self) -> LoggingWindow:
        """The logging window so far; a new one starts."""
        window, self.window = self.window, LoggingWindow()
        return window

    def update_tail_threshold(self) -> None:
        """After a logged window: the next window's tail is above 2x the median so far (of the folded iterations: a
        read does not fold)."""
        median = self.host.quantile(0.5)
        self.tail_threshold_s = TAIL_FACTOR * median / 1000.0 if median else math.inf

    def validation_start(self) -> None:
        self.eval_start = self.clock()

    def validation_end(self) -> float:
        """A validation ends: its time is evaluation time, cut out of the iteration it interrupted; the seconds."""
        seconds = self.clock() - self.eval_start if self.eval_start is not None else 0.0
        self.eval_time_fit += seconds
        self.validation_runs += 1
        self.eval_start = None
        # the next iteration is the first after a validation; a collection during validation is not training's
        self.flags = (self.flags & CHECKPOINT) | AFTER_VALIDATION
        self.gc_pause_s = self.own_s = 0.0
        if self.last_mark is not None:  # cut the validation out of the iteration it interrupted
            self.last_mark += seconds
        return seconds

    def checkpoint_saved(self) -> None:
        # Lightning's ModelCheckpoint runs after the other callbacks: the write falls in the next iteration
        self.flags |= CHECKPOINT

    def skip(self, seconds: float) -> None:
        """Work left out of every clock (the FLOP count), ``seconds`` long, that just ran between two iterations."""
        if self.last_mark is not None:
            self.last_mark += seconds
        if self.train_start is not None:
            self.train_start += seconds
        self.epochs.skip(seconds)
        if self.flags & GC:  # a collection during it is not the next iteration's
            self.flags &= ~GC
            self.gc_pause_s = 0.0

    def finish(self) -> bool:
        """Training ends (or failed): True the first time, when the training clock stops."""
        if self.train_start is None or self.train_end is not None:
            return False
        self.train_end = self.clock()
        return True

    def gc_flagged(self, pause_s: float) -> None:
        """From the garbage collector: a full collection, or one that paused long, ran in this iteration."""
        self.flags |= GC
        self.gc_pause_s += pause_s

    def own_work(self, seconds: float) -> None:
        """From lightning_perf's own periodic work (``OWN_WORK``): it ran in this iteration, for ``seconds``."""
        self.flags |= OWN
        self.own_s += seconds

    def own_work_named(self, seconds: float, own_s: float) -> bool:
        """Whether lightning_perf's own work (``own_s`` of this iteration's ``seconds``) is a cause: it took at least
        half the median iteration (at most ``GC_FLAG_PAUSE_S``), and the iteration is not slow without it (a stall
        beside a report stays unexplained). Before the first log window's median, that of the iterations so far (the
        unfolded ones, else the histogram's); where none is known yet, no."""
        threshold = self.tail_threshold_s
        if threshold == math.inf:
            median = statistics.median(self.pending_ms) if self.pending_ms else self.host.quantile(0.5)
            if not median:
                return False
            threshold = TAIL_FACTOR * median / 1000.0
        return own_s >= min(GC_FLAG_PAUSE_S, threshold / (2.0 * TAIL_FACTOR)) and seconds - own_s <= threshold

    # -- checkpoint ----------------------------------------------------------------------------------------------
    def to_state(self) -> Dict[str, Any]:
        """What a resume needs of the ledger (the open epoch as of now)."""
        return {
            "iterations": self.iterations,
            "batches": self.batches,
            "samples": self.samples,
            "train_time_s": self.train_time_s(),
            "eval_time_s": self.eval_time_s(),
            "counted_samples": self.counted_samples,
            "counted_batches": self.counted_batches,
            "items": self.items,
            "counted_items": self.counted_items,
            "excluded": dict(self.excluded),
            "warmup_time_s": self.warmup_time_s,
            "startup_time_s": self.startup_time_s,
            "validation_runs": self.validation_runs,
            "fits": self.fits,
            "epochs": list(self.epochs.records),
            "open_epoch": self.epochs.open_record(self.clock(), self.eval_time_fit, self.iterations),
            "histogram_ms": self.histogram().to_dict(),
            "blocks_ms": self.series().to_dict(),
            "tail": {"slowest": self.slowest.to_state(), "gc_pause_s": self.causes.gc_pause_s,
                     "own_s": self.causes.own_s,
                     "causes": {name: hist.to_dict() for name, hist in self.causes.hists.items()}},
        }

    def load(self, s: Any) -> None:
        """A checkpoint's state (what :meth:`to_state` wrote) through ``s``, a reader of it
        (``callbacks.core.state.StateReader``: its typed reads raise ``StateError`` naming the key). Everything is
        read before anything is assigned, so a state that fails halfway leaves the ledger as it was."""
        epochs = [{"epoch": e.count("epoch"), "time_s": e.number("time_s"), "iterations": e.count("iterations"),
                   "it_per_s": e.number("it_per_s", None, allow_none=True), "eval_time_s": e.number("eval_time_s")}
                  for e in s.records("epochs")[:MAX_EPOCH_RECORDS]]
        carried = s.mapping("open_epoch", allow_none=True)
        open_epoch = None if carried is None or not carried.data else {
            "epoch": carried.count("epoch"), "iterations": carried.count("iterations"),
            "time_s": carried.number("time_s"), "eval_time_s": carried.number("eval_time_s")}
        tail = s.mapping("tail")
        slowest = SlowestIterations(self.keep_slowest)
        rows = tail.data.get("slowest", [])
        if not isinstance(rows, list) or not all(isinstance(r, (list, tuple)) and len(r) in (6, 7) for r in rows):
            raise tail._bad("slowest", "a list of 7-number rows")  # the reader's StateError, naming the key
        slowest.load(rows)
        causes = CauseBook()
        causes.gc_pause_s = tail.number("gc_pause_s")
        causes.own_s = tail.number("own_s")  # 0 in a checkpoint of an older version
        cause_states = tail.mapping("causes")
        causes.hists = {name: cause_states.histogram(name) for name in cause_states.data}
        read = dict(
            iterations=s.count("iterations"), batches=s.count("batches"), samples=s.count("samples"),
            prior_train_time_s=s.number("train_time_s"), prior_eval_time_s=s.number("eval_time_s"),
            counted_samples=s.count("counted_samples"), counted_batches=s.count("counted_batches"),
            items=s.count("items"), counted_items=s.count("counted_items"),
            excluded={**self.excluded, "warmup": s.mapping("excluded").count("warmup")},
            warmup_time_s=s.number("warmup_time_s"), startup_time_s=s.number("startup_time_s", None, allow_none=True),
            validation_runs=s.count("validation_runs"), fits=s.count("fits"),
            host=s.histogram("histogram_ms", self.histogram()), blocks=s.series("blocks_ms", self.series()),
            slowest=slowest, causes=causes)
        for name, value in read.items():  # all read: nothing is assigned from a state that fails halfway
            setattr(self, name, value)
        self.epochs.records, self.epochs.carried = epochs, open_epoch
        self.resumed_at = self.iterations
