"""IterationTimer: ms/iter, it/s, percentiles and time to N iterations, without stalling the device."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lightning_perf.callbacks.core.arguments import bad_argument, check_bool, check_number, check_positive_int
from lightning_perf.callbacks.core.base import PerfCallback, guarded, reads_state
from lightning_perf.callbacks.core.rank_gather import Rows, gather_floats_then, spread_across_ranks
from lightning_perf.callbacks.core.scalars import WAITING, log_scalars
from lightning_perf.callbacks.core.summary_book import error_message
from lightning_perf.callbacks.iteration_timer.flops import FlopsCount
from lightning_perf.callbacks.iteration_timer.state import CheckpointState
from lightning_perf.callbacks.iteration_timer.summary import Results
from lightning_perf.measure.stats.streaming import FOLD_EVERY, BlockSeries, LogHistogram
from lightning_perf.measure.timing.batch_size import batch_size_path, follow
from lightning_perf.measure.timing.clock import POLL_EVERY, DeviceIntervalClock, device_timed, now
from lightning_perf.measure.timing.iteration_ledger import IterationLedger
from lightning_perf.measure.timing.tail import ALLOC_RETRY, OWN_WORK, GcWatch


class IterationTimer(FlopsCount, CheckpointState, Results, PerfCallback):
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

    # -- state: the counts and clocks are the ledger's (``measure.timing.iteration_ledger``) ----------------------
    # the run's counts, as attributes of the timer (settable, as they were before the ledger held them)
    iterations = property(lambda self: self._ledger.iterations,
                          lambda self, value: setattr(self._ledger, "iterations", value),
                          doc="Training iterations so far, over the whole run.")
    batches = property(lambda self: self._ledger.batches, lambda self, value: setattr(self._ledger, "batches", value),
                       doc="Training batches so far, over the whole run.")
    samples = property(lambda self: self._ledger.samples, lambda self, value: setattr(self._ledger, "samples", value),
                       doc="Samples of the training batches so far, where their size is known.")
    items = property(lambda self: self._ledger.items, lambda self, value: setattr(self._ledger, "items", value),
                     doc="Items (``items_fn``) of the training batches so far.")

    @property
    def _pending_ms(self) -> List[float]:
        """The measured iterations' ms not folded yet (at most FOLD_EVERY - 1 of them)."""
        return self._ledger.pending_ms

    def _histogram(self) -> LogHistogram:
        """The counted iterations' ms, every one of them folded in."""
        return self._ledger.histogram()

    def _series(self) -> BlockSeries:
        """The counted iterations' ms in blocks (for the speed verdict's interval), every one folded in."""
        return self._ledger.series()

    def _reset(self) -> None:
        old = getattr(self, "_ledger", None)
        if old is not None:
            OWN_WORK.unwatch(old.own_work)
        # read at reset (a fit's setup): a clock put in place of ``now`` before the fit is the ledger's
        self._ledger = IterationLedger(self.warmup_steps, self.keep_slowest, clock=now, fold_every=FOLD_EVERY)
        self._device = LogHistogram()
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
        self._gc = GcWatch(self._ledger.gc_flagged)
        self._samples_unknown: Optional[str] = None
        self._size_path: Optional[tuple] = None
        self._ranks: Optional[Dict[str, Any]] = None
        # This fit only.
        self._last_global_step = 0
        self._stepped = False
        self._first_global_step = 0
        self._target: Optional[int] = self.target_steps
        self._target_from_max_steps = False
        self._manual = False
        self._flops_due = -1  # the fit iteration after which "auto" counts the FLOPs of a batch (-1: none)
        self._peak_flops: Optional[float] = None  # the device's peak FLOP/s at the run's precision
        self._peak_source: Optional[str] = None
        self._peak_reason: Optional[str] = "training has not started"
        self._dtype_name: Optional[str] = None
        self._loader_info: Optional[Dict[str, Any]] = None
        self._alloc_retries_start: Optional[int] = None
        self._alloc_retries: Optional[int] = None
        self._retries_seen: Optional[int] = None  # the allocator's retries at the last read (CUDA only)
        self._clock: Optional[DeviceIntervalClock] = None
        self._log_every = 50

    def _train_time_s(self) -> float:
        """Training wall time so far: this fit's time in the training loop minus its validation, plus earlier fits."""
        return self._ledger.train_time_s()

    def _eval_time_s(self) -> float:
        return self._ledger.eval_time_s()

    # -- Lightning hooks -----------------------------------------------------------------------------------------
    @guarded
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._carry_or_reset(trainer, self._reset)
        self._ledger.fit_setup()  # the warm-up cost runs from here (after the data module's setup) to training
        self._gc.install()  # removed at teardown and on an exception
        OWN_WORK.watch(self._ledger.own_work)  # likewise
        self._start_run(trainer)
        self._log_every = self.log_every_n_steps or max(1, int(getattr(trainer, "log_every_n_steps", 50) or 50))
        # Known before anything runs, so a fit that fails in its sanity check still names its target.
        if self.target_steps is None and trainer.max_steps is not None and trainer.max_steps > 0:
            self._target, self._target_from_max_steps = trainer.max_steps, True

    @guarded
    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._ledger.sanity_start()

    @guarded
    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._ledger.sanity_end()

    @guarded
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._manual = not pl_module.automatic_optimization
        self._last_global_step = self._first_global_step = trainer.global_step
        on_cuda = trainer.strategy.root_device.type == "cuda"
        self._clock = DeviceIntervalClock() if (self.device_timing and on_cuda) else None
        self._start_flops(trainer)
        self._alloc_retries_start = self._retries_seen = self._read_alloc_retries(trainer)
        loader = getattr(trainer, "train_dataloader", None)
        workers = getattr(loader, "num_workers", None)
        self._loader_info = None if not isinstance(workers, int) else {
            "num_workers": workers, "persistent_workers": bool(getattr(loader, "persistent_workers", False))}
        self._ledger.position = self._position  # a slow iteration's, read from the trainer of this fit
        self._ledger.slow_flags = None if self._retries_seen is None else self._slow_retried  # CUDA only
        self._ledger.start_training(trainer.current_epoch)

    @guarded
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: Dict[str, Any]) -> None:
        self._ledger.checkpoint_saved()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._gc.uninstall()
        OWN_WORK.unwatch(self._ledger.own_work)
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

    def _fit_trainer(self) -> Optional[Trainer]:
        """The trainer of this fit (held weakly: a copy of the timer holds none)."""
        ref = getattr(self, "_trainer_ref", None)  # (set at setup)
        return ref() if ref is not None else None

    def _position(self) -> Tuple[int, int]:
        """(global step, epoch) for the ledger's record of a slow iteration."""
        trainer = self._fit_trainer()
        return (trainer.global_step, trainer.current_epoch) if trainer is not None else (0, 0)

    def _slow_retried(self) -> int:
        """For the ledger, at a slow iteration: ALLOC_RETRY where the allocator retried (``_retried``)."""
        trainer = self._fit_trainer()
        return self._retried(trainer) if trainer is not None else 0

    @guarded
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._ledger.fit_iterations == 0:
            self._restart_device_chain()
        self._ledger.epoch_start(trainer.current_epoch)

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        # automatic optimization calls this once per optimizer step: the batch that ends here ends an iteration. One
        # assignment, nothing to guard (a step hook: see `guarded`).
        # a flag: 2 µs a step less than reading trainer.global_step (benchmarks/overhead.py --per-hook IterationTimer)
        self._stepped = True

    @guarded
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        samples = None
        if self._samples_unknown is None:
            path = self._size_path
            if path is not None and self.batch_size_fn is None:  # the path found at the first batch, followed here
                try:
                    found = batch
                    for key in path:
                        found = found[key]
                    if isinstance(found, torch.Tensor):
                        samples = found.shape[0]
                except Exception:  # noqa: BLE001 - shaped otherwise: ``_batch_size`` finds it again or says why
                    pass
            if samples is None:
                samples = self._batch_size(batch)
        items = self._items(batch) if self.items_fn is not None and self._items_unknown is None else None
        if not self._manual:
            if not self._stepped:  # still accumulating: the iteration ends with the optimizer step
                self._ledger.add_batch(samples, items)
                return
            self._stepped = False
        else:  # an iteration is a batch; the optimizer steps taken convert a target from max_steps
            self._last_global_step = trainer.global_step
        self._end_iteration(trainer, samples, items)
        if WAITING.count:
            self._drain_scalars(trainer)
        if self._ledger.fit_iterations == self._flops_due:
            self._count_flops(trainer, pl_module, batch, batch_idx)

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

    def _end_iteration(self, trainer: Trainer, samples: Optional[int], items: Optional[int]) -> None:
        """The iteration ends with this batch (``samples`` and ``items`` where known): the ledger's, then the
        device's marks and, when due, the logging window."""
        ledger = self._ledger
        index = ledger.fit_iterations  # of this iteration in the fit, 0-based
        ledger.end_iteration(samples, items)
        if self._clock is not None:
            self._device_mark(index)
            if ledger.fit_iterations % POLL_EVERY == 0:  # the events the device has passed, read in batches
                for ms in self._clock.poll():
                    self._device.add(ms)
        if ledger.fit_iterations % self._log_every == 0:
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
            # the path found once: 7 µs a step less than a search (benchmarks/overhead.py --per-hook IterationTimer)
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
        ledger = self._ledger
        window = ledger.take_window()
        if window.iterations == 0 or window.seconds <= 0:
            return
        metrics = window.rates(samples_known=self._samples_unknown is None,
                               items_known=self.items_fn is not None and self._items_unknown is None,
                               tail_known=ledger.tail_threshold_s < math.inf, flops_per_batch=self._flops,
                               peak_flops=self._peak_flops)
        if self._retries_seen is not None:  # retries in this window's fast iterations flag none of the next
            self._retried(trainer)
        ledger.update_tail_threshold()
        log_scalars(trainer, metrics)

    @guarded
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self._ledger.train_start is None:
            return
        self._sync_device()
        if self._clock is not None:  # the device's interval that spans the validation is left out, as the host's
            self._clock.break_chain()  # time of it is cut out of the iteration it interrupts
        self._ledger.validation_start()

    @guarded
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self._ledger.eval_start is None:
            return
        self._sync_device()
        self._ledger.validation_end()  # cut out of the iteration it interrupted
        if self._retries_seen is not None:  # an evaluation's retries are not the next iteration's
            self._retried(trainer)
        if self._ledger.iter_batches == 0:  # between two iterations: the next one's device interval starts here
            self._restart_device_chain()

    # -- device timing -------------------------------------------------------------------------------------------
    def _device_timed(self, index: int) -> bool:
        """Whether the fit's iteration at 0-based ``index`` is timed on the device: SectionProfiler's schedule
        (``measure.timing.clock.device_timed``), so the same iterations for the same warm-up and n."""
        return device_timed(index, self.warmup_steps, self.device_timing_every_n_iterations)

    def _device_mark(self, index: int) -> None:
        """At the end of the fit's iteration ``index``: one CUDA event where a timed iteration ends, the next timed
        one starts, or both."""
        ends = self._device_timed(index)
        if ends or self._device_timed(index + 1):
            self._clock.mark(counted=ends)

    def _restart_device_chain(self) -> None:
        """After something left out of the device's chain (the fit's start, a validation between iterations, the
        FLOP count): the next iteration, when timed, starts here."""
        if self._clock is not None and self._device_timed(self._ledger.fit_iterations):
            self._clock.mark(counted=False)

    def _sync_device(self) -> None:
        # Phase boundaries only: attributing queued GPU work to the right phase costs nothing here.
        if self._clock is not None:
            torch.cuda.synchronize()

    @guarded
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._ledger.epoch_end(trainer.current_epoch)

    def _finish_timing(self) -> None:
        ledger = self._ledger
        if ledger.train_start is not None and ledger.train_end is None:
            if self._clock is not None:
                for ms in self._clock.flush():
                    self._device.add(ms)
            ledger.finish()

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
        log_scalars(trainer, self._final_scalars())

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
        return self._verdict_line()

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._gc.uninstall()  # no teardown follows an exception
        OWN_WORK.unwatch(self._ledger.own_work)
        self._finish_timing()
        self._write_summary(trainer, exception)

    # -- results: ``_summary_section`` and the final scalars are in ``summary.Results`` ----------------------------
    # -- checkpointing -------------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        return self._state_of()

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._load_into(state_dict)
