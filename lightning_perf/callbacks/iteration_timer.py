"""IterationTimer: ms/iter, it/s, percentiles and time to N iterations, without stalling the device."""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Dict, List, Optional, Union

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lightning_perf.callbacks._arguments import bad_argument, check_bool, check_number, check_positive_int
from lightning_perf.callbacks._base import PerfCallback, guarded, reads_state
from lightning_perf.callbacks._rank_gather import Rows, gather_floats_then, spread_across_ranks
from lightning_perf.callbacks._scalars import WAITING, log_scalars
from lightning_perf.callbacks._state import StateError, StateReader
from lightning_perf.callbacks._summary_book import error_message
from lightning_perf.measure.batch_size import batch_size_path, follow
from lightning_perf.measure.clock import POLL_EVERY, DeviceIntervalClock, device_timed, next_device_timed, now
from lightning_perf.measure.flops import count_step_flops, mfu_pct, peak_flops, tflops_per_s
from lightning_perf.measure.epochs import MAX_EPOCH_RECORDS, EpochRecords
from lightning_perf.measure.stats import FOLD_EVERY, BlockSeries, LogHistogram
from lightning_perf.measure.tail import (AFTER_VALIDATION, ALLOC_RETRY, CHECKPOINT, EPOCH_START, GC, GC_FLAG_PAUSE_S,
                                         OWN, OWN_WORK, TAIL_FACTOR, CauseBook, GcWatch, SlowestIterations, tail_block)
from lightning_perf.measure.tail_advice import tail_insights, tail_line
from lightning_perf.summary.projection import project_time

class _Window:
    """The figures of the logging window since the last scalars: seconds, iterations, batches, samples, items, and
    the seconds of its tail iterations."""

    __slots__ = ("seconds", "iterations", "batches", "samples", "items", "tail_s")

    def __init__(self) -> None:
        self.seconds, self.iterations, self.batches, self.samples, self.items, self.tail_s = 0.0, 0, 0, 0, 0, 0.0


