"""SectionProfiler: where each iteration's time goes (data loading, forward, backward, optimizer step,
checkpointing, user-named sections), with shares and advice, at no device sync. The sections themselves are kept by
:class:`~lightning_perf.measure.sections.ledger.SectionLedger`; each hook here records one event in it."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lightning_perf.callbacks.core.arguments import bad_argument, check_bool, check_positive_int
from lightning_perf.callbacks.core.base import PerfCallback, guarded, reads_state
from lightning_perf.callbacks.core.rank_gather import Rows, gather_floats_then, spread_across_ranks
from lightning_perf.callbacks.core.scalars import WAITING
from lightning_perf.callbacks.section_profiler import batch_transfer
from lightning_perf.callbacks.section_profiler import fetch_marks
from lightning_perf.callbacks.section_profiler import timed_checkpoint_io
from lightning_perf.callbacks.section_profiler.checkpoint import read_saved_ledger
from lightning_perf.callbacks.section_profiler.device import SectionDevice
from lightning_perf.callbacks.section_profiler.fetch_marks import FETCH_MARKS as _FETCH_MARKS
from lightning_perf.callbacks.section_profiler.results import Results
from lightning_perf.callbacks.section_profiler.window import flush_tables, report_window
from lightning_perf.measure.sections import loader
from lightning_perf.measure.sections import user_sections
from lightning_perf.measure.sections.ledger import AUTO_SECTIONS, BETWEEN, MANUAL_SECTIONS, SectionLedger
from lightning_perf.measure.sections.report import BACKWARD_OVER_FORWARD
from lightning_perf.measure.sections.state import ledger_state, load_ledger
from lightning_perf.measure.timing.clock import POLL_EVERY, DeviceIntervalClock, now
from lightning_perf.measure.timing.tail import OWN_WORK

__all__ = ["SectionProfiler", "AUTO_SECTIONS", "MANUAL_SECTIONS", "BETWEEN", "BACKWARD_OVER_FORWARD"]

ENV_SWITCH = "LIGHTNING_PERF_PROFILE"
BOUNDARIES = ("fetch", "batch_gap")
class SectionProfiler(Results, PerfCallback):
    r"""Splits every training iteration into sections and reports count, total, mean, min, max, p50, p95 and share.

    An iteration runs from where the previous one closed to where the next one starts (its fetch by default, with
    ``data_loading_boundary="batch_gap"`` its transfer or ``on_train_batch_start``), or to an epoch end or the end
    of training: the work at its end (later callbacks' and the module's ``on_train_batch_end``, a checkpoint saved
    there) is its own. What the fit runs after its last iteration is the summary's ``after_last_iteration`` row.

    Automatic sections, which add up to the iteration: ``data_loading`` (the wait for the batch), ``between_batches``
    (the loop's host work between two batches; only with the fetch), ``transfer`` (``batch_to_device``),
    ``forward`` (``training_step``), ``backward``, ``optimizer_step``, ``checkpointing`` (writes and removals through
    the strategy's ``CheckpointIO``) and ``other`` (the rest). Under manual optimization ``training_step`` holds the
    forward and the rest of the step, ``backward`` each ``manual_backward`` (Lightning's backward hooks) and
    ``optimizer_step`` each ``opt.step()`` (torch's step hooks on the optimizers, for the fit), with one
    ``optimizer_step[i]`` row per optimizer where there are several. User sections
    (:class:`~lightning_perf.profile_section`) are carved out of the section they ran in, reported with it as
    ``parent``. Validation is timed apart. On CUDA each section also has a device time
    from CUDA events read once complete. See docs/section_profiler.md for every boundary.

    Args:
        enabled: profile at all; the environment variable ``LIGHTNING_PERF_PROFILE=0|1`` overrides it.
        report_every_n_steps: iterations between periodic reports (printed on rank 0 and logged).
        warmup_steps: iterations at the start of each fit left out.
        device_timing: also time sections with CUDA events when training on CUDA.
        data_loading_boundary: what ``data_loading`` is. ``"fetch"``: Lightning's dataloader fetch, from its start
            to its return, seen through the marks Lightning's training loop makes for its profiler there (private
            names; warns and falls back to ``"batch_gap"`` when no fetch is seen in 3 iterations); the rest of the
            gap between two batches is ``between_batches``. ``"batch_gap"``: the whole gap from the end of the
            previous batch to the transfer, through public hooks only (an upper bound of the wait: later callbacks'
            batch-end hooks, the progress bar and logger writes are inside it).
        device_timing_every_n_iterations: time sections on the device in the first n iterations after the warm-up,
            then in one iteration of every n, and report the mean over those (1: every iteration). Each timed
            iteration costs ~75 µs of CUDA calls on an H100 host; one in 32, ~2.5 µs a step.
        print_reports: print the periodic and the final table (rank 0); logging happens either way.
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.

    Logged metrics (every ``report_every_n_steps``, means over the window): ``time/<section>_ms`` and
    ``time_share/<section>_pct`` for each section (``time/forward_ms``, ``time_share/data_loading_pct``,
    ``time/ema_ms``, ...) and ``time/iteration_ms``.

    Raises:
        ValueError: for ``report_every_n_steps`` below 1, a negative ``warmup_steps`` or an unknown
            ``data_loading_boundary``.

    Example::

        trainer = Trainer(callbacks=[SectionProfiler(report_every_n_steps=100)])

        # in a LightningModule, a callback or a data module:
        with profile_section("ema"):
            self.ema.update(self.model)
    """

    section_name = "section_profiler"
    _transient = ("_checkpoint_io", "_strategy", "_fetch_marks", "_previous_sink", "_device", "_worker_timer",
                  "_transfer", "_step_hooks")

    def __init__(self, enabled: bool = True, report_every_n_steps: int = 50, warmup_steps: int = 5,
                 device_timing: bool = True, print_reports: bool = True, summary_path: Optional[str] = None,
                 run_name: Optional[str] = None, run_notes: Optional[str] = None,
                 device_timing_every_n_iterations: int = 32, data_loading_boundary: str = "fetch") -> None:
        super().__init__(summary_path=summary_path, run_name=run_name, run_notes=run_notes)
        check_positive_int("SectionProfiler", "report_every_n_steps", report_every_n_steps)
        check_positive_int("SectionProfiler", "warmup_steps", warmup_steps, minimum=0)
        self.enabled = check_bool("SectionProfiler", "enabled", enabled)
        self.report_every_n_steps = report_every_n_steps
        self.warmup_steps = warmup_steps
        self.device_timing = check_bool("SectionProfiler", "device_timing", device_timing)
        check_positive_int("SectionProfiler", "device_timing_every_n_iterations", device_timing_every_n_iterations)
        self.device_timing_every_n_iterations = device_timing_every_n_iterations
        self.print_reports = check_bool("SectionProfiler", "print_reports", print_reports)
        if data_loading_boundary not in BOUNDARIES:
            raise bad_argument("SectionProfiler", "data_loading_boundary", data_loading_boundary,
                               f"Expected one of {', '.join(repr(b) for b in BOUNDARIES)}.")
        self.data_loading_boundary = data_loading_boundary
        self._reset()

    # -- state ---------------------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._active = False
        self._ledger = SectionLedger(self.warmup_steps, self.report_every_n_steps,
                                     gap_mode=self.data_loading_boundary == "batch_gap")
        self._held: Optional[List[Any]] = None  # the ledger's held switches, where the step's hooks append theirs
        self._stepped = False  # an optimizer step was announced since the last batch end
        self._report_waits = False  # a report fell due at a fetch's start: made at the batch's transfer or start
        self._overhead_s = 0.0  # the hooks' own time
        self._device: Optional[SectionDevice] = None  # on CUDA, during a fit
        self._fetches = fetch_marks.FetchCount()  # announced by Lightning's loop (boundary "fetch")
        self._ranks: Optional[Dict[str, Any]] = None
        self._previous_sink: Any = None
        self._disabled_reason: Optional[str] = None
        self._checkpoint_io: Any = None  # our TimedCheckpointIO around the strategy's, during a fit
        self._strategy: Any = None
        self._checkpoint_reason: Optional[str] = None
        # (kept across resets: a data fetcher that still holds ours calls the loop's own marks through them)
        self._fetch_marks: Optional[fetch_marks.FetchMarks] = getattr(self, "_fetch_marks", None)
        self._transfer: Any = None  # our mark on the strategy's batch_to_device, during a fit
        self._worker_timer: Optional[loader.WorkerTimer] = None  # the DataLoader workers' own time, during a fit
        self._loaders: Any = None  # trainer.train_dataloader at train start
        self._workers: Optional[Dict[str, Any]] = None  # the summary's ``workers`` block, made at train end
        self._workers_reason: Optional[str] = None
        self._workers_at_stop = False  # read at an exception: a null block has its reason even before an iteration
        self._batches_per_iteration = 1
        self._world_size: Optional[int] = None  # the fit's processes, at setup
        # manual optimization: torch's step hooks on each optimizer (removed by ``_restore``), each optimizer's row
        # by id (None: a single optimizer, no row of its own), whether a step runs, and what it and a backward
        # interrupted
        self._step_hooks: List[Any] = []
        self._optimizer_rows: Dict[int, Optional[str]] = {}
        self._stepping = False
        self._step_resume = "training_step"
        self._backward_resume = "training_step"
        self._steps_reason: Optional[str] = None

    def _is_enabled(self) -> bool:
        value = os.environ.get(ENV_SWITCH) or ""
        if value.strip() in ("0", "1"):
            return value.strip() == "1"
        if value.strip():
            self._warn_once("env", f"{ENV_SWITCH}={value!r} is not 0 or 1; using enabled={self.enabled}.")
        return self.enabled

    def _trainer(self) -> Optional[Trainer]:
        ref = getattr(self, "_trainer_ref", None)  # (None in a copy, none before setup: no report is made there)
        return ref() if ref is not None else None

    def _closed(self, trainer: Optional[Trainer], report_later: bool = False) -> None:
        """After the ledger closed an iteration: device marks for the next ones, device events read in batches, the
        window report where one fell due. ``report_later``: closed at a fetch's start, whose wait for the batch the
        report must not lengthen; it is made at the batch's transfer (or its start) instead."""
        ledger = self._ledger
        if self._device is not None:
            self._mark_or_hold()
            if ledger.fit_iterations % POLL_EVERY == 0:
                self._device.poll()
        if ledger.report_due:
            ledger.report_due = False
            self._report_waits = report_later
            if not report_later:
                self._report(trainer)

    def _report(self, trainer: Optional[Trainer]) -> None:
        """The window report: lightning_perf's own work in the iteration that starts (IterationTimer may name it)."""
        self._report_waits = False
        if trainer is not None:
            start = now()
            self._report_window(trainer)
            OWN_WORK.add(now() - start)

    def _report_window(self, trainer: Trainer) -> None:
        report_window(trainer, self._ledger, self.print_reports, self._record_failure)

    # -- device marks (``_section_device.SectionDevice``) -------------------------------------------------------
    def _use_clock(self, clock: Optional[DeviceIntervalClock]) -> None:
        """At train start, before the first batch: the device clock of this fit, or none."""
        self._device = None if clock is None else SectionDevice(
            self._ledger, clock, self.warmup_steps, self.device_timing_every_n_iterations)
        self._mark_or_hold()

    def _mark_or_hold(self) -> None:
        """Where a switch can end or start a piece timed on the device, the ledger calls the device mark at each
        switch, the step's own at once; elsewhere those are held (``_held``, the ledger's list)."""
        near = self._device is not None and self._device.near_timed()
        self._ledger.marker = self._mark_device if near else None
        self._held = self._ledger.held if self._active and not near and not self._ledger.manual else None

    def _mark_device(self, current: Optional[str], section: Optional[str], end_next: bool, start_next: bool) -> None:
        """The ledger's ``marker`` (a method of ours, so that a copy's ledger holds no device clock)."""
        if self._device is not None:  # (a copy: its device clock is not copied)
            self._device.mark(current, section, end_next, start_next)

    # -- events from outside Lightning's hooks -------------------------------------------------------------------
    def section_started(self, name: str) -> Any:
        """Sink for profile_section: nothing to return on the host side (device: an event pair); under manual
        optimization also the backward and optimizer-step time so far (what runs inside the section stays theirs)."""
        token = None if self._device is None else self._device.section_started()
        return (self._ledger.step_s, token) if self._ledger.manual else token

    def section_ended(self, name: str, parent: Optional[str], seconds: float, token: Any, failed: bool) -> None:
        if not self._active:
            return
        try:
            step_s = 0.0
            if type(token) is tuple:  # (manual optimization)
                step_s, token = self._ledger.step_s - token[0], token[1]
            counted = self._ledger.user_section(name, parent, seconds, failed, step_s)  # (not in a validation)
            if counted and token is not None and self._device is not None:  # device time of a user section, read later
                self._device.section_ended(name, token)
        except Exception as err:  # noqa: BLE001 - a measurement never raises into the user's section
            self._record_failure("profile_section", err)

    def _checkpoint_written(self, seconds: float) -> None:
        """A checkpoint write or removal, from the strategy's CheckpointIO: carved out of the running section. Called
        in the ``finally`` of the write: a failure here is recorded, never raised over the write's own outcome."""
        if self._active:
            try:
                self._ledger.checkpoint(seconds)
            except Exception as err:  # noqa: BLE001
                self._record_failure("checkpoint write", err)

    def _fetch_started(self) -> None:
        """Lightning's fetch of the next training batch starts (its loop's ``_on_before_fetch``, ours for the fit)."""
        if self._active:
            t = now()
            try:
                self._fetches.started += 1
                self._fetches.running = True
                ledger = self._ledger
                if ledger.fetch_started(t) and (ledger.report_due or self._device is not None):
                    self._closed(None, report_later=True)  # (no report here: no trainer needed)
            except Exception as err:  # noqa: BLE001 - a measurement never raises into the user's fetch
                self._record_failure("dataloader fetch", err)
            self._overhead_s += now() - t
        self._fetch_marks.before()

    def _fetch_stopped(self) -> None:
        """The fetch returns (the loop's ``_on_after_fetch``)."""
        self._fetch_marks.after()
        if self._fetches.running:
            t = now()
            try:
                self._fetches.running = False
                self._fetches.returned += 1
                if self._active:
                    self._ledger.fetch_returned(t)
            except Exception as err:  # noqa: BLE001 - a measurement never raises into the user's fetch
                self._record_failure("dataloader fetch", err)
            self._overhead_s += now() - t

    def _batch_transfer(self) -> None:
        """Lightning's ``batch_to_device`` starts: in the training loop the ``transfer`` section runs from here to
        ``on_train_batch_start``; in a validation or the sanity check no section is running."""
        if self._active:
            start = now()
            try:
                ledger = self._ledger
                # (a close or a report: the transfer starts after; the test before the call is the call's own first)
                ran = (ledger.ending or self._report_waits) and self._own_work_between_batches(None, start)
                ledger.transfer(now() if ran else start)
            except Exception as err:  # noqa: BLE001 - a measurement never raises into the user's transfer
                self._record_failure("batch_to_device", err)
            self._overhead_s += now() - start

    def _own_work_between_batches(self, trainer: Optional[Trainer], t: float) -> bool:
        """At a transfer or a batch start, before the piece it starts: the iteration whose step ended closes at ``t``,
        a due report is made; True where either ran. After the transfer's first device mark a report would be in the
        copy's CUDA interval (an H100 read a 64 MB copy 1.80 ms against 1.24 ms alone); here it is between batches.
        ``trainer``: None at a transfer (found only where a report runs)."""
        ledger = self._ledger
        if ledger.current is None or not (ledger.ending or self._report_waits):  # (mostly: the fetch closed it)
            return False
        trainer = trainer or self._trainer()
        if ledger.ending:
            ledger.close(t)
            self._closed(trainer)
        else:
            self._report(trainer)
        return True

    # -- Lightning hooks -----------------------------------------------------------------------------------------
    @guarded
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            self._reset()
            return
        self._carry_or_reset(trainer, self._reset)
        self._start_run(trainer)
        self._world_size = int(trainer.world_size)
        if not self._is_enabled():
            self._disabled_reason = f"disabled (enabled={self.enabled}, {ENV_SWITCH}={os.environ.get(ENV_SWITCH)})"
            return
        self._active = True
        self._previous_sink = user_sections.set_sink(self)
        # what no hook shows, each given back by ``_restore``: checkpoint writes, the transfer, the workers, the fetch
        self._strategy = strategy = trainer.strategy
        self._checkpoint_io = timed_checkpoint_io.install(strategy, self._checkpoint_written)
        reason = timed_checkpoint_io.OWN_WRITER_REASON.format(strategy=type(strategy).__name__)
        self._checkpoint_reason = reason if self._checkpoint_io is None else None
        self._transfer = batch_transfer.install(strategy, self._batch_transfer)
        # (torch's fetchers wrapped before any worker of this fit forks)
        self._worker_timer = loader.WorkerTimer()
        if not self._worker_timer.install():
            self._workers_reason = self._worker_timer.reason
        self._worker_timer.start()  # (training's workers start, and prefetch, before on_train_start)
        if not self._ledger.gap_mode:  # (where the loop has no fetch marks: none seen, after 3 steps the gap instead)
            marks = fetch_marks.install(trainer, self._fetch_started, self._fetch_stopped, _FETCH_MARKS)
            self._fetch_marks = marks or self._fetch_marks

    def _restore(self) -> None:
        self._release_fetch_watch()
        batch_transfer.uninstall(self._transfer)
        self._transfer = None
        if self._worker_timer is not None:
            self._worker_timer.close()
            self._worker_timer = None
        if self._strategy is not None:
            timed_checkpoint_io.uninstall(self._strategy, self._checkpoint_io)
            self._checkpoint_io = self._strategy = None
        if user_sections.current_sink() is self:
            user_sections.set_sink(self._previous_sink)
        for handle in self._step_hooks:
            handle.remove()
        self._step_hooks, self._optimizer_rows, self._stepping = [], {}, False

    def _release_fetch_watch(self) -> None:
        """Gives the loop back its own fetch marks (``_fetch_marks`` is kept: a data fetcher may still call ours)."""
        fetch_marks.uninstall(self._fetch_marks)
        self._fetches.running = False
        self._ledger.fetch_resume = None

    @guarded
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._active:
            return
        self._stepped = False
        self._fetches.ends_without = None if self._ledger.gap_mode else 0
        self._loaders = trainer.train_dataloader
        manual = not pl_module.automatic_optimization
        self._batches_per_iteration = 1 if manual else max(1, int(trainer.accumulate_grad_batches or 1))
        on_cuda = trainer.strategy.root_device.type == "cuda"
        self._ledger.manual = manual  # (before the device marks: the step's own hooks are held only if automatic)
        if manual:
            self._hook_optimizer_steps(trainer.optimizers)
        self._use_clock(DeviceIntervalClock() if (self.device_timing and on_cuda) else None)
        self._ledger.train_start(manual, trainer.global_step, now())

    def _hook_optimizer_steps(self, optimizers: List[Any]) -> None:
        """Manual optimization: torch's step pre- and post-hooks on each optimizer time its ``opt.step()`` (no
        Lightning hook follows a step). The pre-hook fires before Lightning's closure runs, so clipping and the
        ``on_before_optimizer_step`` hooks are in the step, as under automatic optimization. An optimizer without them
        (not a ``torch.optim.Optimizer``) keeps its steps in ``training_step``, and the summary says so."""
        self._stepping = False
        several = len(optimizers) > 1
        for index, optimizer in enumerate(optimizers):
            if not (hasattr(optimizer, "register_step_pre_hook") and hasattr(optimizer, "register_step_post_hook")):
                self._steps_reason = (f"optimizer {index} ({type(optimizer).__name__}) has no torch step hooks: its"
                                      " steps are in training_step")
                continue
            if id(optimizer) in self._optimizer_rows:  # (the same optimizer twice: hooked once)
                continue
            self._optimizer_rows[id(optimizer)] = f"optimizer_step[{index}]" if several else None
            self._step_hooks.append(optimizer.register_step_pre_hook(self._optimizer_step_starts))
            self._step_hooks.append(optimizer.register_step_post_hook(self._optimizer_step_ends))

    # torch's optimizer step hooks (manual optimization): not in the automatic step path; a failure is recorded,
    # never raised into the user's step
    def _optimizer_step_starts(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._active and not self._stepping:
            t = now()
            try:
                resume = self._ledger.optimizer_started(t)
                if resume is not None:
                    self._stepping, self._step_resume = True, resume
            except Exception as err:  # noqa: BLE001
                self._record_failure("optimizer step", err)
            self._overhead_s += now() - t

    def _optimizer_step_ends(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._stepping:
            t = now()
            self._stepping = False
            try:
                self._ledger.optimizer_stepped(self._optimizer_rows.get(id(optimizer)), self._step_resume, t)
            except Exception as err:  # noqa: BLE001
                self._record_failure("optimizer step", err)
            self._overhead_s += now() - t

    @guarded
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._active:
            self._ledger.epoch_start(now())

    @guarded
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._active and self._ledger.epoch_end(now()):
            self._closed(trainer)
        if self._report_waits:
            self._report(trainer)
        self._flush_tables()  # the epoch's tables before what Lightning prints at its end (`Trainer.fit` stopped...)

    def _flush_tables(self) -> None:
        """The periodic tables still being printed: our own time, counted and told to IterationTimer as a report is."""
        spent = flush_tables()
        if spent:
            OWN_WORK.add(spent)
            self._overhead_s += spent

    # The hooks of the step path: each reads the clock and records one event in the ledger (batch start: forward;
    # zero_grad: optimizer_step; before backward: backward; after backward: other; optimizer step: optimizer_step;
    # batch end: between batches). Not @guarded, the same inline: a failure is recorded where it came from, never
    # raised into the step. The ledger holds the switches until its fold (``SectionLedger.apply_held``).
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._active:
            t = now()
            try:
                ledger = self._ledger
                # (a close or a report: the batch starts after; the test before the call is the call's own first)
                ran = (ledger.ending or self._report_waits) and self._own_work_between_batches(trainer, t)
                ledger.batch_start(now() if ran else t)
            except Exception as err:  # noqa: BLE001
                self._record_failure("on_train_batch_start", err)
            self._overhead_s += now() - t

    # The hooks inside the step (zero_grad, backward, after backward, optimizer step) switch the section under
    # automatic optimization. Each appends its switch to the ledger's held ones (``_held``), applied in order at its
    # fold (``SectionLedger.apply_held``, with the figure that keeps it); the append itself is not timed into
    # ``overhead_us_per_step``. Where a device mark may be due, at once. Under manual optimization only the backward
    # hooks switch (each ``manual_backward``; the optimizer steps are torch's step hooks), at once, back to the section
    # the backward interrupted (``training_step``, or ``optimizer_step`` for a closure's backward).
    def _step_switch(self, section: str, hook: str) -> None:
        t = now()
        try:
            ledger = self._ledger
            if not ledger.manual:
                ledger.switch(section, t)
            elif section == "backward":
                self._backward_resume = ledger.manual_switch(section, t) or "training_step"
            elif hook == "on_after_backward":
                ledger.manual_switch(self._backward_resume, t)
        except Exception as err:  # noqa: BLE001
            self._record_failure(hook, err)
        self._overhead_s += now() - t

    def on_before_zero_grad(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        if self._held is not None:
            self._held.append(("optimizer_step", now()))
        elif self._active:
            self._step_switch("optimizer_step", "on_before_zero_grad")

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Any) -> None:
        if self._held is not None:
            self._held.append(("backward", now()))
        elif self._active:
            self._step_switch("backward", "on_before_backward")

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._held is not None:
            self._held.append(("other", now()))
        elif self._active:
            self._step_switch("other", "on_after_backward")

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self._stepped = True  # this batch ends an iteration (automatic optimization calls this once per step)
        if self._held is not None:
            self._held.append(("optimizer_step", now()))
        elif self._active:
            self._step_switch("optimizer_step", "on_before_optimizer_step")

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._active:
            return
        t = now()
        try:
            # automatic optimization: the batch ends an iteration where an optimizer step was announced
            if self._ledger.manual:
                ends = True
                self._stepping = False  # (a step that raised, caught in the step, never returned)
            else:
                ends = self._stepped
            self._stepped = False
            if ends and self._fetches.ends_without is not None and self._fetches.falls_back():  # (first steps)
                self._fall_back_to_the_gap()
            self._ledger.batch_end(t, ends)
            if WAITING.count:
                self._drain_scalars(trainer)
        except Exception as err:  # noqa: BLE001
            self._record_failure("on_train_batch_end", err)
        self._overhead_s += now() - t

    def _fall_back_to_the_gap(self) -> None:
        """No fetch seen in a fit's first 3 iterations: data loading is the gap between batches from here on
        (``batch_gap``), with a warning and the reason in the summary."""
        self._ledger.gap_mode = True
        self._warn_once("fetch", fetch_marks.GAP_REASON)
        self._release_fetch_watch()  # (no fetch to watch for: the loop's own marks again)

    @guarded
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._worker_timer is not None:
            self._worker_timer.stop()  # (validation's workers, the sanity check's too, may have the training's ids)
        if self._active and not trainer.sanity_checking:
            self._ledger.validation_start(now())

    @guarded
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._worker_timer is not None:
            self._worker_timer.start()
        if self._active:
            self._ledger.validation_end(now())

    @guarded
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._flush_tables()  # the periodic tables before anything printed at the end
        if not self._active:
            gather_floats_then(trainer, [None] * len(AUTO_SECTIONS), lambda rows: None, self)  # every rank joins it
            return
        if self._ledger.train_end(now()):
            self._closed(trainer)
        if self._report_waits:
            self._report(trainer)
        self._read_workers()
        if self._device is not None:
            self._device.poll(flush=True)
        self._ledger.marker = self._held = None  # (the device's events are read: the final row is host time)
        self._ledger.fold()
        sections = self._ledger.sections
        means = [sections[n].host.mean if n in sections else None for n in AUTO_SECTIONS]
        gather_floats_then(trainer, means, self._set_ranks, self)

    def _read_workers(self) -> None:
        """The summary's ``workers`` block (``measure.sections.loader.workers_block``), at the loop's measured pace."""
        self._ledger.fold()
        self._workers, self._workers_reason = loader.workers_block(
            self._worker_timer, self._loaders, self._batches_per_iteration, self._ledger.iteration.host.mean,
            self._workers_reason)

    def _read_workers_at_the_stop(self, trainer: Trainer, exception: BaseException) -> None:
        """The ``workers`` block up to an exception (a worker's error, a crash), from what the workers timed so far;
        where there is none, why. A failure here is recorded: the summary of the failed fit still comes."""
        self._workers_at_stop = True
        try:
            if self._loaders is None:  # (training had not started: the loaders may be made already)
                self._loaders = getattr(trainer, "train_dataloader", None)
            self._read_workers()
            if self._workers is None:
                self._workers_reason = (f"the fit stopped ({type(exception).__name__}) before its training"
                                        " DataLoader was there: no workers' figures")
        except Exception as err:  # noqa: BLE001
            self._record_failure("workers at the exception", err)

    def _set_ranks(self, rows: Rows) -> None:
        self._ranks = {name: spread_across_ranks([r[i] for r in rows]) for i, name in enumerate(AUTO_SECTIONS)
                       if any(r[i] is not None for r in rows)}

    @guarded
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._active:
            self._ledger.fit_end(now())
        self._write_summary(trainer)
        if self._active and self.print_reports and trainer.is_global_zero:
            rank_zero_info(self.format_report())

    @guarded
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore()
        self._flush_summary(trainer)

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._flush_tables()
        if self._active and self._workers is None:  # (stopped before the end of training, where they are read)
            self._read_workers_at_the_stop(trainer, exception)
        self._restore()  # no teardown hook follows an exception
        self._write_summary(trainer, exception)

    # -- checkpointing -------------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """What resume needs so that one summary covers the whole run, as IterationTimer's does. A failure is recorded,
        never raised into the user's save: the checkpoint then holds no figures of this profiler."""
        try:
            return {**ledger_state(self._ledger, now()), "overhead_s": self._overhead_s}
        except Exception as err:  # noqa: BLE001
            self._record_failure("state_dict", err)
            return {}

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        saved = read_saved_ledger(state_dict)  # (all read and checked: nothing is assigned from a bad state)
        load_ledger(self._ledger, saved.iterations, saved.iteration_ms, saved.sections, saved.validation_runs,
                    saved.validation_s)
        self._overhead_s = saved.overhead_s
