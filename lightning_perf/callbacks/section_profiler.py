"""SectionProfiler: where each iteration's time goes (data loading, forward, backward, optimizer step,
checkpointing, user-named sections), with shares and advice, at no device sync."""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any, Deque, Dict, List, Optional

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from lightning_utilities.core import rank_zero as _rank_zero

from lightning_perf.callbacks import _batch_transfer as batch_transfer
from lightning_perf.callbacks import _timed_checkpoint_io as timed_checkpoint_io
from lightning_perf.callbacks._arguments import bad_argument, check_bool, check_positive_int
from lightning_perf.callbacks._base import PerfCallback, guarded, reads_state
from lightning_perf.callbacks._printer import PRINTER
from lightning_perf.callbacks._rank_gather import Rows, gather_floats_then, spread_across_ranks
from lightning_perf.callbacks._scalars import WAITING, log_scalars
from lightning_perf.callbacks._state import StateError, StateReader
from lightning_perf.measure import loader
from lightning_perf.measure import sections as user_sections
from lightning_perf.measure.clock import POLL_EVERY, DeviceIntervalClock, device_timed, next_device_timed, now
from lightning_perf.measure.stats import FOLD_EVERY, LogHistogram
from lightning_perf.measure.tail import OWN_WORK, SlowestPieces, median_per_iteration

#: The host work of Lightning's loop between two batches (batch-end hooks after this profiler's, logging, the
#: progress bar, the loop's own bookkeeping): its own section where ``data_loading`` is the fetch alone.
BETWEEN = "between_batches"
#: (checkpointing last: the ninth section made shares its histogram batches' phase with the iterations', see
#: ``_Samples``, and a checkpoint rarely comes every iteration)
AUTO_SECTIONS = ("data_loading", BETWEEN, "transfer", "forward", "backward", "optimizer_step", "other",
                 "checkpointing")
MANUAL_SECTIONS = ("data_loading", BETWEEN, "transfer", "training_step", "checkpointing", "other")
ENV_SWITCH = "LIGHTNING_PERF_PROFILE"
#: Where Lightning's training loop tells its profiler that a fetch starts and returns (its data fetcher calls them
#: around ``next()`` on the DataLoader's iterator): private names, the same from Lightning 2.2 to 2.6.
_FETCH_MARKS = ("_on_before_fetch", "_on_after_fetch")
BOUNDARIES = ("fetch", "batch_gap")
_MAX_CALLS_PER_ITERATION = 10_000
#: The slowest iterations kept with their sections (the summary's ``slowest_iterations``): more than
#: IterationTimer's default ``keep_slowest`` (10), so that its kept iterations are found here too.
SLOWEST_KEPT = 20
#: Raw times a section keeps before they go into its histogram (up to 7/8 more by its phase, see ``_Samples``; with
#: the 64 of a fold, at most 1024 floats, ~32 kB, for a section that runs once an iteration).
HISTOGRAM_EVERY = 512
#: The switch-only step hooks time their own cost (``overhead_us_per_step``) in one iteration of this many.
OVERHEAD_SAMPLE = 8
#: Events of the step path written down while taping (see ``_replay``): a switch is (section, t); the others
#: (code, ...) with these codes.
_TRANSFER, _BATCH_START, _STEP_END, _USER_SECTION, _CHECKPOINT, _FETCH = range(6)
#: The tape is replayed at the latest once it holds this many events (a long gradient accumulation, many user
#: sections, a large ``report_every_n_steps``): O(1) memory per step.
TAPE_LIMIT = 1024
#: A plain iteration's automatic pieces, in the order its switches make them (``_apply_plain_steps``).
_PLAIN_PIECES = ("data_loading", "transfer", "forward", "optimizer_step", "backward", "other")
#: The same with the fetch as data loading (``_apply_plain_fetch_steps``): seven pieces.
_PLAIN_FETCH_PIECES = ("data_loading", BETWEEN, "transfer", "forward", "optimizer_step", "backward", "other")
#: Where a replayed event came from, for ``measurement_failures`` (a switch: "step switch").
_EVENT_PLACES = {_TRANSFER: "batch_to_device", _BATCH_START: "on_train_batch_start", _STEP_END: "on_train_batch_end",
                 _USER_SECTION: "profile_section", _CHECKPOINT: "checkpoint write", _FETCH: "dataloader fetch"}

# Insight thresholds (documented in docs/section_profiler.md).
DATA_LOADING_PCT = 15.0
BACKWARD_OVER_FORWARD = 3.0
FORWARD_PCT = 60.0
OPTIMIZER_PCT = 20.0
CHECKPOINT_PCT = 10.0
HOST_OVER_DEVICE = 1.5
BETWEEN_BATCHES_PCT = 15.0
GAP_REASON = ("Lightning's training loop announced no dataloader fetch (its `_on_before_fetch` and `_on_after_fetch`,"
              " which tell its profiler of each fetch) in 3 iterations: data loading is now timed as the whole gap from the end of one"
              " batch to the start of the next (data_loading_boundary='batch_gap'), so it also holds Lightning's loop,"
              " logging, the progress bar and other callbacks' batch-end hooks: an upper bound of the wait for data.")
SYNC_REASON = ("no separate section: DDP all-reduces gradients inside backward, overlapped with it, so that time is"
               " part of `backward`; timing it apart would need a DDP communication hook installed on your model,"
               " which a measurement must not do. `ranks` shows each rank's sections: a straggler's data loading or"
               " forward is what the others wait for.")


def _report_table(step: int, iters: int, mean_ms: float, rows: List[tuple]) -> str:
    """The periodic report's table (built on the printer's thread: see ``_printer``): sections by total time, each
    user section under the one it ran in, as the final table (``_printed_rows``)."""
    table = {row[0]: {"kind": row[7], "parent": row[8], "count": row[1], "total_s": row[2], "row": row}
             for row in rows}
    labelled = _printed_rows(table)
    w = max([22] + [len(label) + 2 for label, _ in labelled])
    lines = [f"=== SectionProfiler report (step {step}, last {iters} iterations, {mean_ms:.2f} ms mean) ===",
             f"{'section':<{w}}{'count':>7}{'total s':>9}{'mean ms':>9}{'min ms':>9}{'max ms':>9}{'share':>8}"]
    for label, r in labelled:
        _, n, total, mean, low, high, pct = r["row"][:7]
        lines.append(f"{label:<{w}}{n:>7}{total:>9.3f}{mean:>9.2f}{low:>9.2f}{high:>9.2f}{pct or 0:>7.1f}%")
    return "\n".join(lines)


def _info_shown() -> bool:
    """Whether ``rank_zero_info`` would show an INFO line now: where Lightning's INFO logging is off (a script that
    silences it), the periodic table is not built either (~90 µs a report right after a step). The logger is read
    from the module each time (the standalone ``pytorch_lightning`` puts its own there when imported)."""
    try:
        return _rank_zero.log.isEnabledFor(logging.INFO)
    except Exception:  # noqa: BLE001 - not known: build it, rank_zero_info decides
        return True


class _Samples:
    """Host times of one section (or of whole iterations): the step path only appends the raw seconds. At a report
    and every ``FOLD_EVERY`` iterations they go into the report window's sum, min and max (C builtins); into the
    bounded histogram once ``limit`` of them wait, and before any figure is read: a few large batches cost a third
    less a value than one a report, right after a step. Memory stays bounded.

    ``limit`` is ``HISTOGRAM_EVERY`` plus an eighth of it per ``phase`` (0 to 7: the order in which a profiler made
    its samples). Sections that run once an iteration fill at one pace: with one limit all of them went into their
    histograms at one fold (1 to 2 ms on a 2-core CPU, every ~550 iterations), and that iteration, twice the median
    of a 1 ms loop, was a slow one of the profiler's own making; with eight limits their batches fall on different
    folds (each batch then starts cold: ~0.3 µs a step more on that loop)."""

    __slots__ = ("host", "raw", "seen", "limit", "window_s", "window_n", "window_min", "window_max")

    def __init__(self, phase: int = 0) -> None:
        self.host = LogHistogram()
        self.raw: List[float] = []
        self.seen = 0  # raw times already in the window's figures
        self.limit = HISTOGRAM_EVERY + HISTOGRAM_EVERY // 8 * (phase % 8)
        self.window_reset()

    def window_reset(self) -> None:
        self.window_s, self.window_n, self.window_min, self.window_max = 0.0, 0, float("inf"), 0.0

    def fold(self, histogram: bool = True) -> None:
        """The raw times not yet in the window's figures go there; into the histogram too where ``histogram`` is
        true or ``limit`` of them wait."""
        raw = self.raw
        if len(raw) > self.seen:
            new = raw[self.seen:] if self.seen else raw
            self.window_s += sum(new)
            self.window_n += len(new)
            low, high = min(new), max(new)
            if low < self.window_min:
                self.window_min = low
            if high > self.window_max:
                self.window_max = high
            self.seen = len(raw)
        if raw and (histogram or len(raw) >= self.limit):
            self.host.add_many(raw, 1000.0)
            self.raw, self.seen = [], 0


class _Section(_Samples):
    """Bounded statistics of one section: per-call host ms (histogram), device ms, calls left by exceptions."""

    __slots__ = ("kind", "parent", "device", "closed_by_exception", "runs")

    def __init__(self, kind: str, parent: Optional[str] = None, phase: int = 0) -> None:
        super().__init__(phase)
        self.kind, self.parent = kind, parent
        self.device = LogHistogram()
        self.closed_by_exception = 0
        self.runs = 0  # a user section: counted iterations it ran in, this process


def _printed_rows(table: Dict[str, Dict[str, Any]]) -> List[tuple]:
    """(label, row) in the printed table's order: the top-level sections by total time, each followed by the user
    sections that ran inside it (by total, indented one step per level, ``name (in parent)``). A section whose parent
    has no row of its own is listed at the top level."""
    present = {name: r for name, r in table.items() if r["count"]}
    children: Dict[Optional[str], List[str]] = {}
    for name, r in present.items():
        parent = r["parent"] if r["kind"] != "auto" and r["parent"] in present and r["parent"] != name else None
        children.setdefault(parent, []).append(name)
    rows: List[tuple] = []
    placed = set()

    def by_total(names: Any) -> List[str]:
        return sorted(names, key=lambda n: -(present[n]["total_s"] or 0))

    def place(name: str, depth: int) -> None:
        placed.add(name)
        r = present[name]
        label = name if r["kind"] == "auto" or r["parent"] is None else f"{name} (in {r['parent']})"
        rows.append(("  " * depth + label, r))
        for child in by_total(children.get(name, ())):
            if child not in placed:
                place(child, depth + 1)

    for name in by_total(children.get(None, ())):
        place(name, 0)
    for name in by_total(set(present) - placed):  # parents in a loop (not made by a fit; a hand-edited
        if name not in placed:  # checkpoint): listed, never lost
            place(name, 0)
    return rows