class IterationTimer(PerfCallback):
    r"""Times every training iteration (one optimizer step) and reports how fast training really runs.

    An iteration's time is the round trip from the end of one optimizer step to the end of the next: waiting for
    data, the forward and backward passes, callbacks, checkpoint saves and epoch boundaries (a DataLoader starting
    its workers) are inside it; validation and sanity checking are not (they are eval time, reported on their own,
    and cut out of the iteration they interrupt). So the measured iterations add up to the training wall time, and
    the headline (mean ms/iter, it/s = 1000 / mean) predicts it. With ``accumulate_grad_batches=k`` an iteration is
    k batches; under manual optimization it is one batch. The first ``warmup_steps`` iterations of each fit are left
    out of the distribution; their extra cost goes into the time to N. On CUDA the device's own time of the
    iterations timed on the device (``device_timing_every_n_iterations``) is read from CUDA events once they are
    complete, so nothing in the step path waits for the GPU.

    Args:
        warmup_steps: iterations at the start of each fit left out of the distribution.
        log_every_n_steps: how often the windowed rates go to the loggers; default the trainer's
            ``log_every_n_steps``.
        target_steps: N of "time to N iterations"; default the trainer's ``max_steps`` when set (under manual
            optimization converted from optimizer steps to batches at the run's observed ratio), else none.
        batch_size_fn: ``batch -> int`` for samples/s; by default the leading dimension of a tensor batch, or of
            the first tensor in nested tuples, lists and dicts.
        device_timing: also time iterations with CUDA events when training on CUDA.
        verbose: print a one-line result at the end of fit on rank 0.
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.
        flops_per_batch: FLOPs of one training batch (forward and backward) for TFLOP/s and MFU; ``"auto"`` counts
            them once after the warm-up with Lightning's ``measure_flops`` on a copy of the model.
        available_flops: the device's peak FLOP/s for MFU; default Lightning's ``get_available_flops`` for the
            device and the precision's dtype (unknown on CPU: MFU is then null with the reason).
        items_fn: ``batch -> int``, the items of a batch (tokens, pixels) for items/s, like ThroughputMonitor's
            ``length_fn``.
        keep_slowest: the K slowest measured iterations kept, with what coincided with each (the summary's ``tail``).
        device_timing_every_n_iterations: on CUDA, time on the device the first n iterations after the warm-up (so a
            short run still has device times), then one iteration of every n: ``device_ms_per_iter`` is the
            distribution over those. Each timed iteration costs a CUDA event record at each of its two ends (one
            shared between two consecutive timed ones; ~3 to 10 µs of host time each); 1 times every iteration. The
            iterations timed are SectionProfiler's with the same warm-up and n.

    Logged metrics (every ``log_every_n_steps``, over the iterations since the last log):
        ``perf/it_per_s``, ``perf/ms_per_iter``, ``perf/batches_per_s``, ``perf/samples_per_s`` (when the batch size
        is known), ``perf/items_per_s`` (with ``items_fn``), ``perf/tflops_per_s`` and ``perf/mfu_pct`` (where
        known), ``perf/tail_time_pct`` (share of the window's time over 2x the median so far). At the end of fit:
        ``perf/final_ms_per_iter_p50``, ``perf/final_ms_per_iter_p95``,
        ``perf/final_ms_per_iter_p99``, ``perf/final_it_per_s``, ``perf/train_time_s``, ``perf/eval_time_s``,
        ``perf/final_tflops_per_s`` and ``perf/final_mfu_pct`` (where known).

    Raises:
        ValueError: for a negative ``warmup_steps``, a ``log_every_n_steps`` or ``target_steps`` below 1, a
            ``batch_size_fn`` or ``items_fn`` that is not callable, a ``flops_per_batch`` that is neither ``"auto"``
            nor a number > 0, an ``available_flops`` that is not a number > 0, a negative ``keep_slowest``, or a
            ``device_timing_every_n_iterations`` that is not an int >= 1.

    Example::

        from lightning.pytorch import Trainer
        from lightning_perf import IterationTimer

        trainer = Trainer(callbacks=[IterationTimer(warmup_steps=10, target_steps=30_000)])
    """

    section_name = "iteration_timer"

    def __init__(
        self,
        warmup_steps: int = 5,
        log_every_n_steps: Optional[int] = None,
        target_steps: Optional[int] = None,
        batch_size_fn: Optional[Callable[[Any], int]] = None,
        device_timing: bool = True,
        verbose: bool = True,
        summary_path: Optional[str] = None,
        run_name: Optional[str] = None,
        run_notes: Optional[str] = None,
        flops_per_batch: Optional[Union[float, str]] = None,
        available_flops: Optional[float] = None,
        items_fn: Optional[Callable[[Any], int]] = None,
        keep_slowest: int = 10,
        device_timing_every_n_iterations: int = 32,
    ) -> None:
        super().__init__(summary_path=summary_path, run_name=run_name, run_notes=run_notes)
        check_positive_int("IterationTimer", "warmup_steps", warmup_steps, minimum=0)
        check_positive_int("IterationTimer", "log_every_n_steps", log_every_n_steps, allow_none=True)
        check_positive_int("IterationTimer", "target_steps", target_steps, allow_none=True)
        if batch_size_fn is not None and not callable(batch_size_fn):
            raise bad_argument("IterationTimer", "batch_size_fn", batch_size_fn, "Expected a callable `batch -> int`.")
        self.warmup_steps = warmup_steps
        self.log_every_n_steps = log_every_n_steps
        self.target_steps = target_steps
        self.batch_size_fn = batch_size_fn
        if flops_per_batch != "auto":
            check_number("IterationTimer", "flops_per_batch", flops_per_batch, above=0, allow_none=True,
                         what="'auto' or a number of FLOPs")
        self.flops_per_batch = flops_per_batch
        check_number("IterationTimer", "available_flops", available_flops, above=0, allow_none=True,
                     what="the device's peak FLOP/s, a number")
        self.available_flops = available_flops
        if items_fn is not None and not callable(items_fn):
            raise bad_argument("IterationTimer", "items_fn", items_fn, "Expected a callable `batch -> int`.")
        self.items_fn = items_fn
        check_positive_int("IterationTimer", "keep_slowest", keep_slowest, minimum=0)
        self.keep_slowest = keep_slowest
        self.device_timing = check_bool("IterationTimer", "device_timing", device_timing)
        check_positive_int("IterationTimer", "device_timing_every_n_iterations", device_timing_every_n_iterations)
        self.device_timing_every_n_iterations = device_timing_every_n_iterations
        self.verbose = check_bool("IterationTimer", "verbose", verbose)
        self._reset()

    # -- state ---------------------------------------------------------------------------------------------------
    # The step path appends each counted iteration's ms to a list; it goes into the histogram and the block series
    # every FOLD_EVERY iterations and before any read (``_histogram``, ``_series``), so memory stays bounded.
    def _fold(self) -> None:
        pending, self._pending_ms = self._pending_ms, []
        if pending:
            self._host.add_many(pending)
            self._blocks.add_many(pending)

    def _histogram(self) -> LogHistogram:
        """The counted iterations' ms, every one of them folded in."""
        self._fold()
        return self._host

    def _series(self) -> BlockSeries:
        """The counted iterations' ms in blocks (for the speed verdict's interval), every one folded in."""
        self._fold()
        return self._blocks

    def _reset(self) -> None:
        # Cumulative over the whole run (kept through checkpoints).
        self.iterations = 0
        self.batches = 0
        self.samples = 0
        self._prior_train_time_s = 0.0
        self._prior_eval_time_s = 0.0
        self._pending_ms: List[float] = []  # counted iterations not yet folded into _host and _blocks
        self._host = LogHistogram()
        self._device = LogHistogram()
        self._blocks = BlockSeries()
        self._counted_samples = 0
        self._counted_batches = 0
        self.items = 0
        self._counted_items = 0
        self._items_unknown: Optional[str] = None
        numeric = self.flops_per_batch is not None and self.flops_per_batch != "auto"
        self._flops: Optional[float] = float(self.flops_per_batch) if numeric else None
        self._flops_source: Optional[str] = "argument" if numeric else None
        self._flops_reason: Optional[str] = None  # why "auto" counted nothing
        self._flops_counted_at: Optional[int] = None  # the iteration after which "auto" counted
        self._flops_count_time_s = 0.0
        old_watch = getattr(self, "_gc", None)
        if old_watch is not None:
            old_watch.uninstall()
        self._slowest = SlowestIterations(self.keep_slowest)
        self._slow_floor = self._slowest.floor
        self._causes = CauseBook()
        self._gc = GcWatch(self._gc_flagged)
        self._excluded: Dict[str, int] = {"warmup": 0}
        self._warmup_time_s = 0.0
        self._startup_time_s: Optional[float] = 0.0  # None: an older checkpoint's fits did not record theirs
        self._validation_runs = 0
        self._fits = 0
        self._epochs = EpochRecords()
        self._resumed_at: Optional[int] = None
        self._samples_unknown: Optional[str] = None
        self._size_path: Optional[tuple] = None
        self._ranks: Optional[Dict[str, Any]] = None
        # This fit only.
        self._fit_start: Optional[float] = None
        self._fit_iterations = 0
        self._train_start: Optional[float] = None
        self._train_end: Optional[float] = None
        self._eval_time_fit = 0.0
        self._sanity_time_s = 0.0
        self._eval_start: Optional[float] = None
        self._last_mark: Optional[float] = None
        self._last_global_step = 0
        self._stepped = False
        self._first_global_step = 0
        self._target: Optional[int] = self.target_steps
        self._target_from_max_steps = False
        self._manual = False
        self._iter_samples = 0
        self._iter_batches = 0
        self._iter_items = 0
        self._flops_due = -1  # the fit iteration after which "auto" counts the FLOPs of a batch (-1: none)
        self._peak_flops: Optional[float] = None  # the device's peak FLOP/s at the run's precision
        self._peak_source: Optional[str] = None
        self._peak_reason: Optional[str] = "training has not started"
        self._dtype_name: Optional[str] = None
        self._window = _Window()
        self._flags = 0  # what coincided with the iteration in progress (measure.tail's bits), set by the hooks
        self._gc_pause_s = 0.0  # pauses of the flagged garbage collections in the iteration in progress
        self._own_s = 0.0  # lightning_perf's own periodic work in the iteration in progress (measure.tail.OwnWork)
        self._tail_threshold_s = math.inf  # 2x the median as of the last log window: the window's tail share
        self._loader_info: Optional[Dict[str, Any]] = None
        self._alloc_retries_start: Optional[int] = None
        self._alloc_retries: Optional[int] = None
        self._retries_seen: Optional[int] = None  # the allocator's retries at the last read (CUDA only)
        self._clock: Optional[DeviceIntervalClock] = None
        self._next_device_mark = 0  # the fit iteration whose end records the next CUDA event (``_device_mark``)
        self._log_every = 50

    def _train_time_s(self) -> float:
        """Training wall time so far: this fit's time in the training loop minus its validation, plus earlier fits."""
        if self._train_start is None:
            return self._prior_train_time_s
        end = self._train_end if self._train_end is not None else now()
        eval_running = (end - self._eval_start) if self._eval_start is not None else 0.0
        return self._prior_train_time_s + max(0.0, end - self._train_start - self._eval_time_fit - eval_running)

    def _eval_time_s(self) -> float:
        return self._prior_eval_time_s + self._eval_time_fit

    # -- Lightning hooks -----------------------------------------------------------------------------------------
    @guarded
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._carry_or_reset(trainer, self._reset)
        self._fit_start = now()  # the warm-up cost runs from here (after the data module's setup) to training
        self._gc.install()  # removed at teardown and on an exception
        OWN_WORK.watch(self._own_work)  # likewise
        self._start_run(trainer)
        self._log_every = self.log_every_n_steps or max(1, int(getattr(trainer, "log_every_n_steps", 50) or 50))
        # Known before anything runs, so a fit that fails in its sanity check still names its target.
        if self.target_steps is None and trainer.max_steps is not None and trainer.max_steps > 0:
            self._target, self._target_from_max_steps = trainer.max_steps, True

    @guarded
    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start = now()

    @guarded
    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._eval_start is not None:
            self._sanity_time_s += now() - self._eval_start
        self._eval_start = None

    @guarded
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._manual = not pl_module.automatic_optimization
        self._last_global_step = self._first_global_step = trainer.global_step
        on_cuda = trainer.strategy.root_device.type == "cuda"
        self._clock = DeviceIntervalClock() if (self.device_timing and on_cuda) else None
        self._next_device_mark = self._next_device_mark_after(self._fit_iterations)
        self._start_flops(trainer)
        self._alloc_retries_start = self._retries_seen = self._read_alloc_retries(trainer)
        loader = getattr(trainer, "train_dataloader", None)
        workers = getattr(loader, "num_workers", None)
        self._loader_info = None if not isinstance(workers, int) else {
            "num_workers": workers, "persistent_workers": bool(getattr(loader, "persistent_workers", False))}
        self._fits += 1
        self._train_start = self._last_mark = now()
        if self._startup_time_s is not None and self._fit_start is not None:
            self._startup_time_s += self._train_start - self._fit_start
        self._epochs.resume(trainer.current_epoch, self._train_start, self._eval_time_fit, self.iterations)

    def _gc_flagged(self, pause_s: float) -> None:
        """From the garbage collector: a full collection, or one that paused long, ran in this iteration."""
        self._flags |= GC
        self._gc_pause_s += pause_s

    def _own_work_named(self, seconds: float, own_s: float) -> bool:
        """Whether lightning_perf's own work (``own_s`` of this iteration's ``seconds``) is a cause: it took at least
        half the median iteration (at most ``GC_FLAG_PAUSE_S``), and the iteration is not slow without it (a stall
        beside a report stays unexplained). Before the first log window's median, that of the iterations so far (the
        unfolded ones, else the histogram's); where none is known yet, no."""
        threshold = self._tail_threshold_s
        if threshold == math.inf:
            median = (statistics.median(self._pending_ms) if self._pending_ms
                      else self._host.quantile(0.5))
            if not median:
                return False
            threshold = TAIL_FACTOR * median / 1000.0
        return own_s >= min(GC_FLAG_PAUSE_S, threshold / (2.0 * TAIL_FACTOR)) and seconds - own_s <= threshold

    def _own_work(self, seconds: float) -> None:
        """From lightning_perf's own periodic work (``OWN_WORK``): it ran in this iteration, for ``seconds``."""
        self._flags |= OWN
        self._own_s += seconds

    @guarded
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: Dict[str, Any]) -> None:
        # Lightning's ModelCheckpoint runs after the other callbacks: the write falls in the next iteration
        self._flags |= CHECKPOINT

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._gc.uninstall()
        OWN_WORK.unwatch(self._own_work)
        super().teardown(trainer, pl_module, stage)

    def _read_alloc_retries(self, trainer: Trainer) -> Optional[int]:
        """The CUDA caching allocator's retries so far (host-side statistics, no sync; phase ends, log windows and
        slow iterations only). From the nested statistics: ``memory_stats`` flattens them in Python first."""
        device = trainer.strategy.root_device
        if device.type != "cuda":
            return None
        try:
            return int(torch.cuda.memory_stats_as_nested_dict(device).get("num_alloc_retries", 0))
        except Exception:  # noqa: BLE001
            return None

    def _retried(self, trainer: Trainer) -> int:
        """ALLOC_RETRY when the allocator's retries grew since the last read (the last slow iteration, log window,
        validation or train start): read at slow iterations only, so retries in a fast one go to the next slow one
        of the same window at most."""
        retries = self._read_alloc_retries(trainer)
        if retries is None:
            return 0
        grew, self._retries_seen = retries > (self._retries_seen or 0), retries
        return ALLOC_RETRY if grew else 0

    @guarded
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # The round trip goes on across the epoch boundary: epoch-end hooks and a DataLoader starting its workers
        # are real training time, paid again every epoch, and belong to the first iteration of the next epoch.
        if self._fit_iterations == 0:
            self._restart_device_chain()
        if self._epochs.begin(trainer.current_epoch, now(), self._eval_time_fit, self.iterations):
            self._flags |= EPOCH_START

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        # automatic optimization calls this once per optimizer step: the batch that ends here ends an iteration (a
        # flag, where reading trainer.global_step at every batch end costs a chain of five properties). One
        # assignment, nothing to guard (a step hook: see `guarded`)
        self._stepped = True

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        try:
            self.batches += 1
            self._iter_batches += 1
            if self._samples_unknown is None:
                size = self._batch_size(batch)
                if size is not None:
                    self.samples += size
                    self._iter_samples += size
            if self.items_fn is not None and self._items_unknown is None:
                items = self._items(batch)
                if items is not None:
                    self.items += items
                    self._iter_items += items
            if not self._manual:
                if not self._stepped:
                    return  # still accumulating: the iteration ends with the optimizer step
                self._stepped = False
            else:  # an iteration is a batch; the optimizer steps taken convert a target from max_steps
                self._last_global_step = trainer.global_step
            self._end_iteration(trainer)
            if WAITING.count:
                self._drain_scalars(trainer)
            if self._fit_iterations == self._flops_due:
                self._count_flops(trainer, pl_module, batch, batch_idx)
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_train_batch_end", err)

    # -- FLOPs ---------------------------------------------------------------------------------------------------
    def _start_flops(self, trainer: Trainer) -> None:
        """At train start: when "auto" counts (after the warm-up, once per run), and the device's peak FLOP/s."""
        auto = self.flops_per_batch == "auto" and self._flops is None
        if auto and self._manual:
            self._flops_reason = ("`flops_per_batch='auto'` counts automatic optimization's training_step and"
                                  " backward; under manual optimization the step runs the optimizer itself: pass"
                                  " `flops_per_batch=` (a number)")
            self._warn_once("flops", f"{self._flops_reason}. TFLOP/s and MFU are not reported.")
        self._flops_due = max(self.warmup_steps, 1) if auto and not self._manual else -1
        from lightning.fabric.utilities.throughput import get_available_flops

        self._peak_flops, self._peak_source, self._peak_reason, self._dtype_name = peak_flops(
            self.available_flops, self.flops_per_batch, getattr(trainer, "precision", None),
            trainer.strategy.root_device, get_available_flops)

    def _count_flops(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Counts the FLOPs of one training batch (training_step and backward) once, on a copy of the model, between
        two iterations; the time it takes is left out of the run's, the epoch's and the next iteration's."""
        self._flops_due = -1
        start = now()
        try:
            from lightning.fabric.utilities import measure_flops

            flops = count_step_flops(pl_module, lambda module, data: module.training_step(data, batch_idx), batch,
                                     measure_flops, keep=[trainer], silence=("log", "log_dict"))
            if flops <= 0:
                raise ValueError("0 FLOPs counted: torch's FlopCounterMode counts matmuls, convolutions and"
                                 " attention, and the step ran none of them")
            self._flops, self._flops_source, self._flops_counted_at = float(flops), "auto", self.iterations
        except Exception as err:  # noqa: BLE001 - a measurement never raises into training
            self._flops_reason = (f"`flops_per_batch='auto'` could not count this model's training step"
                                  f" ({type(err).__name__}: {error_message(err)}); pass `flops_per_batch=` (a number)")
            self._warn_once("flops", f"{self._flops_reason}. TFLOP/s and MFU are not reported.")
        finally:
            spent = now() - start
            self._flops_count_time_s += spent
            for name in ("_last_mark", "_train_start"):  # the clocks skip the count
                mark = getattr(self, name)
                if mark is not None:
                    setattr(self, name, mark + spent)
            self._epochs.skip(spent)
            if self._clock is not None:
                self._clock.break_chain()
                self._restart_device_chain()
            if self._flags & GC:  # a collection during the count is not the next iteration's
                self._flags &= ~GC
                self._gc_pause_s = 0.0

    def _items(self, batch: Any) -> Optional[int]:
        try:
            items = int(self.items_fn(batch))  # type: ignore[misc]
            if items < 0:
                raise ValueError(f"items_fn returned {items}, a negative count")
            return items
        except Exception as err:  # noqa: BLE001
            self._items_unknown = f"items_fn failed: {type(err).__name__}: {error_message(err)}"
            self._warn_once("items", f"{self._items_unknown}; items/s is not reported.")
            return None

    def _end_iteration(self, trainer: Trainer) -> None:
        t = now()
        self.iterations += 1
        self._fit_iterations += 1
        reason = "warmup" if self._fit_iterations <= self.warmup_steps else None
        seconds = t - self._last_mark if self._last_mark is not None else 0.0
        flags = self._flags
        gc_pause_s = own_s = 0.0
        if flags:  # what coincided with this iteration, taken at its end: what runs from here on is the next one's
            gc_pause_s, own_s = self._gc_pause_s, self._own_s
            self._flags, self._gc_pause_s, self._own_s = 0, 0.0, 0.0
            if flags & OWN and not self._own_work_named(seconds, own_s):
                flags &= ~OWN
        if reason is None:
            ms = seconds * 1000.0
            pending = self._pending_ms
            pending.append(ms)
            if len(pending) >= FOLD_EVERY:
                start = now()
                self._fold()
                OWN_WORK.add(now() - start)  # the next iteration's
            if self._retries_seen is not None and (ms > self._slow_floor or seconds > self._tail_threshold_s):
                flags |= self._retried(trainer)  # a slow iteration on CUDA: did the allocator retry?
            if ms > self._slow_floor:  # the tail: one comparison with the K-th slowest so far
                self._slowest.offer(ms, trainer.global_step, trainer.current_epoch, flags, gc_pause_s * 1000.0,
                                    self.iterations)
                self._slow_floor = self._slowest.floor
            if flags:
                self._causes.add(ms, flags, gc_pause_s, own_s)
            if seconds > self._tail_threshold_s:
                self._window.tail_s += seconds
            self._counted_batches += self._iter_batches
            self._counted_samples += self._iter_samples
            self._counted_items += self._iter_items
            window = self._window
            window.seconds += seconds
            window.iterations += 1
            window.batches += self._iter_batches
            window.samples += self._iter_samples
            window.items += self._iter_items
        else:
            self._excluded[reason] = self._excluded.get(reason, 0) + 1
            self._warmup_time_s += seconds
        if self._clock is not None:
            fit = self._fit_iterations
            if fit >= self._next_device_mark:  # this iteration's end, or the start of the next, timed on the device
                self._device_mark(fit)
            if fit % POLL_EVERY == 0:  # the events the device has passed, read in batches
                for ms in self._clock.poll():
                    self._device.add(ms)
        self._last_mark = t
        self._iter_batches = 0
        self._iter_samples = 0
        self._iter_items = 0
        if self._fit_iterations % self._log_every == 0:
            start = now()
            self._log_window(trainer)
            OWN_WORK.add(now() - start)  # the next iteration's

    def _batch_size(self, batch: Any) -> Optional[int]:
        try:
            if self.batch_size_fn is not None:
                size = int(self.batch_size_fn(batch))
                if size < 0:
                    raise ValueError(f"batch_size_fn returned {size}, a negative batch size")
                return size
            size = follow(batch, self._size_path) if self._size_path is not None else None
            if size is None:  # the first batch, or one shaped differently: find the path once more
                self._size_path = batch_size_path(batch)
                size = follow(batch, self._size_path) if self._size_path is not None else None
            if size is None:
                raise ValueError(f"no tensor with a batch dimension found in a {type(batch).__name__}")
            return size
        except Exception as err:  # noqa: BLE001
            self._samples_unknown = f"batch size unknown: {type(err).__name__}: {err}"
            self._warn_once("batch_size", f"{self._samples_unknown}; samples/s is not reported. Pass `batch_size_fn`.")
            return None

    def _log_window(self, trainer: Trainer) -> None:
        window, self._window = self._window, _Window()
        seconds, iters, batches, samples, items = (window.seconds, window.iterations, window.batches, window.samples,
                                                   window.items)
        tail_s = window.tail_s
        if iters == 0 or seconds <= 0:
            return
        metrics = {
            "perf/it_per_s": iters / seconds,
            "perf/ms_per_iter": 1000.0 * seconds / iters,
            "perf/batches_per_s": batches / seconds,
        }
        if self._samples_unknown is None:
            metrics["perf/samples_per_s"] = samples / seconds
        if self.items_fn is not None and self._items_unknown is None:
            metrics["perf/items_per_s"] = items / seconds
        if self._tail_threshold_s < math.inf:
            metrics["perf/tail_time_pct"] = 100.0 * tail_s / seconds
        if self._retries_seen is not None:  # retries in this window's fast iterations flag none of the next
            self._retried(trainer)
        # the next window's tail: above 2x the median so far (of the folded iterations: a read does not fold)
        median = self._host.quantile(0.5)
        self._tail_threshold_s = TAIL_FACTOR * median / 1000.0 if median else math.inf
        if self._flops is not None:
            tflops = tflops_per_s(self._flops, batches, seconds)
            metrics["perf/tflops_per_s"] = tflops
            if self._peak_flops is not None:
                metrics["perf/mfu_pct"] = mfu_pct(tflops, self._peak_flops)
        log_scalars(trainer, metrics)

    @guarded
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self._train_start is None:
            return
        self._sync_device()
        if self._clock is not None:  # the device's interval that spans the validation is left out, as the host's
            self._clock.break_chain()  # time of it is cut out of the iteration it interrupts
        self._eval_start = now()

    @guarded
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self._eval_start is None:
            return
        self._sync_device()
        seconds = now() - self._eval_start
        self._eval_time_fit += seconds
        self._validation_runs += 1
        self._eval_start = None
        # the next iteration is the first after a validation; a collection during validation is not training's
        self._flags = (self._flags & CHECKPOINT) | AFTER_VALIDATION
        self._gc_pause_s = self._own_s = 0.0
        if self._retries_seen is not None:  # an evaluation's retries are not the next iteration's
            self._retried(trainer)
        if self._last_mark is not None:  # cut the validation out of the iteration it interrupted
            self._last_mark += seconds
        if self._iter_batches == 0:  # between two iterations: the next one's device interval starts here
            self._restart_device_chain()

    # -- device timing -------------------------------------------------------------------------------------------
    def _device_timed(self, fit_iteration: int) -> bool:
        """Whether the fit's iteration ``fit_iteration`` (the first is 1) is timed on the device: SectionProfiler's
        schedule (``measure.clock.device_timed``, 0-based), so the same iterations for the same warm-up and n."""
        return device_timed(fit_iteration - 1, self.warmup_steps, self.device_timing_every_n_iterations)

    def _next_device_mark_after(self, fit_iteration: int) -> int:
        """The first iteration after ``fit_iteration`` whose end needs an event: a timed one's end, or the start
        of one (the end of the iteration before it: the 1-based number of the timed one's 0-based index)."""
        if self._device_timed(fit_iteration + 1):
            return fit_iteration + 1
        return next_device_timed(fit_iteration + 1, self.warmup_steps, self.device_timing_every_n_iterations)

    def _device_mark(self, fit_iteration: int) -> None:
        """At the end of the fit's iteration ``fit_iteration``, where ``_next_device_mark`` says: one CUDA event,
        where a timed iteration ends, the next starts, or both."""
        ends = self._device_timed(fit_iteration)
        if ends or self._device_timed(fit_iteration + 1):
            self._clock.mark(counted=ends)
        self._next_device_mark = self._next_device_mark_after(fit_iteration)

    def _restart_device_chain(self) -> None:
        """After something left out of the device's chain (the fit's start, a validation between iterations, the
        FLOP count): the next iteration, when timed, starts here."""
        if self._clock is not None and self._device_timed(self._fit_iterations + 1):
            self._clock.mark(counted=False)

    def _sync_device(self) -> None:
        # Phase boundaries only: attributing queued GPU work to the right phase costs nothing here.
        if self._clock is not None:
            import torch

            torch.cuda.synchronize()

    @guarded
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epochs.end(trainer.current_epoch, now(), self._eval_time_fit, self.iterations)

    def _finish_timing(self) -> None:
        if self._train_start is not None and self._train_end is None:
            if self._clock is not None:
                for ms in self._clock.flush():
                    self._device.add(ms)
            self._train_end = now()

    @guarded
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish_timing()
        retries = self._read_alloc_retries(trainer)
        if retries is not None and self._alloc_retries_start is not None:
            self._alloc_retries = (self._alloc_retries or 0) + max(0, retries - self._alloc_retries_start)
            self._alloc_retries_start = None
        median = self._histogram().quantile(0.5)
        mean = self._histogram().mean
        # One collective, reached by every rank with the same shape (in a PerfSuite, shared with its other callbacks).
        gather_floats_then(trainer, [median, mean], self._set_ranks, self)
        s = self._histogram().summary()
        tflops = tflops_per_s(self._flops, self._counted_batches, self._histogram().total / 1000.0)
        log_scalars(
            trainer,
            {
                "perf/final_ms_per_iter_p50": s["p50"],
                "perf/final_ms_per_iter_p95": s["p95"],
                "perf/final_ms_per_iter_p99": s["p99"],
                "perf/final_it_per_s": 1000.0 / s["mean"] if s["mean"] else None,
                "perf/final_tflops_per_s": tflops,
                "perf/final_mfu_pct": mfu_pct(tflops, self._peak_flops),
                "perf/train_time_s": self._train_time_s(),
                "perf/eval_time_s": self._eval_time_s(),
            },
        )

    def _set_ranks(self, rows: Rows) -> None:
        self._ranks = {
            "median_ms_per_iter": spread_across_ranks([r[0] for r in rows]),
            "mean_ms_per_iter": spread_across_ranks([r[1] for r in rows]),
        }

    @guarded
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write_summary(trainer)
        if self.verbose and trainer.is_global_zero:
            rank_zero_info(self.verdict())

    def verdict(self) -> str:
        """One line for the console: the headline (mean), the typical iteration (median), the tail, the totals."""
        s = self._histogram().summary()
        if s["mean"] is None:
            return f"IterationTimer: no iteration measured ({self.iterations} ran, {self.warmup_steps} warm-up per fit)"
        line = (f"IterationTimer: {s['mean']:.2f} ms/iter mean ({1000.0 / s['mean']:.2f} it/s), median {s['median']:.2f},"
                f" p95 {s['p95']:.2f} ms, over {self._histogram().count} of {self.iterations} iterations;"
                f" train {self._train_time_s():.1f} s, eval {self._eval_time_s():.1f} s")
        section = self._summary_section()
        train, with_eval = section["projected_time_to_target_s"], section["projected_time_to_target_with_eval_s"]
        if train is not None:
            line += f"; {section['target_steps']:,} iterations: {train:.1f} s training"
            if with_eval is not None and with_eval != train:
                line += f", {with_eval:.1f} s with evaluation"
        return line + "\n" + tail_line(section["tail"])

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._gc.uninstall()  # no teardown follows an exception
        OWN_WORK.unwatch(self._own_work)
        self._finish_timing()
        self._write_summary(trainer, exception)

    # -- results -------------------------------------------------------------------------------------------------
    def _summary_section(self) -> Dict[str, Any]:
        s = self._histogram().summary()
        counted_s = self._histogram().total / 1000.0
        unavailable: Dict[str, str] = {}
        samples_per_s = None
        if self._samples_unknown is not None:
            unavailable["samples_per_s"] = self._samples_unknown
        elif counted_s > 0:
            samples_per_s = self._counted_samples / counted_s
        if self._histogram().count == 0:
            unavailable["ms_per_iter"] = (
                f"no iteration was measured: {self.iterations} iterations ran and the first"
                f" {self.warmup_steps} of each fit are warm-up"
            )
        startup = self._startup_time_s if self._fits else None
        if startup is None:
            unavailable["startup_time_s"] = ("training never started" if not self._fits else
                                             "resumed from a checkpoint that kept no startup time (an older version)")
        if self._clock is None:
            unavailable["device_ms_per_iter"] = "device timing needs CUDA" if self.device_timing else "switched off"
        elif self._device.count == 0:
            unavailable["device_ms_per_iter"] = "no CUDA event interval completed"
        flops = self._flops_section(counted_s, unavailable)
        items_per_s = None
        if self.items_fn is None:
            unavailable["items_per_s"] = "no `items_fn` given: pass `items_fn=` (batch -> tokens, pixels, ...)"
        elif self._items_unknown is not None:
            unavailable["items_per_s"] = self._items_unknown
        elif counted_s > 0:
            items_per_s = self._counted_items / counted_s
        target = self._target_iterations()
        if target is None:
            unavailable["projected_time_to_target_s"] = "no target: set `target_steps` or the trainer's `max_steps`"
        section: Dict[str, Any] = {
            "iterations": self.iterations,
            "batches": self.batches,
            "samples": self.samples if self._samples_unknown is None else None,
            "measured_iterations": self._histogram().count,
            "warmup_steps": self.warmup_steps,
            "excluded": dict(self._excluded),
            "warmup_time_s": self._warmup_time_s,
            "startup_time_s": startup,
            "fits": self._fits,
            "manual_optimization": self._manual,
            "resumed_at_iteration": self._resumed_at,
            "ms_per_iter": s,
            "it_per_s": 1000.0 / s["mean"] if s["mean"] else None,
            "batches_per_s": self._counted_batches / counted_s if counted_s > 0 else None,
            "samples_per_s": samples_per_s,
            "items": self.items if self.items_fn is not None and self._items_unknown is None else None,
            "items_per_s": items_per_s,
            **flops,
            "device_ms_per_iter": self._device.summary() if self._device.count else None,
            "device_events_dropped": self._clock.dropped if self._clock is not None else 0,
            "device_timed_iterations": self._device.count if (self._clock is not None or self._device.count) else None,
            "device_timing_every_n_iterations": self.device_timing_every_n_iterations,
            "train_time_s": self._train_time_s(),
            "eval_time_s": self._eval_time_s(),
            "sanity_check_time_s": self._sanity_time_s,
            "validation_runs": self._validation_runs,
            "eval_time_per_validation_s": (
                self._eval_time_s() / self._validation_runs if self._validation_runs else None),
            "epochs": list(self._epochs.records),
            "ranks": self._ranks,
            "histogram_ms": self._histogram().to_dict(),
            "blocks_ms": self._series().to_dict(),
            "tail": self._tail_section(unavailable),
            "unavailable": unavailable,
        }
        section["target_steps"] = target
        unknown = {"train_s": None, "with_eval_s": None}
        total = project_time(section, target) if target is not None else unknown
        left = project_time(section, target, done=self.iterations) if target is not None else unknown
        section["projected_time_to_target_s"] = total["train_s"]
        section["projected_time_to_target_with_eval_s"] = total["with_eval_s"]
        section["projected_remaining_s"] = left["train_s"]
        section["projected_remaining_with_eval_s"] = left["with_eval_s"]
        return section

    def _tail_section(self, unavailable: Dict[str, str]) -> Dict[str, Any]:
        gc_figures = {"collections": self._gc.collections, "full_collections": self._gc.full_collections,
                      "pause_s": self._gc.pause_s}
        if self._alloc_retries is None:
            unavailable["tail.alloc_retries"] = ("the CUDA allocator's retries are read on CUDA only"
                                                 if self._clock is None else "not read: training did not end")
        block = tail_block(self._histogram(), self._causes, self._slowest,
                           {"gc": gc_figures, "alloc_retries": self._alloc_retries, "dataloader": self._loader_info})
        block["insights"] = tail_insights(block)
        if block["share_pct"] is None:
            unavailable["tail"] = "no iteration was measured"
        return block

    def _flops_section(self, counted_s: float, unavailable: Dict[str, str]) -> Dict[str, Any]:
        """TFLOP/s over the measured iterations (FLOPs of a batch x measured batches / measured time) and MFU."""
        tflops = tflops_per_s(self._flops, self._counted_batches, counted_s)
        mfu = mfu_pct(tflops, self._peak_flops)
        if self._flops is None:
            unavailable["tflops_per_s"] = (
                "no `flops_per_batch` given: pass a number or 'auto'" if self.flops_per_batch is None else
                self._flops_reason or "`flops_per_batch='auto'` counts after the warm-up and no iteration got there")
        elif tflops is None:
            unavailable["tflops_per_s"] = "no iteration was measured"
        if mfu is None:
            unavailable["mfu_pct"] = (self._peak_reason if self._peak_flops is None else unavailable["tflops_per_s"])
        return {"flops_per_batch": self._flops, "flops_source": self._flops_source,
                "flops_count_time_s": self._flops_count_time_s, "tflops_per_s": tflops,
                "available_flops": self._peak_flops, "available_flops_source": self._peak_source,
                "flops_dtype": self._dtype_name, "mfu_pct": mfu}

    def _target_iterations(self) -> Optional[int]:
        """N in iterations. A target taken from ``max_steps`` counts optimizer steps: under manual optimization
        (an iteration is a batch) it is converted at the ratio of batches to optimizer steps seen so far."""
        target = self._target
        if target is None or not (self._manual and self._target_from_max_steps):
            return target
        steps = self._last_global_step - self._first_global_step
        fit_iters = self._fit_iterations
        if steps <= 0 or fit_iters <= 0:
            return target
        return int(round(target * fit_iters / steps))

    # -- checkpointing -------------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        if self._clock is not None:  # the device intervals already passed go with the checkpoint (never waits)
            try:
                for ms in self._clock.poll():
                    self._device.add(ms)
            except Exception as err:  # noqa: BLE001 - a measurement never stops a checkpoint
                self._record_failure("state_dict (device events)", err)
        return {
            "iterations": self.iterations,
            "batches": self.batches,
            "samples": self.samples,
            "train_time_s": self._train_time_s(),
            "eval_time_s": self._eval_time_s(),
            "counted_samples": self._counted_samples,
            "counted_batches": self._counted_batches,
            "items": self.items,
            "counted_items": self._counted_items,
            "flops": {"per_batch": self._flops, "source": self._flops_source, "counted_at": self._flops_counted_at,
                      "count_time_s": self._flops_count_time_s},
            "excluded": dict(self._excluded),
            "warmup_time_s": self._warmup_time_s,
            "startup_time_s": self._startup_time_s,
            "validation_runs": self._validation_runs,
            "fits": self._fits,
            "epochs": list(self._epochs.records),
            "open_epoch": self._epochs.open_record(now(), self._eval_time_fit, self.iterations),
            "histogram_ms": self._histogram().to_dict(),
            "blocks_ms": self._series().to_dict(),
            "device_histogram_ms": self._device.to_dict(),
            "tail": {"slowest": self._slowest.to_state(), "gc_pause_s": self._causes.gc_pause_s,
                     "own_s": self._causes.own_s,
                     "causes": {name: hist.to_dict() for name, hist in self._causes.hists.items()},
                     "alloc_retries": self._alloc_retries},
        }

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        s = StateReader(state_dict)
        epochs = [{"epoch": e.count("epoch"), "time_s": e.number("time_s"), "iterations": e.count("iterations"),
                   "it_per_s": e.number("it_per_s", None, allow_none=True), "eval_time_s": e.number("eval_time_s")}
                  for e in s.records("epochs")[:MAX_EPOCH_RECORDS]]
        carried = s.mapping("open_epoch", allow_none=True)
        open_epoch = None if carried is None or not carried.data else {
            "epoch": carried.count("epoch"), "iterations": carried.count("iterations"),
            "time_s": carried.number("time_s"), "eval_time_s": carried.number("eval_time_s")}
        flops = s.mapping("flops")
        counted_flops = flops.number("per_batch", None, allow_none=True)
        source = flops.text("source")
        if self.flops_per_batch != "auto" or source != "auto":  # a count is kept for "auto" only; a number stays
            counted_flops, source = self._flops, self._flops_source
        tail = s.mapping("tail")
        slowest = SlowestIterations(self.keep_slowest)
        rows = tail.data.get("slowest", [])
        if not isinstance(rows, list) or not all(isinstance(r, (list, tuple)) and len(r) in (6, 7) for r in rows):
            raise StateError("tail.slowest is not a list of 7-number rows")
        slowest.load(rows)
        causes = CauseBook()
        causes.gc_pause_s = tail.number("gc_pause_s")
        causes.own_s = tail.number("own_s")  # 0 in a checkpoint of an older version
        cause_states = tail.mapping("causes")
        causes.hists = {name: cause_states.histogram(name) for name in cause_states.data}
        retries = tail.count("alloc_retries", None) if tail.data.get("alloc_retries") is not None else None
        read = dict(
            iterations=s.count("iterations"), batches=s.count("batches"), samples=s.count("samples"),
            _prior_train_time_s=s.number("train_time_s"), _prior_eval_time_s=s.number("eval_time_s"),
            _counted_samples=s.count("counted_samples"), _counted_batches=s.count("counted_batches"),
            items=s.count("items"), _counted_items=s.count("counted_items"),
            _flops=counted_flops, _flops_source=source,
            _flops_counted_at=flops.count("counted_at", None) if flops.data.get("counted_at") is not None else None,
            _flops_count_time_s=flops.number("count_time_s"),
            _excluded={**self._excluded, "warmup": s.mapping("excluded").count("warmup")},
            _warmup_time_s=s.number("warmup_time_s"), _startup_time_s=s.number("startup_time_s", None, allow_none=True),
            _validation_runs=s.count("validation_runs"),
            _fits=s.count("fits"),
            _host=s.histogram("histogram_ms", self._histogram()), _blocks=s.series("blocks_ms", self._series()),
            _device=s.histogram("device_histogram_ms", self._device), _slowest=slowest,
            _slow_floor=slowest.floor, _causes=causes, _alloc_retries=retries)
        for name, value in read.items():  # all read: nothing is assigned from a state that fails halfway
            setattr(self, name, value)
        self._epochs.records, self._epochs.carried = epochs, open_epoch
        self._resumed_at = self.iterations