class SectionProfiler(PerfCallback):
    r"""Splits every training iteration into sections and reports count, total, mean, min, max, p50, p95 and share.

    An iteration runs from where the previous one closed to where the next one starts (its fetch by default, with
    ``data_loading_boundary="batch_gap"`` its transfer or ``on_train_batch_start``), or to an epoch end or the end
    of training: the work at its end (later callbacks' and the module's ``on_train_batch_end``, a checkpoint saved
    there, one saved after a validation) is its own. What the fit runs after its last iteration (the epoch-end and
    ``on_train_end`` hooks, the last checkpoint) is the summary's ``after_last_iteration`` row, outside the table.

    Automatic sections, from Lightning's hooks: ``data_loading`` (the loop's wait for the iteration's batch:
    Lightning's fetch; with ``"batch_gap"`` the gap from the end of the previous batch to this one's transfer, less
    what is carved out of it, which is the previous iteration's batch-end work), ``between_batches`` (the host work
    of Lightning's loop between two batches: later callbacks' and the module's batch-end hooks, the progress bar,
    logging, the loop's bookkeeping; only with the fetch), ``transfer`` (Lightning's ``batch_to_device``: the
    host-to-device copy, ``transfer_batch_to_device`` and ``on_after_batch_transfer``), ``forward``
    (``training_step``), ``backward``, ``optimizer_step`` (zero_grad and the step), ``checkpointing`` (checkpoint
    writes and removals, timed through the strategy's ``CheckpointIO`` plugin) and ``other`` (gradient clipping,
    epoch-end hooks: the rest). They add up to the iteration. Validation runs are timed on their own, outside the
    table. Under manual optimization the step is one ``training_step`` section.
    User sections (:class:`~lightning_perf.profile_section`) are carved out of the automatic section they ran in and
    reported with it as ``parent``; nested user sections name their user parent. On CUDA each section's device time
    comes from CUDA events read once complete; host time from ``perf_counter``. The first ``warmup_steps`` iterations
    are not counted.

    Args:
        enabled: profile at all; the environment variable ``LIGHTNING_PERF_PROFILE=0|1`` overrides it.
        report_every_n_steps: iterations between periodic reports (printed on rank 0 and logged).
        warmup_steps: iterations at the start of each fit left out.
        device_timing: also time sections with CUDA events when training on CUDA.
        data_loading_boundary: what ``data_loading`` is. ``"fetch"``: Lightning's dataloader fetch, from its start
            to its return, seen through the marks Lightning's training loop makes for its profiler there (private
            names; warns and falls back to ``"batch_gap"`` when no fetch is seen in 3 iterations); the rest
            of the gap between two batches is ``between_batches``. ``"batch_gap"``: the whole gap from the end of the
            previous batch (this profiler's ``on_train_batch_end``) to the transfer, through public hooks only; later
            callbacks' batch-end hooks, the progress bar, logger writes and LR schedulers are inside it (an upper
            bound of the wait), less the sections and checkpoint writes carved out of it.
        device_timing_every_n_iterations: time sections on the device in the first n iterations after the warm-up,
            then in one iteration of every n, and report the mean over those. Each section boundary costs a CUDA
            event record, and each interval an event query and read: ~75 µs of CUDA calls per iteration on an H100
            host. The other iterations tape their events as on the CPU (but the one before and the one after a timed
            iteration), so the fewer timed, the cheaper the step: one in 32 costs ~2.5 µs of CUDA calls a step.
            1 times every iteration.
        print_reports: print the periodic and the final table (rank 0); logging happens either way.
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.

    With DataLoader workers, the summary's ``workers`` block says what they spend per batch (their fetch and collate,
    timed inside them), beside the loop's wait.

    Logged metrics (every ``report_every_n_steps``, means over the window): ``time/<section>_ms`` and
    ``time_share/<section>_pct`` for each section, e.g. ``time/forward_ms``, ``time_share/data_loading_pct``,
    ``time/between_batches_ms``,
    ``time/transfer_ms``,
    ``time/ema_ms``; ``time/iteration_ms``.

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
    _transient = ("_checkpoint_io", "_strategy", "_fetch_loop", "_fetch_marks",
                  "_previous_sink", "_clock", "_worker_timer",
                  "_pending_user", "_transfer")

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
        self._sections: Dict[str, _Section] = {}
        self._manual = False
        self._current: Optional[str] = None
        self._t0 = 0.0
        self._carved = 0.0  # user and checkpoint time inside the current automatic piece
        self._piece: Dict[str, float] = {}  # this iteration's automatic time per section
        self._ahead: Dict[str, float] = {}  # the next iteration's, while this one's batch-end work runs (batch_gap)
        self._next_owner = False  # the running piece belongs to the next iteration (the wait for its batch)
        self._ending = False  # the iteration's step is done; it closes where the next one starts, or at an end
        self._final_row: Optional[Dict[str, Any]] = None  # the fit's work after its last iteration, at fit end
        self._final_calls = 0  # checkpoint writes and removals since the last iteration closed
        self._user_s = 0.0  # this iteration's top-level user-section time
        self._pending_user: Deque[Any] = deque()  # (name, start event, end event, counted) on CUDA
        self._iter_calls: List[Any] = []  # (name, seconds, failed) of user sections in this iteration
        self._iteration = _Samples()
        self._unfolded: List[Any] = []  # (pieces, user seconds, user calls, iteration - 1, batch-end carved) of
        # counted iterations not yet folded
        self._end_pieces: Dict[str, float] = {}  # carved after the step (batch-end hooks): IterationTimer's next
        self._end_s = 0.0  # their top-level time (nested user sections are inside their parents')
        self._step_offset: Optional[int] = None  # global step - iteration number, this fit (automatic optimization)
        self._slowest = SlowestPieces(SLOWEST_KEPT)  # this process's slowest iterations, as IterationTimer counts
        self._prev_end: Any = None  # the last folded iteration's batch-end carved time, and its number
        self._last_folded = -1
        self._iterations = 0
        self._fit_iterations = 0  # warm-up is per fit, also after a resume
        self._counted = self.warmup_steps == 0  # warmup_steps=0: the first iteration counts too
        self._stepped = False  # an optimizer step was announced since the last batch end
        self._validation_s = 0.0
        self._validation_runs = 0
        self._val_start: Optional[float] = None
        self._overhead_s = 0.0
        self._timing = True  # the switch-only step hooks time themselves in this iteration (1 in OVERHEAD_SAMPLE)
        self._taping = False  # the step path writes its events down, replayed in batches (see ``_replay``)
        self._tape: List[Any] = []
        self._tape_timing = True  # the taping hooks time themselves in this iteration (1 in OVERHEAD_SAMPLE)
        self._closes_due = 0  # ``_iterations`` once the tape is replayed, its iteration that ended included
        self._replay_due = False  # the next iteration's start replays the tape: a report falls due there
        self._own_in_replay = 0.0  # of the replay running, what its folds and reports told OWN_WORK already
        self._replaying = False
        self._run_end = 0  # the tape's events a run of plain iterations took so far (``_apply_plain_steps``)
        self._clock: Optional[DeviceIntervalClock] = None
        self._tape_ok = False  # this fit's step path may tape (``on_train_start``); on CUDA, where no mark is near
        self._fit_offset = 0  # ``_iterations`` - ``_fit_iterations`` in this fit
        self._marks_near = False  # a switch now can end or start a piece timed on the device (``_near_timed``)
        self._fetches = 0  # dataloader fetches Lightning announced through its profiler (boundary "fetch")
        self._gap_mode = self.data_loading_boundary == "batch_gap"  # data loading is the gap between batches
        self._fetch_t: Optional[float] = None  # where the fetch running now started (boundary "fetch")
        self._fetch_ends = 0  # fetches whose return was seen (the loop's ``_on_after_fetch``)
        self._fetch_resume: Optional[str] = None  # the section its end goes back to, where it started live
        self._ends_without_fetch: Optional[int] = None  # step ends without a fetch seen (fall back after 3)
        self._device_pieces: Dict[str, float] = {}  # device ms per section of the iteration being read
        self._device_iteration: Optional[int] = None
        self._ranks: Optional[Dict[str, Any]] = None
        self._previous_sink: Any = None
        self._disabled_reason: Optional[str] = None
        self._checkpoint_io: Any = None  # our TimedCheckpointIO around the strategy's, during a fit
        self._strategy: Any = None
        self._checkpoint_reason: Optional[str] = None
        self._fetch_loop: Any = None  # Lightning's training epoch loop, whose fetch marks are ours during a fit
        # (its own before and after, and whether each was an instance attribute before ours): kept across resets, for
        # a data fetcher that still holds ours
        self._fetch_marks: Any = getattr(self, "_fetch_marks", None)
        self._transfer: Any = None  # our mark on the strategy's batch_to_device, during a fit
        self._worker_timer: Optional[loader.WorkerTimer] = None  # the DataLoader workers' own time, during a fit
        self._loaders: Any = None  # trainer.train_dataloader at train start
        self._workers: Optional[Dict[str, Any]] = None  # the summary's ``workers`` block, made at train end
        self._workers_reason: Optional[str] = None
        self._batches_per_iteration = 1

    def _is_enabled(self) -> bool:
        value = os.environ.get(ENV_SWITCH)
        if value is None or value.strip() == "":
            return self.enabled
        if value.strip() in ("0", "1"):
            return value.strip() == "1"
        self._warn_once("env", f"{ENV_SWITCH}={value!r} is not 0 or 1; using enabled={self.enabled}.")
        return self.enabled

    def _section(self, name: str, kind: str = "auto", parent: Optional[str] = None) -> _Section:
        sec = self._sections.get(name)
        if sec is None:
            sec = self._sections[name] = _Section(kind, parent, len(self._sections) + 1)  # 0: iterations'
        return sec

    # -- the state machine ---------------------------------------------------------------------------------------
    def _switch(self, section: Optional[str], t: Optional[float] = None, start_next: Optional[bool] = None,
                sample: bool = False) -> None:
        """Ends the current automatic piece (minus carved-out time) and starts ``section``. The piece that ends
        belongs to the next iteration where ``_next_owner`` says so (the wait for the next batch, in batch_gap mode,
        while this iteration's batch-end work still runs); ``start_next``: the piece that starts does (default: the
        same owner as the piece that ends). ``sample``: from a switch-only step hook, which times itself here in one
        iteration of OVERHEAD_SAMPLE."""
        t = now() if t is None else t
        current = self._current
        if current is not None:
            piece = self._ahead if self._next_owner else self._piece
            piece[current] = piece.get(current, 0.0) + (t - self._t0 - self._carved)
        if self._marks_near and section != current:
            self._mark_device(current, section, self._next_owner if start_next is None else start_next)
        self._current, self._t0, self._carved = section, t, 0.0
        if start_next is not None:
            self._next_owner = start_next
        if sample and self._timing:
            self._overhead_s += OVERHEAD_SAMPLE * (now() - t)

    def _mark_device(self, current: Optional[str], section: Optional[str], start_next: bool) -> None:
        """The device side of a switch: CUDA events at the same boundaries as the host pieces, each interval labelled
        with the section and the iteration its host piece belongs to."""
        end_next = self._next_owner
        fit = self._fit_iterations
        if current is not None and self._device_timed(fit + end_next):  # a timed piece ends here
            # labelled with the iteration the piece belongs to: device time is summed per iteration, like host
            self._clock.mark(label=(current, self._iterations + end_next, fit + end_next >= self.warmup_steps))
            if section is not None and not self._device_timed(fit + start_next):
                self._clock.break_chain()  # the next iterations are not timed: no interval spans them
        elif section is not None and self._device_timed(fit + start_next):
            self._clock.mark(counted=False)  # a timed piece starts here (after validation, an untimed one)

    def _near_timed(self) -> bool:
        """Whether a switch can end or start a piece timed on the device: every piece belongs to this iteration or
        the next (``_mark_device``), so one of the two is timed. Kept in ``_marks_near`` where ``_fit_iterations`` or
        the clock changes (an iteration's close, train start; a run of plain iterations with a clock ends before a
        timed iteration comes near, so leaves it false): in the iterations not timed a switch skips
        ``_mark_device``, whose two checks cost ~0.5 µs a switch here."""
        if self._clock is None:
            return False
        fit = self._fit_iterations
        return self._device_timed(fit) or self._device_timed(fit + 1)

    def _device_timed(self, fit_iteration: int) -> bool:
        """Whether this iteration of the fit (0-based) is timed on the device (``measure.clock.device_timed``)."""
        return device_timed(fit_iteration, self.warmup_steps, self.device_timing_every_n_iterations)

    def _next_timed(self, fit_iteration: int) -> int:
        """The first iteration of the fit from ``fit_iteration`` on that ``_device_timed`` times."""
        return next_device_timed(fit_iteration, self.warmup_steps, self.device_timing_every_n_iterations)

    def section_started(self, name: str) -> Any:
        """Sink for profile_section: nothing to return on the host side (device: an event pair). While taping with a
        clock, the iteration is not timed (``_resume_taping``)."""
        if self._clock is None or self._taping or not self._device_timed(self._fit_iterations):
            return None
        return self._clock.stamp()

    def section_ended(self, name: str, parent: Optional[str], seconds: float, token: Any, failed: bool) -> None:
        try:
            if self._taping and token is None:
                tape = self._tape
                tape.append((_USER_SECTION, name, parent, seconds, failed))
                if len(tape) >= TAPE_LIMIT:
                    self._replay()
            elif self._taping:  # opened live in a timed iteration with its device events: the tape so far, then it
                self._replay()
                self._section_ended(name, parent, seconds, token, failed)
            elif self._active:
                self._section_ended(name, parent, seconds, token, failed)
        except Exception as err:  # noqa: BLE001 - recorded where it came from, as a replayed one is
            self._record_failure(_EVENT_PLACES[_USER_SECTION], err)

    def _section_ended(self, name: str, parent: Optional[str], seconds: float, token: Any, failed: bool) -> None:
        if self._ending:  # a batch-end hook's section, nested ones with their parents: IterationTimer's next
            self._end_pieces[name] = self._end_pieces.get(name, 0.0) + seconds
        if parent is None:
            self._carved += seconds
            self._user_s += seconds
            if self._ending:
                self._end_s += seconds
            parent = self._current
            if self._gap_mode and parent == "data_loading":
                parent = "other"  # a batch-end hook's section (it runs in the gap): not part of the fetch
        self._section(name, "user", parent)
        if len(self._iter_calls) < _MAX_CALLS_PER_ITERATION:  # joins the statistics with its iteration
            self._iter_calls.append((name, seconds, failed))
        if token is not None and self._clock is not None:  # device time of a user section, read later
            self._pending_user.append((name, token, self._clock.stamp(), self._counted))

    def _poll_device(self, flush: bool = False) -> None:
        if self._clock is None:
            return
        for label, ms in (self._clock.flush_labeled() if flush else self._clock.poll_labeled()):
            if label is None:
                continue
            name, iteration, counted = label
            if iteration != self._device_iteration:  # every piece of the previous iteration has been read
                self._close_device_iteration()
                self._device_iteration = iteration
            if counted:
                self._device_pieces[name] = self._device_pieces.get(name, 0.0) + ms
        if flush:
            if self._device_iteration is not None and self._device_iteration < self._iterations:
                self._close_device_iteration()
            self._device_pieces = {}  # the iteration still open at the end is not counted on the host either
        pending = self._pending_user
        while pending and (flush or pending[0][2].query()):
            name, start, end, counted = pending.popleft()
            if flush:
                end.synchronize()
            if counted:
                self._section(name, "user").device.add(float(start.elapsed_time(end)))

    def _close_device_iteration(self) -> None:
        """One device time per section per iteration, the sum of its pieces (optimizer_step and other are entered
        twice in an iteration: per piece they would come out at about half)."""
        for name, ms in self._device_pieces.items():
            if name in self._sections:
                self._sections[name].device.add(ms)
        self._device_pieces = {}

    def _fetch_started(self) -> None:
        """Lightning's fetch of the next training batch starts (its loop's ``_on_before_fetch``, ours for the fit)."""
        if self._active:
            t = now()
            try:
                self._fetches += 1
                self._fetch_t = t
                if not self._taping:
                    closes = self._ending
                    self._fetch_begins(t)
                    if closes and self._tape_ok and not self._marks_near:
                        self._resume_taping_after_close()  # the rest of the iteration it starts tapes
            except Exception as err:  # noqa: BLE001 - a measurement never raises into the user's fetch
                self._record_failure(_EVENT_PLACES[_FETCH], err)
            self._overhead_s += now() - t
        self._fetch_marks[0]()

    def _fetch_stopped(self) -> None:
        """The fetch returns (the loop's ``_on_after_fetch``): on the tape one event with both times."""
        self._fetch_marks[1]()
        if self._fetch_t is not None:
            t = now()
            try:
                start, self._fetch_t = self._fetch_t, None
                self._fetch_ends += 1
                resume, self._fetch_resume = self._fetch_resume, None
                if self._taping:
                    tape = self._tape
                    # begun live (a close that left the timed iterations behind): only its end is left to tape
                    tape.append((resume, t) if resume is not None else (_FETCH, start, t))
                    if len(tape) >= TAPE_LIMIT:
                        self._replay()
                elif resume is not None and self._active:
                    self._switch(resume, t)
            except Exception as err:  # noqa: BLE001 - a measurement never raises into the user's fetch
                self._record_failure(_EVENT_PLACES[_FETCH], err)
            self._overhead_s += now() - t

    def _fetch_begins(self, t: float) -> None:
        """Lightning's fetch of the next training batch starts (``data_loading`` until it returns): it closes the
        iteration whose step ended; a fetch inside a step (a ``dataloader_iter`` step) is carved out of the section it
        ran in. ``_fetch_resume``: the section its end goes back to (``between_batches`` outside a step)."""
        current = self._current
        if current is None:  # (not in the training loop: nothing runs to carve it from)
            self._fetch_resume = None
            return
        if self._ending:  # the fetch starts the next iteration: the one whose step ended closes here
            self._close_iteration(self._trainer(), "data_loading", t)
            self._fetch_resume = BETWEEN
            return
        self._fetch_resume = BETWEEN if current in (BETWEEN, "data_loading") else current
        self._switch("data_loading", t)

    def _checkpoint_written(self, seconds: float) -> None:
        """A checkpoint write or removal, from the strategy's CheckpointIO: carved out of the running section. Called
        in the ``finally`` of the write: a failure here is recorded, never raised over the write's own outcome."""
        try:
            if self._taping:
                tape = self._tape
                tape.append((_CHECKPOINT, seconds))
                if len(tape) >= TAPE_LIMIT:
                    self._replay()
            elif self._active:
                self._checkpoint_at(seconds)
        except Exception as err:  # noqa: BLE001 - recorded where it came from, as a replayed one is
            self._record_failure(_EVENT_PLACES[_CHECKPOINT], err)

    def _checkpoint_at(self, seconds: float) -> None:
        if self._current is not None:
            self._carved += seconds
            self._piece["checkpointing"] = self._piece.get("checkpointing", 0.0) + seconds
            if self._ending:
                self._end_pieces["checkpointing"] = self._end_pieces.get("checkpointing", 0.0) + seconds
                self._end_s += seconds
            self._final_calls += 1  # counted for the final row only: the table counts iterations with a write

    def _batch_transfer(self) -> None:
        """Lightning's ``batch_to_device`` starts: in the training loop the ``transfer`` section runs from here to
        ``on_train_batch_start`` (one boundary more per batch); in a validation or the sanity check no section is
        running and the transfer stays in evaluation."""
        try:
            if self._taping:
                t = now()
                tape = self._tape
                tape.append((_TRANSFER, t))
                self._overhead_s += now() - t
                if self._replay_due or len(tape) >= TAPE_LIMIT:  # (validation batches are transferred too)
                    self._replay_at_start()
            elif self._active and self._current is not None:
                t = now()
                self._transfer_at(t)  # (it closes the iteration whose step ended, or switches to transfer)
                if self._tape_ok and not self._marks_near:
                    self._resume_taping_after_close()
                self._overhead_s += now() - t
        except Exception as err:  # noqa: BLE001 - a measurement never raises into the user's transfer
            self._record_failure("batch_to_device", err)

    def _transfer_at(self, t: float) -> None:
        if self._current is not None:
            if self._ending:  # the next iteration starts: the one whose step ended closes, its batch-end work in
                self._close_iteration(self._trainer(), "transfer", t)
            else:
                self._switch("transfer", t)

    # -- the tape ------------------------------------------------------------------------------------------------
    def _replay(self) -> None:
        """Runs the events the step path wrote down, in order, with the times they were read at.

        While taping (automatic optimization, ``batch_gap`` boundary, no CUDA event near: ``_resume_taping``), each step
        hook only reads the clock and appends an event; the section switches, the iteration's close and its fold run
        here, in one batch, where a report falls due (the start of the iteration after the one that reaches it: where
        the close reports, as it would live), before anything reads or changes the state (every other hook, a read of a
        figure, a checkpoint's state), and at ``TAPE_LIMIT`` events. Run right after a step, a few lines of Python cost
        several times what they cost in a loop, and each step hook runs right after torch's work: one clock read and one
        append there instead of a switch."""
        tape = self._tape
        if not tape or self._replaying:  # (a fold inside the replay: the replay goes on)
            return
        self._replaying, done = True, 0
        start, self._own_in_replay = now(), 0.0
        switch = self._switch
        try:
            # the list itself, not a copy: a section another thread ends meanwhile is appended and replayed too
            while done < len(tape):
                event = tape[done]
                done += 1
                code = event[0]
                try:
                    if code.__class__ is str:
                        switch(code, event[1])
                    elif code == _STEP_END:
                        gap = self._gap_mode
                        switch("data_loading" if gap else BETWEEN, event[1], gap)
                        self._ending = True
                    elif code == _TRANSFER:
                        self._transfer_at(event[1])
                        if self._plain_step(tape, done):
                            self._run_end = done + 6
                            try:
                                self._apply_plain_steps(tape, done)
                            finally:  # (events counted before they are applied: never applied twice)
                                done = self._run_end
                    elif code == _BATCH_START:
                        self._batch_start_at(self._trainer(), event[1])
                    elif code == _USER_SECTION:
                        self._section_ended(event[1], event[2], event[3], None, event[4])
                    elif code == _FETCH:
                        self._fetch_begins(event[1])
                        resume, self._fetch_resume = self._fetch_resume, None
                        if resume is not None:
                            switch(resume, event[2])
                    else:
                        self._checkpoint_at(event[1])
                except Exception as err:  # noqa: BLE001 - as live: one event's failure is its own, the rest go on
                    self._record_failure(_EVENT_PLACES.get(code, "step switch"), err)
        finally:
            del tape[:done]  # (an interrupt: the events after the one it stopped wait for the next replay)
            self._replaying = False
            spent = now() - start
            self._overhead_s += spent
            # lightning_perf's own work in the iteration it runs in (IterationTimer may name it), the fold and
            # report inside it told already
            OWN_WORK.add(spent - self._own_in_replay)

    def _trainer(self) -> Optional[Trainer]:
        ref = getattr(self, "_trainer_ref", None)  # (None in a copy, none before setup: no report is made there)
        return ref() if ref is not None else None

    def _plain_step(self, tape: List[tuple], i: int) -> bool:
        """After a transfer's event: whether the next six events are a plain step's (its batch start, the four
        switches inside it, its end; no section, write or other event among them), which ``_apply_plain_step``
        works out at once. Anything else takes its own way, event by event."""
        if (len(tape) < i + 6 or self._ending or self._current != "transfer" or self._carved or self._manual
                or self._marks_near):  # (on CUDA: a device mark near, in this iteration or at its end)
            return False
        start, zero, backward, after, step, end = tape[i:i + 6]
        return (start[0] == _BATCH_START and zero[0] == "optimizer_step" and backward[0] == "backward"
                and after[0] == "other" and step[0] == "optimizer_step" and end[0] == _STEP_END)

    def _apply_plain_step(self, events: List[tuple]) -> None:
        """A plain step's switches as arithmetic on their times, with exactly the pieces, state and float operations
        ``_switch`` would give event by event (a Python call and a dozen attribute reads less for each)."""
        start, zero, backward, after, step, end = events
        t = self._t0
        piece = self._ahead if self._next_owner else self._piece
        get = piece.get
        piece["transfer"] = get("transfer", 0.0) + (start[1] - t)
        piece["forward"] = get("forward", 0.0) + (zero[1] - start[1])
        piece["optimizer_step"] = get("optimizer_step", 0.0) + (backward[1] - zero[1])
        piece["backward"] = get("backward", 0.0) + (after[1] - backward[1])
        piece["other"] = get("other", 0.0) + (step[1] - after[1])
        piece["optimizer_step"] += end[1] - step[1]
        gap = self._gap_mode
        self._current, self._t0, self._carved, self._next_owner = "data_loading" if gap else BETWEEN, end[1], 0.0, gap
        self._ending = True

    def _apply_plain_steps(self, tape: List[tuple], i: int) -> None:
        """The plain step at ``tape[i:i + 6]``, then each plain iteration that follows on the tape (its transfer and
        a plain step), as arithmetic: the close at each transfer and the step after it, with the figures, state and
        float operations that ``_close_iteration`` and ``_apply_plain_step`` would give one by one. A closed
        iteration waits for the fold as a tuple of the six pieces (``_PLAIN_PIECES``) instead of a dict. The run
        stops before anything else: an event of another kind, a close that reports, an iteration not counted.
        ``_run_end`` follows the events taken (before they are applied: an interrupt never applies one twice)."""
        self._apply_plain_step(tape[i:i + 6])
        i += 6
        if not self._gap_mode:
            self._apply_plain_fetch_steps(tape, i)
            return
        last, every = len(tape) - 7, self.report_every_n_steps
        iterations = self._iterations
        if (i > last or not self._counted or not (iterations + 1) % every or self._user_s or self._iter_calls
                or self._end_pieces or self._ahead):
            return  # (a section or carved time in the iteration the run would close first: its close goes alone)
        if self._clock is not None:  # each iteration closed and stepped here, and the next, not timed on the device
            first = self._fit_iterations + 2
            last = min(last, i + 7 * (self._next_timed(first) - first - 1))
        values, t0, unfolded = None, self._t0, self._unfolded
        try:
            while i <= last:
                # _plain_step's pattern after a transfer, inline: one shared function cost the replay ~0.5 µs a step
                transfer, start, zero, backward, after, step, end = tape[i:i + 7]
                if not (transfer[0] == _TRANSFER and start[0] == _BATCH_START and zero[0] == "optimizer_step"
                        and backward[0] == "backward" and after[0] == "other" and step[0] == "optimizer_step"
                        and end[0] == _STEP_END):
                    break
                self._run_end = i = i + 7
                closing = values if values is not None else self._piece
                t, z, s, e = transfer[1], zero[1], step[1], end[1]
                values = (t - t0, start[1] - t, z - start[1], (backward[1] - z) + (e - s), after[1] - backward[1],
                          s - after[1])
                t0 = e
                iterations += 1
                unfolded.append((closing, 0.0, (), iterations - 1, None))  # last: a closed iteration counts once
                if len(unfolded) >= FOLD_EVERY:
                    begin = now()
                    self._fold(histograms=False)
                    self._own_work(now() - begin)
                    unfolded = self._unfolded
                if not (iterations + 1) % every:
                    break  # that close reports: the events one by one
        finally:
            if values is not None:  # a literal, built before the writes: no call there where an interrupt could land
                piece = {"data_loading": values[0], "transfer": values[1], "forward": values[2],
                         "optimizer_step": values[3], "backward": values[4], "other": values[5]}
                polled = self._fit_iterations // POLL_EVERY
                self._fit_iterations += iterations - self._iterations
                self._iterations, self._piece, self._t0 = iterations, piece, t0
                self._final_calls, self._timing = 0, not iterations % OVERHEAD_SAMPLE
                # on CUDA the device's events are read where the closes one by one would read them (``_marks_near``
                # stays false: the run ends where a timed iteration comes near)
                if self._clock is not None and self._fit_iterations // POLL_EVERY != polled:
                    self._poll_device()

    def _apply_plain_fetch_steps(self, tape: List[tuple], i: int) -> None:
        """``_apply_plain_steps``' run with the fetch as data loading: after a plain step, each plain iteration that
        follows on the tape (its fetch, transfer and plain step: eight events) as arithmetic. The iteration whose step
        ended takes the gap up to the fetch as ``between_batches`` and closes at the fetch's start; the next one's
        ``data_loading`` is the fetch, its ``between_batches`` the loop's work from the fetch to the transfer and, at
        its close, from its step's end to the next fetch. A closed iteration waits for the fold as a tuple of its
        seven pieces (``_PLAIN_FETCH_PIECES``), with the float operations the switches one by one make."""
        last, every = len(tape) - 8, self.report_every_n_steps
        iterations = self._iterations
        if (i > last or not self._counted or not (iterations + 1) % every or self._user_s or self._iter_calls
                or self._end_pieces or self._ahead or self._current != BETWEEN):
            return
        if self._clock is not None:  # each iteration closed and stepped here, and the next, not timed on the device
            first = self._fit_iterations + 2
            last = min(last, i + 8 * (self._next_timed(first) - first - 1))
        head, t0, unfolded, piece = None, self._t0, self._unfolded, self._piece
        try:
            while i <= last:
                fetch, transfer, start, zero, backward, after, step, end = tape[i:i + 8]
                if not (fetch[0] == _FETCH and transfer[0] == _TRANSFER and start[0] == _BATCH_START
                        and zero[0] == "optimizer_step" and backward[0] == "backward" and after[0] == "other"
                        and step[0] == "optimizer_step" and end[0] == _STEP_END):
                    break
                self._run_end = i = i + 8
                begin = fetch[1]
                if head is None:
                    piece[BETWEEN] = piece.get(BETWEEN, 0.0) + (begin - t0)
                    closing: Any = piece
                else:
                    closing = head[:1] + (head[1] + (begin - t0),) + head[2:]
                t, z, s, e = transfer[1], zero[1], step[1], end[1]
                head = (fetch[2] - begin, t - fetch[2], start[1] - t, z - start[1], (backward[1] - z) + (e - s),
                        after[1] - backward[1], s - after[1])
                t0 = e
                iterations += 1
                unfolded.append((closing, 0.0, (), iterations - 1, None))
                if len(unfolded) >= FOLD_EVERY:
                    begun = now()
                    self._fold(histograms=False)
                    self._own_work(now() - begun)
                    unfolded = self._unfolded
                if not (iterations + 1) % every:
                    break  # that close reports: the events one by one
        finally:
            if head is not None:
                piece = {"data_loading": head[0], BETWEEN: head[1], "transfer": head[2], "forward": head[3],
                         "optimizer_step": head[4], "backward": head[5], "other": head[6]}
                polled = self._fit_iterations // POLL_EVERY
                self._fit_iterations += iterations - self._iterations
                self._iterations, self._piece, self._t0 = iterations, piece, t0
                self._final_calls, self._timing = 0, not iterations % OVERHEAD_SAMPLE
                if self._clock is not None and self._fit_iterations // POLL_EVERY != polled:
                    self._poll_device()

    def _replay_at_start(self) -> None:
        """At an iteration's first boundary (a transfer, or the batch start without one): where a report that fell
        due is made. The flag stays up until the due iteration has closed: a validation after the due step
        transfers its batches first, and the iteration closes at the next training batch's transfer."""
        due = self._replay_due
        self._replay()
        if due:
            self._replay_due = self._ending

    def _own_work(self, seconds: float) -> None:
        OWN_WORK.add(seconds)
        self._own_in_replay += seconds

    def _stop_taping(self) -> None:
        """At the fit's end (or an exception): the tape replayed, no more taping in this fit."""
        try:
            self._replay()
        finally:
            self._taping = self._tape_ok = False

    # On CUDA the boundaries of the iterations timed on the device record events live (``_mark_device``); the others
    # tape as on the CPU. A batch end decides for what follows it up to the next batch end: the events of the next
    # iteration (a switch there ends or starts a piece of this iteration or the next) tape where neither this
    # iteration nor the next is timed (``_marks_near`` false, kept at each close), and the user sections among them
    # take no device events; a live close that leaves the timed iterations behind tapes the rest of the iteration it
    # starts (``_resume_taping_after_close``). A taped batch end whose next iteration is timed replays the tape at
    # once, itself included: its mark (a timed piece starts there) is recorded before any more work reaches the
    # device, so at the same point of the stream as live; from there the step path runs live.
    def _use_clock(self, clock: Optional[DeviceIntervalClock]) -> None:
        """At train start, before the first batch: the device clock of this fit (or none), and whether the step path
        tapes from the start."""
        self._clock = clock
        self._marks_near = self._near_timed()
        self._taping = self._tape_ok and not self._marks_near

    def _resume_taping(self) -> None:
        """At a live batch end that ended an iteration (``_marks_near`` false): the events from here on tape, counted
        as the taped batch ends count them (the close due of the iteration that ended, included)."""
        self._taping = True
        due = self._closes_due = self._iterations + 1
        self._replay_due = not due % self.report_every_n_steps
        self._tape_timing = not due % OVERHEAD_SAMPLE

    def _resume_taping_after_close(self) -> None:
        """At a live close (a transfer, or a batch start without one) that left the iterations timed on the device
        behind (``_marks_near`` false): the rest of the iteration that starts here tapes, its batch end counting the
        close due of this iteration, not one more. Without it an iteration after a timed one ran live to its batch
        end: ~2.3 live iterations in each 32 on CUDA instead of ~1.3."""
        self._taping = True
        due = self._closes_due = self._iterations
        self._replay_due = False  # (this close reported, where one was due)
        self._tape_timing = not due % OVERHEAD_SAMPLE

    def _pause_taping(self) -> None:
        """At a taped batch end whose next iteration is timed on the device: the tape replays now, this batch end's
        switch and its mark included; the step path goes on live."""
        try:
            self._replay()
        finally:
            self._taping = self._replay_due = False

    # -- Lightning hooks -----------------------------------------------------------------------------------------
    @guarded
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            self._reset()
            return
        self._carry_or_reset(trainer, self._reset)
        self._start_run(trainer)
        if not self._is_enabled():
            self._disabled_reason = f"disabled (enabled={self.enabled}, {ENV_SWITCH}={os.environ.get(ENV_SWITCH)})"
            return
        self._active = True
        self._previous_sink = user_sections.set_sink(self)
        # Checkpoint writes are timed by a CheckpointIO plugin around the strategy's own (public plugin interface);
        # with boundary "fetch", the fetch by marks in front of those the training loop makes for its profiler.
        # Both are given back at teardown, or after an exception.
        self._strategy = trainer.strategy
        self._checkpoint_io = timed_checkpoint_io.install(trainer.strategy, self._checkpoint_written)
        self._checkpoint_reason = (None if self._checkpoint_io is not None else
                                   timed_checkpoint_io.OWN_WRITER_REASON.format(strategy=type(trainer.strategy).__name__))
        self._transfer = batch_transfer.install(trainer.strategy, self._batch_transfer)
        # the workers' own fetch and collate time: torch's fetchers wrapped before any worker of this fit forks
        self._worker_timer = loader.WorkerTimer()
        if not self._worker_timer.install():
            self._workers_reason = self._worker_timer.reason
        self._worker_timer.start()  # (training's workers start, and prefetch, before on_train_start)
        if not self._gap_mode:
            self._watch_fetches(trainer)

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

    def _watch_fetches(self, trainer: Trainer) -> None:
        """Puts ours in front of the marks Lightning's training loop makes where a fetch starts and returns, on the
        loop instance for the fit (its data fetcher takes them at each epoch's start, after this setup). Where they
        are not there, no fetch is seen, and after 3 steps data loading falls back to the gap between batches."""
        loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
        marks = [getattr(loop, name, None) for name in _FETCH_MARKS]
        if not all(callable(mark) for mark in marks):
            return
        self._fetch_loop = loop
        self._fetch_marks = (*marks, *(name in vars(loop) for name in _FETCH_MARKS))
        loop._on_before_fetch, loop._on_after_fetch = self._fetch_started, self._fetch_stopped

    def _release_fetch_watch(self) -> None:
        """Gives the loop back its own fetch marks (or what another tool had put on the instance); a data fetcher that
        still holds ours (until the next epoch's start) goes on calling theirs through ours."""
        loop = self._fetch_loop
        if loop is not None:
            before, after, had_before, had_after = self._fetch_marks
            own = vars(loop)
            for name, ours, theirs, had in (("_on_before_fetch", self._fetch_started, before, had_before),
                                            ("_on_after_fetch", self._fetch_stopped, after, had_after)):
                if own.get(name) == ours:
                    if had:
                        setattr(loop, name, theirs)
                    else:
                        delattr(loop, name)
            self._fetch_loop = None
        self._fetch_t = self._fetch_resume = None

    @guarded
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._active:
            return
        self._manual = not pl_module.automatic_optimization
        for name in (MANUAL_SECTIONS if self._manual else AUTO_SECTIONS):
            if name != BETWEEN or not self._gap_mode:  # (with batch_gap the loop's work is in data_loading)
                self._section(name)
        self._stepped = False
        # the slowest iterations are joined to IterationTimer's by global step (it counts its iterations from its
        # own checkpoint state, which a SectionProfiler added at a resume does not have): under automatic
        # optimization the step at an iteration's end is its number plus this fit's offset
        self._step_offset = None if self._manual else trainer.global_step - self._iterations
        on_cuda = trainer.strategy.root_device.type == "cuda"
        self._fit_offset = self._iterations - self._fit_iterations
        # the step path tapes its events where nothing live depends on them: one iteration a batch-or-accumulation
        # known from on_before_optimizer_step (the fetch, taped too, closes it), and on CUDA no event to record at the
        # boundaries near (``_use_clock``, ``_resume_taping``)
        self._tape_ok = not self._manual
        self._ends_without_fetch = None if self._gap_mode else 0
        self._closes_due, self._tape_timing = self._iterations, True
        self._use_clock(DeviceIntervalClock() if (self.device_timing and on_cuda) else None)
        self._loaders = trainer.train_dataloader
        self._batches_per_iteration = 1 if self._manual else max(1, int(trainer.accumulate_grad_batches or 1))
        self._switch("other")

    def _between_batches(self) -> str:
        """The section that runs from the end of a batch (or a validation) until the next batch starts: with the
        fetch as data loading, the loop's own work (the fetch is carved out of it where it comes)."""
        return "data_loading" if self._gap_mode else BETWEEN

    @guarded
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._replay()
        # what follows is the new epoch's dataloader iterator (workers starting) and its first fetch: the wait for the
        # first batch
        if self._active:
            self._switch("data_loading")

    @guarded
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._replay()
        if not self._active or self._current is None:
            return
        if self._ending:  # the epoch's last iteration closes; epoch-end hooks go to the next one (or the final row)
            self._close_iteration(trainer, "other", now())
        elif self._current in ("data_loading", BETWEEN):
            self._switch("other")  # epoch-end hooks, epoch-level logging: not the loop between two batches
        self._flush_tables()  # the epoch's tables before what Lightning prints at its end (`Trainer.fit` stopped...)

    def _flush_tables(self) -> None:
        """Waits for the periodic tables still being printed (see ``_printer``), if any: lightning_perf's own time,
        in ``overhead_us_per_step`` and told to IterationTimer, as a report is."""
        if PRINTER.pending():
            start = now()
            PRINTER.flush()
            spent = now() - start
            OWN_WORK.add(spent)
            self._overhead_s += spent

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        try:
            if self._taping:
                t = now()
                tape = self._tape
                tape.append((_BATCH_START, t))
                self._overhead_s += now() - t
                if self._replay_due or len(tape) >= TAPE_LIMIT:
                    self._replay_at_start()
            elif self._active:
                t = now()
                closes = self._ending
                self._batch_start_at(trainer, t)
                if closes and self._tape_ok and not self._marks_near:  # (a batch start that closed the iteration)
                    self._resume_taping_after_close()
                self._overhead_s += now() - t
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_train_batch_start", err)

    def _batch_start_at(self, trainer: Optional[Trainer], t: float) -> None:
        section = "training_step" if self._manual else "forward"
        if self._ending:  # no transfer or fetch was seen (a dataloader_iter step): the iteration closes here
            self._close_iteration(trainer, section, t)
        else:
            self._switch(section, t)

    # The four hooks inside the step only switch sections (while taping: append the switch). Their own time is read
    # in one iteration of OVERHEAD_SAMPLE (``_timing``, set where an iteration closes; ``_tape_timing``, set at the
    # batch end) and counted that many times: a clock read fewer a hook in the others. Inline, not one shared method:
    # the frame more cost ~0.45 µs a hook right after torch's work (--hooks-only SectionProfiler: 19.0 against 17.2).
    def on_before_zero_grad(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        try:
            if self._taping:
                t = now()
                self._tape.append(("optimizer_step", t))
                if self._tape_timing:
                    self._overhead_s += OVERHEAD_SAMPLE * (now() - t)
            elif self._active and not self._manual:
                self._switch("optimizer_step", None, None, True)
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_before_zero_grad", err)

    def on_before_backward(self, trainer: Trainer, pl_module: LightningModule, loss: Any) -> None:
        try:
            if self._taping:
                t = now()
                self._tape.append(("backward", t))
                if self._tape_timing:
                    self._overhead_s += OVERHEAD_SAMPLE * (now() - t)
            elif self._active and not self._manual:
                self._switch("backward", None, None, True)
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_before_backward", err)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        try:
            if self._taping:
                t = now()
                self._tape.append(("other", t))
                if self._tape_timing:
                    self._overhead_s += OVERHEAD_SAMPLE * (now() - t)
            elif self._active and not self._manual:
                self._switch("other", None, None, True)
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_after_backward", err)

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        try:
            self._stepped = True  # this batch ends an iteration (automatic optimization calls this once per step)
            if self._taping:
                t = now()
                self._tape.append(("optimizer_step", t))
                if self._tape_timing:
                    self._overhead_s += OVERHEAD_SAMPLE * (now() - t)
            elif self._active and not self._manual:
                self._switch("optimizer_step", None, None, True)
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_before_optimizer_step", err)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        try:
            if self._taping:
                t = now()
                tape = self._tape
                if self._stepped:
                    self._stepped = False
                    if self._ends_without_fetch is not None:  # (the first steps of a fit: was a fetch seen?)
                        self._fetch_seen_or_fall_back()
                    tape.append((_STEP_END, t))
                    due = self._closes_due = self._closes_due + 1
                    if not due % self.report_every_n_steps:
                        self._replay_due = True
                    self._tape_timing = not due % OVERHEAD_SAMPLE
                    if self._clock is not None and self._device_timed(due - self._fit_offset):
                        self._overhead_s += now() - t
                        self._pause_taping()  # the next iteration is timed on the device (the replay counts itself)
                        t = now()
                else:  # accumulating: the iteration goes on with the next batch
                    tape.append(("data_loading" if self._gap_mode else BETWEEN, t))
                if WAITING.count:
                    self._drain_scalars(trainer)
                self._overhead_s += now() - t
                return
            if not self._active:
                return
            t = now()
            if not self._manual:
                if not self._stepped:  # accumulating: the iteration goes on with the next batch
                    self._switch(self._between_batches(), t)
                    self._overhead_s += now() - t
                    return
                self._stepped = False
            if self._ends_without_fetch is not None:  # (the first steps of a fit: was a fetch seen?)
                self._fetch_seen_or_fall_back()
            # The step is done, the iteration is not: batch-end work (later callbacks' and the module's batch-end hooks,
            # a checkpoint save, a validation's checkpoint) belongs to it. It closes where the next iteration starts. In
            # batch_gap mode the gap now running is the wait for the next batch: it belongs to the next iteration, and
            # what is carved out of it (sections, checkpoint writes) to this one.
            gap = self._gap_mode
            self._switch("data_loading" if gap else BETWEEN, t, gap)  # _between_batches, inline on the step path
            self._ending = True
            if self._tape_ok and not self._marks_near:  # (on CUDA: no timed piece in this iteration or the next)
                self._resume_taping()
            if WAITING.count:
                self._drain_scalars(trainer)
            self._overhead_s += now() - t
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_train_batch_end", err)

    def _fetch_seen_or_fall_back(self) -> None:
        """At a step's end in the first iterations of a fit: once a fetch was announced, nothing more to check; after
        3 steps without one (a Lightning release that renames the announcement, a loop of its own), data loading is
        the gap between batches from here on (``batch_gap``), with a warning and the reason in the summary. A fetch
        whose start is announced and not its return counts as none."""
        if self._gap_mode or self._fetch_ends:
            self._ends_without_fetch = None
            return
        self._ends_without_fetch += 1
        if self._ends_without_fetch >= 3:
            self._replay()  # (the events so far with the labels they were taped under)
            self._gap_mode, self._ends_without_fetch = True, None
            self._warn_once("fetch", GAP_REASON)
            self._release_fetch_watch()  # (no fetch to watch for: the loop's own marks again)

    def _close_iteration(self, trainer: Optional[Trainer], section: str, t: float) -> None:
        """The iteration whose step ended closes at ``t``, where ``section`` of the next one starts: its pieces go
        into the statistics; what was timed ahead for the next one (the wait for its batch) starts that one's."""
        self._switch(section, t, start_next=True)
        self._ending = False
        counted = self._counted
        if counted:  # the pieces join the statistics at the next fold, in one batch (one append a step here)
            unfolded = self._unfolded
            unfolded.append((self._piece, self._user_s, self._iter_calls or (), self._iterations,
                             (self._end_s, self._end_pieces) if self._end_pieces else None))
            if len(unfolded) >= FOLD_EVERY:
                start = now()
                self._fold(histograms=False)
                self._own_work(now() - start)
        elif not self._unfolded:  # a warm-up iteration's batch-end work is the first counted one's
            self._prev_end = (self._end_s, self._end_pieces) if self._end_pieces else None
            self._last_folded = self._iterations + 1
        self._piece, self._ahead, self._user_s, self._next_owner = self._ahead, {}, 0.0, False
        self._final_calls = 0
        if self._iter_calls:
            self._iter_calls = []
        if self._end_pieces:
            self._end_pieces, self._end_s = {}, 0.0
        self._iterations += 1
        self._fit_iterations += 1
        if self._clock is not None:
            self._marks_near = self._near_timed()
        self._counted = self._fit_iterations >= self.warmup_steps
        self._timing = not self._iterations % OVERHEAD_SAMPLE
        if self._clock is not None and self._fit_iterations % POLL_EVERY == 0:  # device events read in batches
            self._poll_device()
        if counted and self._iterations % self.report_every_n_steps == 0 and trainer is not None:
            start = now()
            self._fold(histograms=False)
            if self._iteration.window_n:
                self._report_window(trainer)
            self._own_work(now() - start)  # in the iteration that starts here: IterationTimer may name it

    def _fold(self, histograms: bool = True) -> None:
        """The iterations' pieces into raw host times, and those into the window sums and the histograms: before
        every read of a figure. ``histograms=False`` (at a report, on the step path): the histograms only take the
        raw times of a section where its ``limit`` wait."""
        self._replay()
        if self._unfolded:
            sections, iteration, slowest = self._sections, self._iteration.raw, self._slowest
            prev_end, last, offset = self._prev_end, self._last_folded, self._step_offset
            floor = slowest.floor
            keys: Optional[tuple] = None  # the sections of a run of iterations that had the same ones, in order
            rows: List[Any] = []  # their pieces' values, one tuple an iteration: appended per section by column
            for piece, user_s, calls, before, end in self._unfolded:
                plain = piece.__class__ is tuple  # a plain iteration's pieces (``_apply_plain_steps``)
                plain_names = _PLAIN_FETCH_PIECES if plain and len(piece) == 7 else _PLAIN_PIECES
                values = piece if plain else tuple(piece.values())
                total = sum(values) + user_s
                if total <= 0:
                    continue
                iteration.append(total)
                # As IterationTimer counts it: what ran carved out after the previous step (its batch-end hooks'
                # sections, a checkpoint it wrote) in, this one's batch-end carving out
                aligned = total
                if end:
                    aligned -= end[0]
                carried = prev_end if last == before else None
                if carried:
                    aligned += carried[0]
                if aligned > floor:
                    slowest.offer(aligned, before + 1, None if offset is None else before + 1 + offset,
                                  dict(zip(plain_names, piece)) if plain else piece, calls,
                                  end[1] if end else None, carried[1] if carried else None)
                    floor = slowest.floor
                prev_end, last = end, before + 1
                names = plain_names if plain else tuple(piece)
                if names != keys:
                    self._fold_columns(keys, rows)
                    keys, rows = names, []
                rows.append(values)
                if calls:
                    if any(call[0] in names for call in calls):  # a user section named like a piece: in order
                        self._fold_columns(keys, rows)
                        rows = []
                    for name, seconds, failed in calls:
                        sec = sections[name]
                        sec.raw.append(seconds)
                        sec.closed_by_exception += failed
                    for name in {call[0] for call in calls}:
                        sections[name].runs += 1
            self._fold_columns(keys, rows)
            self._unfolded = []
            self._prev_end, self._last_folded = prev_end, last
        self._iteration.fold(histograms)
        for sec in self._sections.values():
            sec.fold(histograms)

    def _fold_columns(self, names: Optional[tuple], rows: List[tuple]) -> None:
        """Iterations whose pieces had the same sections in the same order: each section's times, a column of
        ``rows``, go to its raw list in one extend."""
        if rows:
            sections = self._sections
            for name, column in zip(names, zip(*rows)):
                (sections.get(name) or self._section(name)).raw.extend(column)

    def _report_window(self, trainer: Trainer) -> None:
        iters, seconds = self._iteration.window_n, self._iteration.window_s
        metrics = {"time/iteration_ms": 1000.0 * seconds / iters}
        rows = []
        for name, sec in self._sections.items():
            if not sec.window_n and not sec.host.count and not sec.raw:  # not run yet in this run (no checkpoint
                continue  # so far): no point
            metrics[f"time/{name}_ms"] = 1000.0 * sec.window_s / iters
            metrics[f"time_share/{name}_pct"] = 100.0 * sec.window_s / seconds if seconds > 0 else None
            if sec.window_n:
                rows.append((name, sec.window_n, sec.window_s, 1000.0 * sec.window_s / sec.window_n,
                             1000.0 * sec.window_min, 1000.0 * sec.window_max, metrics[f"time_share/{name}_pct"],
                             sec.kind, sec.parent))
            sec.window_reset()
        self._iteration.window_reset()
        log_scalars(trainer, metrics)
        if self.print_reports and trainer.is_global_zero and _info_shown():
            PRINTER.put(_report_table, (trainer.global_step, iters, metrics["time/iteration_ms"], rows),
                        self._report_failed)

    def _report_failed(self, err: BaseException) -> None:
        self._record_failure("report table", err)

    @guarded
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._replay()
        if self._worker_timer is not None:
            self._worker_timer.stop()  # (validation's workers, the sanity check's too, may have the training's ids)
        if self._active and not trainer.sanity_checking and self._current is not None:
            t = now()
            self._switch(None, t)  # the piece so far stays with its section; validation is off the table
            self._val_start = t

    @guarded
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._replay()
        if self._worker_timer is not None:
            self._worker_timer.start()
        if self._active and self._val_start is not None:
            t = now()
            self._validation_s += t - self._val_start
            self._validation_runs += 1
            self._val_start = None
            self._switch(self._between_batches(), t)

    @guarded
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_taping()
        self._flush_tables()  # the periodic tables before anything printed at the end
        if not self._active:
            gather_floats_then(trainer, [None] * len(AUTO_SECTIONS), lambda rows: None, self)  # every rank joins it
            return
        if self._ending:  # the last iteration closes; what follows is the fit's final work, up to on_fit_end
            self._close_iteration(trainer, "other", now())
        self._read_workers()
        self._poll_device(flush=True)
        self._fold()
        means = [self._sections[n].host.mean if n in self._sections else None for n in AUTO_SECTIONS]
        gather_floats_then(trainer, means, self._set_ranks, self)

    def _read_workers(self) -> None:
        """The summary's ``workers`` block: what the training DataLoader's workers spent making each batch (their
        fetch and collate, timed inside them), beside the main process's wait (``data_loading``)."""
        timer, self._workers = self._worker_timer, None
        workers = loader.num_workers(self._loaders)
        if workers is None:
            self._workers_reason = "no DataLoader in trainer.train_dataloader"
            return
        row: Dict[str, Any] = {"num_workers": workers, "batches": None, "busy_ms_per_batch": None, "busy_pct": None,
                               "cpu_count": loader.cpu_count()}
        self._workers = row
        if workers == 0:
            self._workers_reason = ("num_workers=0: batches are made in the main process, and its wait for them is"
                                    " data_loading")
            return
        if timer is None or self._workers_reason is not None:
            return
        timer.stop()
        busy, batches = timer.totals()
        if not batches:
            self._workers_reason = (
                "no batch made by a worker was timed: workers started by spawn or forkserver do not inherit the timer"
                " (only forked workers do)" if not loader.uses_fork(self._loaders) else
                "no batch made by a worker was timed")
            return
        row["batches"] = batches
        row["busy_ms_per_batch"] = per_batch = 1000.0 * busy / batches
        # at the loop's measured pace (counted iterations, warm-up left out): the share of the workers' time that
        # making its batches takes; 100% or more: they are saturated, the loop cannot go faster than they make batches
        self._fold()
        iteration_ms = self._iteration.host.mean
        if iteration_ms:
            row["busy_pct"] = 100.0 * per_batch * self._batches_per_iteration / (workers * iteration_ms)

    def _close_final(self, t: float) -> None:
        """The fit's work after its last iteration closed (epoch-end hooks, the last checkpoint, every
        ``on_train_end`` hook, Lightning's teardown), from that close to ``on_fit_end``, in its own row: host time,
        validation left out (timed in ``validation``)."""
        current = self._current
        if current is not None:
            piece = self._ahead if self._next_owner else self._piece
            piece[current] = piece.get(current, 0.0) + (t - self._t0 - self._carved)
            self._current = None
        if self._fit_iterations == 0:
            return  # no iteration ended in this fit: there is no "after"
        pieces: Dict[str, float] = {}
        for part in (self._piece, self._ahead):
            for name, seconds in part.items():
                pieces[name] = pieces.get(name, 0.0) + seconds
        writes = pieces.pop("checkpointing", None)
        # (at least 0: a user section opened in the last iteration's batch-end work and closed here is carved whole
        # out of this row, though its start was counted in that iteration)
        rows: Dict[str, Dict[str, Any]] = {
            "other": {"kind": "auto", "parent": None, "count": 1, "total_s": max(0.0, sum(pieces.values()))}}
        if writes is not None:
            rows["checkpointing"] = {"kind": "auto", "parent": None, "count": self._final_calls, "total_s": writes}
        for name, seconds, failed in self._iter_calls:
            sec = self._sections.get(name)
            row = rows.get(name)
            if row is None:
                row = rows[name] = {"kind": "user", "parent": sec.parent if sec else None, "count": 0, "total_s": 0.0,
                                    "closed_by_exception": 0}
            row["count"] += 1
            row["total_s"] += seconds
            row["closed_by_exception"] += failed
        total = sum(pieces.values()) + (writes or 0.0) + self._user_s
        self._final_row = {"total_s": total, "sections": rows}

    def _set_ranks(self, rows: Rows) -> None:
        self._ranks = {name: spread_across_ranks([r[i] for r in rows]) for i, name in enumerate(AUTO_SECTIONS)
                       if any(r[i] is not None for r in rows)}

    @guarded
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_taping()
        if self._active:
            self._close_final(now())
        self._write_summary(trainer)
        if self._active and self.print_reports and trainer.is_global_zero:
            rank_zero_info(self.format_report())

    @guarded
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop_taping()
        self._restore()
        self._flush_summary(trainer)

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._stop_taping()
        self._flush_tables()
        self._restore()  # no teardown hook follows an exception
        self._write_summary(trainer, exception)

    # -- checkpointing -------------------------------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """What resume needs so that one summary covers the whole run, as IterationTimer's does."""
        self._fold()
        iterations, iteration_ms = self._iterations, self._iteration.host.to_dict()
        host_ms = {name: sec.host.to_dict() for name, sec in self._sections.items()}
        closed = {name: sec.closed_by_exception for name, sec in self._sections.items()}
        if self._ending:
            # Saved in an iteration's batch-end work (ModelCheckpoint's every_n_train_steps): that iteration closes
            # after the save, so the checkpoint carries it as timed so far, or a resume from it would miss it.
            iterations += 1
            if self._counted:
                self._partial_iteration(iteration_ms, host_ms, closed)
        return {
            "iterations": iterations,
            "iteration_ms": iteration_ms,
            "sections": {name: {"kind": sec.kind, "parent": sec.parent, "host_ms": host_ms[name],
                                "device_ms": sec.device.to_dict(), "closed_by_exception": closed[name]}
                         for name, sec in self._sections.items()},
            "validation": {"runs": self._validation_runs, "total_s": self._validation_s},
            "overhead_s": self._overhead_s,
        }

    def _partial_iteration(self, iteration_ms: Dict[str, Any], host_ms: Dict[str, Any], closed: Dict[str, int]) -> None:
        """Adds the iteration still open (its pieces so far) to the histograms' state copies in ``iteration_ms`` and
        ``host_ms``; the live statistics are not touched (the iteration closes in them later, whole)."""
        pieces = dict(self._piece)
        if self._current is not None and not self._next_owner:
            pieces[self._current] = pieces.get(self._current, 0.0) + (now() - self._t0 - self._carved)
        total = sum(pieces.values()) + self._user_s
        if total <= 0:
            return

        def plus(state: Dict[str, Any], seconds: float) -> Dict[str, Any]:
            hist = LogHistogram.from_dict(state)
            hist.add(1000.0 * seconds)
            return hist.to_dict()

        iteration_ms.update(plus(iteration_ms, total))
        for name, seconds in pieces.items():
            self._section(name)
            host_ms[name] = plus(host_ms.get(name) or LogHistogram().to_dict(), seconds)
            closed.setdefault(name, 0)
        for name, seconds, failed in self._iter_calls:
            host_ms[name] = plus(host_ms[name], seconds)
            closed[name] += failed

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        s = StateReader(state_dict)
        sections = {}
        for name, data in (s.mapping("sections", allow_none=True) or StateReader({})).data.items():
            sec = StateReader(data, f"sections.{name}")
            if not isinstance(name, str):
                raise StateError(f"sections has a key {name!r}, expected section names")
            sections[name] = (sec.text("kind", "auto", allow_none=False), sec.text("parent"), sec.histogram("host_ms"),
                              sec.histogram("device_ms"), sec.count("closed_by_exception"))
        validation = s.mapping("validation", allow_none=True) or StateReader({}, "validation")
        iterations, iteration_ms = s.count("iterations"), s.histogram("iteration_ms")
        runs, total_s, overhead_s = validation.count("runs"), validation.number("total_s"), s.number("overhead_s")
        # all read: nothing is assigned from a state that fails halfway
        self._iterations = iterations
        if iteration_ms is not None:
            self._iteration.host = iteration_ms
        for name, (kind, parent, host, device, closed) in sections.items():
            sec = self._section(name, kind, parent)
            if host is not None:
                sec.host = host
            if device is not None:
                sec.device = device
            sec.closed_by_exception = closed
        self._validation_runs, self._validation_s, self._overhead_s = runs, total_s, overhead_s

    # -- results -------------------------------------------------------------------------------------------------
    def table(self) -> Dict[str, Dict[str, Any]]:
        """Per section: kind, parent, count, total_s, mean/min/max/p50/p95 ms, share_pct, device_mean_ms; automatic
        sections also ``inclusive_total_s``, ``inclusive_mean_ms`` and ``inclusive_share_pct``: with the user sections
        that ran inside them put back (what the insights compare)."""
        self._fold()
        iteration_total = self._iteration.host.total
        out: Dict[str, Dict[str, Any]] = {}
        inside: Dict[str, float] = {}
        for sec in self._sections.values():
            if sec.kind == "user" and sec.parent is not None:
                inside[sec.parent] = inside.get(sec.parent, 0.0) + sec.host.total / 1000.0
        for name, sec in self._sections.items():
            if sec.kind == "user" and not sec.host.count:
                continue  # ran only after the last iteration (its row is there) or in the warm-up
            s = sec.host.summary()
            inclusive = None
            if sec.kind == "auto":
                inclusive = sec.host.total / 1000.0 + inside.get(name, 0.0)
            out[name] = {
                "kind": sec.kind,
                "parent": sec.parent,
                "count": sec.host.count,
                "total_s": sec.host.total / 1000.0,
                "mean_ms": s["mean"], "min_ms": s["min"], "max_ms": s["max"], "p50_ms": s["p50"], "p95_ms": s["p95"],
                "share_pct": 100.0 * sec.host.total / iteration_total if iteration_total > 0 else None,
                "device_mean_ms": sec.device.mean,
                "closed_by_exception": sec.closed_by_exception,
            }
            if inclusive is not None:
                out[name]["inclusive_total_s"] = inclusive
                out[name]["inclusive_mean_ms"] = 1000.0 * inclusive / sec.host.count if sec.host.count else None
                out[name]["inclusive_share_pct"] = (100.0 * inclusive * 1000.0 / iteration_total
                                                    if iteration_total > 0 else None)
        return out

    def insights(self, table: Optional[Dict[str, Dict[str, Any]]] = None) -> List[str]:
        """Plain-language findings. Automatic sections are compared on inclusive times: a user section inside the
        forward (an EMA, a sampler) is still forward time when weighing backward against forward."""
        table = self.table() if table is None else table
        share = {n: r.get("inclusive_share_pct", r["share_pct"]) or 0.0 for n, r in table.items()}
        out: List[str] = []
        data = share.get("data_loading", 0.0)
        workers = self._workers
        if data > DATA_LOADING_PCT:
            advice = loader.wait_advice(workers)
            out.append(f"Data loading takes {data:.1f}% of each iteration (above {DATA_LOADING_PCT:g}%): the loop"
                       " waits for batches. " + (advice[0].upper() + advice[1:] + "." if advice else
                                                 "Raise DataLoader num_workers, set pin_memory=True and"
                                                 " persistent_workers=True, or make preprocessing lighter."))
        elif "data_loading" in table:
            busy = workers.get("busy_pct") if workers else None
            out.append(f"Data loading {data:.1f}%: efficient" + (
                f"; the loop hardly waits for batches (workers busy {busy:.0f}%): more workers would gain nothing."
                if busy is not None else "."))
        between = share.get(BETWEEN, 0.0)
        if between > BETWEEN_BATCHES_PCT:
            out.append(f"Lightning's loop between batches takes {between:.1f}% (above {BETWEEN_BATCHES_PCT:g}%): host"
                       " work of the loop, not data loading (batch-end hooks of callbacks and the module, logging, the"
                       " progress bar). Log less often (log_every_n_steps), refresh the progress bar less often"
                       " (TQDMProgressBar(refresh_rate=...)), or put profile_section in your batch-end hooks.")
        fwd, bwd = (table.get(n, {}).get("inclusive_mean_ms") for n in ("forward", "backward"))
        if fwd and bwd and bwd > BACKWARD_OVER_FORWARD * fwd:
            out.append(f"Backward takes {bwd / fwd:.1f}x the forward (usually about 2x): look for gradient"
                       " checkpointing recomputation, ops with slow backward kernels, or parameters that need no grad.")
        forward = share.get("forward", 0.0)
        if forward > FORWARD_PCT:
            out.append(f"The forward pass takes {forward:.1f}% of each iteration (above {FORWARD_PCT:g}%): mixed"
                       " precision (Trainer(precision='bf16-mixed')), torch.compile, a smaller model or distillation"
                       " cut it; profile_section shows which part of it is slow.")
        opt = share.get("optimizer_step", 0.0)
        if opt > OPTIMIZER_PCT:
            out.append(f"The optimizer step takes {opt:.1f}% (above {OPTIMIZER_PCT:g}%): try a fused or foreach"
                       " optimizer (e.g. torch.optim.AdamW(..., fused=True)) or fewer parameter groups.")
        ckpt = share.get("checkpointing", 0.0)
        if ckpt > CHECKPOINT_PCT:
            out.append(f"Checkpointing takes {ckpt:.1f}% (above {CHECKPOINT_PCT:g}%): save less often"
                       " (every_n_train_steps) or asynchronously.")
        host = sum(table[n]["total_s"] for n in ("forward", "backward", "optimizer_step") if n in table)
        device = sum((table[n]["device_mean_ms"] or 0.0) * table[n]["count"] / 1000.0
                     for n in ("forward", "backward", "optimizer_step") if n in table)
        if device > 0 and host > HOST_OVER_DEVICE * device:
            out.append(f"Host time is {host / device:.1f}x device time in the step: iterations are host-bound (the GPU"
                       " waits for Python). Larger batches, torch.compile or CUDA graphs help.")
        slowest = self.slowest_section(table)
        if slowest:
            out.append(f"Slowest component: {slowest} ({table[slowest]['mean_ms']:.2f} ms mean).")
        return out

    def slowest_section(self, table: Optional[Dict[str, Dict[str, Any]]] = None) -> Optional[str]:
        """The automatic or top-level user section with the largest total (nested user sections are inside theirs)."""
        table = self.table() if table is None else table
        top_level = AUTO_SECTIONS + MANUAL_SECTIONS
        ranked = [(r["total_s"], n) for n, r in table.items()
                  if (r["kind"] == "auto" or r["parent"] is None or r["parent"] in top_level) and r["total_s"] > 0]
        return max(ranked)[1] if ranked else None

    def format_report(self) -> str:
        table = self.table()
        rows = _printed_rows(table)
        w = max([22] + [len(label) + 2 for label, _ in rows])
        iteration = self._iteration.host
        lines = [f"=== SectionProfiler: {iteration.count} iterations, {iteration.mean or 0:.2f} ms mean ===",
                 f"{'section':<{w}}{'count':>8}{'total s':>10}{'mean ms':>10}{'min ms':>9}{'p50 ms':>9}{'p95 ms':>9}"
                 f"{'max ms':>9}{'share':>8}"]
        for label, r in rows:
            lines.append(f"{label:<{w}}{r['count']:>8}{r['total_s']:>10.3f}{r['mean_ms']:>10.2f}{r['min_ms']:>9.2f}"
                         f"{r['p50_ms']:>9.2f}{r['p95_ms']:>9.2f}{r['max_ms']:>9.2f}{(r['share_pct'] or 0):>7.1f}%")
        final = self._final_row
        if final is not None:
            parts = ", ".join(f"{name} {r['total_s']:.3f} s ({r['count']}x)" if r["kind"] == "user" or
                              name == "checkpointing" else f"{name} {r['total_s']:.3f} s"
                              for name, r in sorted(final["sections"].items(), key=lambda kv: -kv[1]["total_s"]))
            lines.append(f"after the last iteration: {final['total_s']:.3f} s ({parts})")
        lines += ["Insights:"] + [f"- {i}" for i in self.insights(table)]
        return "\n".join(lines)

    def _slowest_iterations(self, table: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
        """The kept slowest iterations of this process, each with its sections and the one that exceeded its own
        median per iteration the most (what IterationTimer's tail names for its slow iterations)."""
        n = self._iteration.host.count
        runs = {name: (sec.runs or None) if sec.kind == "user" else sec.host.count
                for name, sec in self._sections.items() if name in table}
        medians = {name: median_per_iteration(self._sections[name].host, n, runs[name]) for name in runs}
        return self._slowest.entries(medians, {k: v for k, v in runs.items() if v is not None}, n)

    def _summary_section(self) -> Dict[str, Any]:
        table = self.table()
        unavailable: Dict[str, str] = {}
        if self._disabled_reason:
            unavailable["sections"] = self._disabled_reason
        if self._manual:
            unavailable["forward"] = unavailable["backward"] = unavailable["optimizer_step"] = (
                "manual optimization: the step is one training_step section")
        if self._clock is None:
            unavailable["device_mean_ms"] = "device timing needs CUDA" if self.device_timing else "switched off"
        unavailable["synchronization"] = SYNC_REASON
        if self._gap_mode and self.data_loading_boundary == "fetch":
            unavailable["data_loading_fetch"] = GAP_REASON
        if self._checkpoint_reason:
            unavailable["checkpointing"] = self._checkpoint_reason
        if self._active and self._workers_reason and (self._workers is not None or self._iteration.host.count):
            unavailable["workers"] = self._workers_reason
        if self._active and self._final_row is None:
            unavailable["after_last_iteration"] = (
                "no iteration ended in this fit" if self._fit_iterations == 0 else
                "the fit did not reach its end (on_fit_end): the work after the last iteration is not complete")
        return {
            "enabled": self._active,
            "data_loading_boundary": "batch_gap" if self._gap_mode else "fetch",
            "workers": self._workers,
            "manual_optimization": self._manual,
            "warmup_steps": self.warmup_steps,
            "device_timing_every_n_iterations": self.device_timing_every_n_iterations,
            "iterations": self._iteration.host.count,
            "iteration_ms": self._iteration.host.summary(),
            "sections": table,
            "slowest_section": self.slowest_section(table),
            "insights": self.insights(table),
            "validation": {"runs": self._validation_runs, "total_s": self._validation_s},
            "after_last_iteration": self._final_row,
            "slowest_iterations": self._slowest_iterations(table),
            "overhead_us_per_step": 1e6 * self._overhead_s / max(1, self._iterations) if self._active else None,
            "report_every_n_steps": self.report_every_n_steps,
            "ranks": self._ranks,
            "unavailable": unavailable,
            "thresholds": {"data_loading_pct": DATA_LOADING_PCT, "backward_over_forward": BACKWARD_OVER_FORWARD,
                           "optimizer_pct": OPTIMIZER_PCT, "forward_pct": FORWARD_PCT, "checkpointing_pct": CHECKPOINT_PCT,
                           "host_over_device": HOST_OVER_DEVICE, "between_batches_pct": BETWEEN_BATCHES_PCT,
                           "workers_busy_pct": loader.WORKERS_BUSY_PCT},
        }
