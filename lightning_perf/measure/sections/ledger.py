"""The section ledger: turns the training loop's boundary events, applied in order with their times, into sections."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from lightning_perf.measure.sections.user_sections import Samples, Section
from lightning_perf.measure.stats.streaming import FOLD_EVERY
from lightning_perf.measure.timing.clock import now
from lightning_perf.measure.timing.tail import OWN_WORK, SlowestPieces, median_per_iteration

#: The host work of Lightning's loop between two batches (batch-end hooks after the profiler's, logging, the
#: progress bar, the loop's own bookkeeping): its own section where ``data_loading`` is the fetch alone.
BETWEEN = "between_batches"
#: (checkpointing last: the ninth section made shares its histogram batches' phase with the iterations', see
#: ``user_sections.Samples``, and a checkpoint rarely comes every iteration)
AUTO_SECTIONS = ("data_loading", BETWEEN, "transfer", "forward", "backward", "optimizer_step", "other",
                 "checkpointing")
#: Under manual optimization: the forward and the rest of the step are ``training_step``; ``backward`` (each
#: ``manual_backward``) and ``optimizer_step`` (each ``opt.step()``) are carved out of it by the caller's switches.
MANUAL_SECTIONS = ("data_loading", BETWEEN, "transfer", "training_step", "backward", "optimizer_step", "other",
                   "checkpointing")
#: The pieces a manual step switches to and back from (:meth:`SectionLedger.manual_switch`).
MANUAL_STEP_PIECES = ("backward", "optimizer_step")
#: The kind of the per-optimizer rows (``optimizer_step[i]``): a split of ``optimizer_step``, inside its time.
OPTIMIZER_KIND = "optimizer"
#: User-section calls an iteration keeps for the statistics (a runaway loop of sections stays bounded).
MAX_CALLS_PER_ITERATION = 10_000
#: The slowest iterations kept with their sections (the summary's ``slowest_iterations``): more than
#: IterationTimer's default ``keep_slowest`` (10), so that its kept iterations are found here too.
SLOWEST_KEPT = 20

#: A device mark, called on each switch that changes the section: (section ending, section starting, whether the
#: ending piece belongs to the next iteration, whether the starting one does).
Marker = Callable[[Optional[str], Optional[str], bool, bool], None]


class Iteration:
    """The iteration being timed (then waiting for the fold): its automatic pieces, what was carved out of them, and
    its batch-end work."""

    __slots__ = ("pieces", "ahead", "user_s", "calls", "end_pieces", "end_s", "number")

    def __init__(self, pieces: Optional[Dict[str, float]] = None) -> None:
        self.pieces: Dict[str, float] = pieces if pieces is not None else {}  # seconds per automatic section
        self.ahead: Dict[str, float] = {}  # the next iteration's, while this one's batch-end work runs (batch_gap)
        self.user_s = 0.0  # top-level user-section time
        self.calls: List[Tuple[str, float, bool]] = []  # (name, seconds, failed) of its user sections
        self.end_pieces: Dict[str, float] = {}  # carved out after its step (IterationTimer counts it in the next)
        self.end_s = 0.0  # their top-level time
        self.number = -1  # 0-based in the run, set where it closes


class SectionLedger:
    """Sections of the training iterations from boundary events, each applied in order with the time it was read at.

    An iteration runs from where the previous one closed to where the next one starts (its fetch, its transfer or
    its batch start), or to an epoch end or the end of training: the work after its step is its own. A piece of an
    automatic section runs from one switch to the next, less what was carved out of it (user sections, checkpoint
    writes). ``gap_mode``: data loading is the whole gap between batches (``batch_gap``), which then belongs to the
    next iteration while the step's batch-end work still runs. The events are the methods under "events"; a close
    sets ``report_due`` where a window report falls due. ``marker``, where set, is called at every switch that changes
    the section (the caller's device marks)."""

    def __init__(self, warmup_steps: int, report_every_n_steps: int, gap_mode: bool) -> None:
        self.warmup_steps = warmup_steps
        self.report_every_n_steps = report_every_n_steps
        self.gap_mode = gap_mode
        self.manual = False
        self.marker: Optional[Marker] = None
        self.sections: Dict[str, Section] = {}
        self.iteration = Samples()  # whole iterations
        self.current: Optional[str] = None  # the automatic section running
        self.t0 = 0.0  # where its piece started
        self.next_owner = False  # the running piece belongs to the next iteration (the wait for its batch)
        self.ending = False  # the iteration's step is done; it closes where the next one starts, or at an end
        self.open = Iteration()
        # the running piece's dict: the open iteration's ``pieces``, or its ``ahead`` for the next one (``next_owner``).
        # What is carved out of the piece (user sections, writes) is taken from it there, at once.
        self.piece = self.open.pieces
        # switches not applied yet (apply_held), at most an accumulation's batches or FOLD_EVERY iterations: while any
        # wait, ``current``, ``t0`` and ``piece`` are behind, and every method that reads them applies those first
        # (none is held outside the loop, where ``current`` is None)
        self.held: List[Tuple[Any, Optional[float]]] = []
        self.unfolded: List[Iteration] = []  # closed, counted, not yet folded
        self.slowest = SlowestPieces(SLOWEST_KEPT)
        self.step_offset: Optional[int] = None  # global step - iteration number, this fit (automatic optimization)
        self.prev_end: Optional[Iteration] = None  # the last folded iteration, where it had batch-end work
        self.last_folded = -1  # its number + 1
        self.iterations = 0
        self.fit_iterations = 0  # warm-up is per fit, also after a resume
        self.counted = warmup_steps == 0
        self.report_due = False  # the iteration that just closed ends a report window
        self.final_row: Optional[Dict[str, Any]] = None  # the fit's work after its last iteration
        self.final_calls = 0  # checkpoint writes and removals since the last iteration closed
        self.fetch_resume: Optional[str] = None  # the section a fetch's return goes back to
        self.validation_s = 0.0
        self.validation_runs = 0
        self.val_start: Optional[float] = None
        self.step_s = 0.0  # manual optimization: seconds of backward and optimizer-step pieces so far (the switches')
        self.part_from = 0.0  # the running optimizer step's section total before it started

    def section(self, name: str, kind: str = "auto", parent: Optional[str] = None) -> Section:
        sec = self.sections.get(name)
        if sec is None:
            sec = self.sections[name] = Section(kind, parent, len(self.sections) + 1)  # phase 0: iterations'
        return sec

    def between_batches(self) -> str:
        """The section from a batch's end until the next batch starts."""
        return "data_loading" if self.gap_mode else BETWEEN

    # -- events --------------------------------------------------------------------------------------------------
    def train_start(self, manual: bool, global_step: int, t: float) -> None:
        self.manual = manual
        for name in (MANUAL_SECTIONS if manual else AUTO_SECTIONS):
            if name != BETWEEN or not self.gap_mode:  # (with batch_gap the loop's work is in data_loading)
                self.section(name)
        # the slowest iterations are joined to IterationTimer's by global step: under automatic optimization the step
        # at an iteration's end is its number plus this fit's offset
        self.step_offset = None if manual else global_step - self.iterations
        self.switch("other", t)

    def switch(self, section: Optional[str], t: float, start_next: Optional[bool] = None) -> None:
        """Ends the current automatic piece (what was carved out of it is already taken off) and starts ``section``;
        ``start_next``: the piece that starts belongs to the next iteration (default: the same owner as the one that
        ends)."""
        if self.held:
            self.apply_held()
        current = self.current
        if current is not None:
            piece = self.piece
            piece[current] = piece.get(current, 0.0) + (t - self.t0)
        if self.marker is not None and section != current:
            self.marker(current, section, self.next_owner, self.next_owner if start_next is None else start_next)
        self.current = section
        self.t0 = t
        if start_next is not None:
            self.next_owner = start_next
            self.piece = self.open.ahead if start_next else self.open.pieces

    def _hold(self, section: str, t: float, start_next: Optional[bool] = None) -> None:
        """:meth:`switch` to ``section`` at ``t``, held where no marker is set (see :meth:`apply_held`), with the change
        of the running piece's owner where ``start_next`` makes one."""
        if self.marker is not None:
            self.switch(section, t, start_next)
            return
        self.held.append((section, t))
        if start_next is not None and start_next != self.next_owner:
            self.next_owner = start_next
            self.held.append((self.open.ahead if start_next else self.open.pieces, None))

    def apply_held(self) -> None:
        """The held switches, in order. Where no marker is set, the switches of the step path (the fetch's return, the
        transfer, the batch start, the step's own hooks, which SectionProfiler appends to ``held`` itself, the batch
        end and the close) are held, (section, time) each, with (dict, None) where the running piece's owner changes
        (a close, a batch end in batch_gap mode), and applied in one loop at the fold (every FOLD_EVERY iterations) or
        by any other event first. Held, a step costs ~10 µs less than with each switch applied at once (three paired
        fits: -12.7, -7.8, -8.5 µs; ``python benchmarks/toggle_ab.py held-switches --steps 30000 --reps 3``), and
        held to the fold, ~5 µs less than applied at each batch end (-3.7, -6.5, -5.4 µs; ``held-to-fold``)."""
        held = self.held
        current, t0, piece = self.current, self.t0, self.piece
        for section, t in held:  # (``current`` is never None here: nothing is held outside the loop)
            if t is None:
                piece = section
                continue
            piece[current] = piece.get(current, 0.0) + (t - t0)
            current, t0 = section, t
        self.current, self.t0, self.piece = current, t0, piece
        held.clear()

    def batch_end(self, t: float, ends_iteration: bool) -> None:
        """The step is done (or, accumulating, the batch): batch-end work belongs to the iteration, which closes where
        the next one starts. In batch_gap mode the gap now running is the wait for the next batch: the next
        iteration's, while what is carved out of it (sections, writes) is this one's."""
        between = "data_loading" if self.gap_mode else BETWEEN  # (``between_batches``, without its call)
        if not ends_iteration:
            self.switch(between, t)
            return
        self._hold(between, t, self.gap_mode)
        self.ending = True

    def fetch_started(self, t: float) -> bool:
        """Lightning's fetch of the next batch starts (``data_loading`` until it returns): it closes the iteration whose
        step ended; a fetch inside a step is carved out of the section it ran in. True where an iteration closed."""
        if self.current is None and not self.held:  # (not in the training loop)
            self.fetch_resume = None
            return False
        if self.ending:
            self.fetch_resume = BETWEEN
            self._close("data_loading", t)
            return True
        if self.held:  # (a fetch inside the step: ``dataloader_iter``)
            self.apply_held()
        current = self.current
        self.fetch_resume = BETWEEN if current in (BETWEEN, "data_loading") else current
        self.switch("data_loading", t)
        return False

    def fetch_returned(self, t: float) -> None:
        resume, self.fetch_resume = self.fetch_resume, None
        if resume is not None:
            if self.marker is None:  # (``_hold`` without its call, the step path's way; so below)
                self.held.append((resume, t))
            else:
                self.switch(resume, t)

    def close(self, t: float) -> None:
        """The iteration whose step ended (``ending``) closes at ``t``, where the next event of the loop starts (the
        profiler's own work at a close, a report or device reads, runs there, not in a piece that event starts)."""
        self._close(self.between_batches(), t)

    def transfer(self, t: float) -> bool:
        """Lightning's ``batch_to_device`` starts (``transfer`` until the batch start). True where an iteration closed."""
        if self.current is None:  # (a validation's or the sanity check's transfer)
            return False
        if self.ending:
            self._close("transfer", t)
            return True
        if self.marker is None:
            self.held.append(("transfer", t))
        else:
            self.switch("transfer", t)
        return False

    def batch_start(self, t: float) -> bool:
        """``on_train_batch_start``; closes the iteration where no transfer or fetch did. True where one closed."""
        section = "training_step" if self.manual else "forward"
        if self.ending:
            self._close(section, t)
            return True
        if self.marker is None:
            self.held.append((section, t))
        else:
            self.switch(section, t)
        return False

    def manual_switch(self, section: str, t: float) -> Optional[str]:
        """Manual optimization: a backward or an optimizer step starts (``section``), or one ends (``section``: the
        one it interrupted). Returns the section that was running (None outside the training loop: no switch)."""
        if self.held:
            self.apply_held()
        current = self.current
        if current is None:
            return None
        if current in MANUAL_STEP_PIECES:
            self.step_s += t - self.t0
        self.switch(section, t)
        return current

    def optimizer_started(self, t: float) -> Optional[str]:
        """Manual optimization: an optimizer step starts at ``t`` (:meth:`manual_switch` to ``optimizer_step``); its
        own time is what ``optimizer_step`` gains until :meth:`optimizer_stepped` (a closure's backward inside it is
        switched out and back)."""
        resume = self.manual_switch("optimizer_step", t)
        if resume is not None:
            self.part_from = self.piece.get("optimizer_step", 0.0)
        return resume

    def optimizer_stepped(self, name: Optional[str], resume: str, t: float) -> None:
        """Manual optimization: the optimizer step that :meth:`optimizer_started` started returned at ``t``; ``resume``
        runs again. ``name``: the optimizer's own row (``optimizer_step[i]``, where there are several), which gets
        this step's time (its piece of ``optimizer_step``, less a backward inside it) as one call."""
        if self.manual_switch(resume, t) != "optimizer_step" or name is None:
            return
        seconds = self.piece.get("optimizer_step", 0.0) - self.part_from
        if name not in self.sections:
            self.section(name, OPTIMIZER_KIND, "optimizer_step")
        if len(self.open.calls) < MAX_CALLS_PER_ITERATION:
            self.open.calls.append((name, seconds, False))

    def user_section(self, name: str, parent: Optional[str], seconds: float, failed: bool,
                     step_s: float = 0.0) -> bool:
        """A user section ended: a top-level one is carved out of the automatic piece it ran in (its parent). False
        where none runs (a validation, the sanity check, before the loop): it is no iteration's. ``step_s``: under
        manual optimization, the backward and optimizer-step time that ran inside it (their own rows keep it)."""
        if self.current is None and not self.held:
            return False
        seconds -= step_s
        it = self.open
        if self.ending:  # a batch-end hook's section, nested ones with their parents: IterationTimer's next
            it.end_pieces[name] = it.end_pieces.get(name, 0.0) + seconds
        if parent is None:
            self._carve(seconds)
            it.user_s += seconds
            if self.ending:
                it.end_s += seconds
            parent = self.current
            if self.gap_mode and parent == "data_loading":
                parent = "other"  # a batch-end hook's section (it runs in the gap): not part of the fetch
        self.section(name, "user", parent)
        if len(it.calls) < MAX_CALLS_PER_ITERATION:
            it.calls.append((name, seconds, failed))
        return True

    def checkpoint(self, seconds: float) -> None:
        """A checkpoint write or removal: carved out of the running piece, its own ``checkpointing`` piece."""
        if self.current is None:
            return
        self._carve(seconds)
        it = self.open
        it.pieces["checkpointing"] = it.pieces.get("checkpointing", 0.0) + seconds
        if self.ending:
            it.end_pieces["checkpointing"] = it.end_pieces.get("checkpointing", 0.0) + seconds
            it.end_s += seconds
        self.final_calls += 1  # counted for the final row only: the table counts iterations with a write

    def _carve(self, seconds: float) -> None:
        """Takes ``seconds`` (a user section, a write) off the running piece."""
        if self.held:
            self.apply_held()
        if self.current is not None:
            self.piece[self.current] = self.piece.get(self.current, 0.0) - seconds

    def epoch_start(self, t: float) -> None:
        self.switch("data_loading", t)  # the new epoch's iterator (workers starting) and its first fetch

    def epoch_end(self, t: float) -> bool:
        """The epoch's last iteration closes; epoch-end hooks go to the next one (or the final row)."""
        if self.held:
            self.apply_held()
        if self.current is None:
            return False
        if self.ending:
            self._close("other", t)
            return True
        if self.current in ("data_loading", BETWEEN):
            self.switch("other", t)  # epoch-end hooks, epoch-level logging: not the loop between two batches
        return False

    def validation_start(self, t: float) -> None:
        if self.current is not None:
            self.switch(None, t)  # the piece so far stays with its section; validation is off the table
            self.val_start = t

    def validation_end(self, t: float) -> None:
        if self.val_start is not None:
            self.validation_s += t - self.val_start
            self.validation_runs += 1
            self.val_start = None
            self.switch(self.between_batches(), t)

    def train_end(self, t: float) -> bool:
        """The last iteration closes; what follows is the fit's final work, up to :meth:`fit_end`."""
        if self.ending:
            self._close("other", t)
            return True
        return False

    def fit_end(self, t: float) -> None:
        """The fit's work after its last iteration closed (epoch-end hooks, the last checkpoint, ``on_train_end``
        hooks, teardown), up to ``t``, in its own row (``final_row``), validation left out."""
        if self.held:
            self.apply_held()
        if self.current is not None:  # (no device mark: the device's events were read at the train end)
            self.piece[self.current] = self.piece.get(self.current, 0.0) + (t - self.t0)
            self.current = None
        if self.fit_iterations == 0:
            return  # no iteration ended in this fit: there is no "after"
        it = self.open
        pieces: Dict[str, float] = {}
        for part in (it.pieces, it.ahead):
            for name, seconds in part.items():
                pieces[name] = pieces.get(name, 0.0) + seconds
        writes = pieces.pop("checkpointing", None)
        # (at least 0: a user section opened in the last iteration's batch-end work and closed here is carved whole
        # out of this row, though its start was counted in that iteration)
        rows: Dict[str, Dict[str, Any]] = {
            "other": {"kind": "auto", "parent": None, "count": 1, "total_s": max(0.0, sum(pieces.values()))}}
        if writes is not None:
            rows["checkpointing"] = {"kind": "auto", "parent": None, "count": self.final_calls, "total_s": writes}
        for name, seconds, failed in it.calls:
            sec = self.sections.get(name)
            row = rows.get(name)
            if row is None:
                row = rows[name] = {"kind": "user", "parent": sec.parent if sec else None, "count": 0, "total_s": 0.0,
                                    "closed_by_exception": 0}
            row["count"] += 1
            row["total_s"] += seconds
            row["closed_by_exception"] += failed
        total = sum(pieces.values()) + (writes or 0.0) + it.user_s
        self.final_row = {"total_s": total, "sections": rows}

    def _close(self, section: str, t: float) -> None:
        """The iteration whose step ended closes at ``t``, where ``section`` of the next one starts: its pieces wait
        for the fold; what was timed ahead for the next one (the wait for its batch) starts that one's."""
        it, counted = self.open, self.counted
        self._hold(section, t, start_next=True)
        self.ending = False
        it.number = self.iterations
        if counted:
            self.unfolded.append(it)
            if len(self.unfolded) >= FOLD_EVERY:
                start = now()
                self.fold(histograms=False)
                OWN_WORK.add(now() - start)
        elif not self.unfolded:  # a warm-up iteration's batch-end work is the first counted one's
            self.prev_end, self.last_folded = (it if it.end_pieces else None), it.number + 1
            if self.held:  # (no fold in the warm-up: what is held stays bounded)
                self.apply_held()
        self.open, self.next_owner, self.final_calls = Iteration(it.ahead), False, 0
        if not self.held:  # (else the held owner change sets it)
            self.piece = self.open.pieces
        self.iterations += 1
        self.fit_iterations += 1
        self.counted = self.fit_iterations >= self.warmup_steps
        self.report_due = counted and self.iterations % self.report_every_n_steps == 0

    # -- figures -------------------------------------------------------------------------------------------------
    def fold(self, histograms: bool = True) -> None:
        """The closed iterations' pieces into raw times, and those into the window sums and the histograms: before
        every read of a figure. ``histograms=False``: a section's raw times go to its histogram only at its limit."""
        if self.held:
            self.apply_held()
        slowest, offset, sections = self.slowest, self.step_offset, self.sections
        for it in self.unfolded:
            total = sum(it.pieces.values()) + it.user_s
            if total <= 0:
                continue
            self.iteration.raw.append(total)
            # As IterationTimer counts it: the previous iteration's batch-end carving in, this one's out
            carried = self.prev_end if self.last_folded == it.number else None
            aligned = total - it.end_s + (carried.end_s if carried else 0.0)
            number = it.number + 1  # (1-based, as the summary's slowest iterations count them)
            if aligned > slowest.floor:
                slowest.offer(aligned, number, None if offset is None else number + offset, it.pieces, it.calls,
                              it.end_pieces or None, carried.end_pieces if carried else None)
            self.prev_end, self.last_folded = (it if it.end_pieces else None), number
            for name, seconds in it.pieces.items():
                (sections.get(name) or self.section(name)).raw.append(seconds)
            if it.calls:
                for name, seconds, failed in it.calls:
                    sec = sections[name]
                    sec.raw.append(seconds)
                    sec.closed_by_exception += failed
                for name in {call[0] for call in it.calls}:
                    sections[name].runs += 1
        self.unfolded = []
        self.iteration.fold(histograms)
        for sec in self.sections.values():
            sec.fold(histograms)

    def take_window(self) -> Tuple[int, Dict[str, Optional[float]], List[tuple]]:
        """The report window since the last one, then a new window: (iterations, ``time/..`` and ``time_share/..``
        figures, rows for the printed table: name, count, total s, mean, min, max ms, share, kind, parent)."""
        self.fold(histograms=False)
        iters, seconds = self.iteration.window_n, self.iteration.window_s
        metrics: Dict[str, Optional[float]] = {"time/iteration_ms": 1000.0 * seconds / iters if iters else None}
        rows = []
        for name, sec in self.sections.items():
            if iters and (sec.window_n or sec.host.count or sec.raw):  # (not run yet in this run: no point)
                metrics[f"time/{name}_ms"] = 1000.0 * sec.window_s / iters
                share = metrics[f"time_share/{name}_pct"] = 100.0 * sec.window_s / seconds if seconds > 0 else None
                if sec.window_n:
                    rows.append((name, sec.window_n, sec.window_s, 1000.0 * sec.window_s / sec.window_n,
                                 1000.0 * sec.window_min, 1000.0 * sec.window_max, share, sec.kind, sec.parent))
            sec.window_reset()
        self.iteration.window_reset()
        return iters, metrics, rows

    def table(self) -> Dict[str, Dict[str, Any]]:
        """Per section: kind, parent, count, total_s, mean/min/max/p50/p95 ms, share_pct, device_mean_ms,
        closed_by_exception; automatic sections also ``inclusive_total_s``, ``inclusive_mean_ms`` and
        ``inclusive_share_pct``, with the user sections that ran inside them put back."""
        self.fold()
        iteration_total = self.iteration.host.total
        inside: Dict[str, float] = {}
        for sec in self.sections.values():
            if sec.kind == "user" and sec.parent is not None:
                inside[sec.parent] = inside.get(sec.parent, 0.0) + sec.host.total / 1000.0
        out: Dict[str, Dict[str, Any]] = {}
        for name, sec in self.sections.items():
            if sec.kind == "user" and not sec.host.count:
                continue  # ran only after the last iteration (its row is there) or in the warm-up
            s = sec.host.summary()
            row = out[name] = {
                "kind": sec.kind, "parent": sec.parent, "count": sec.host.count, "total_s": sec.host.total / 1000.0,
                "mean_ms": s["mean"], "min_ms": s["min"], "max_ms": s["max"], "p50_ms": s["p50"], "p95_ms": s["p95"],
                "share_pct": 100.0 * sec.host.total / iteration_total if iteration_total > 0 else None,
                "device_mean_ms": sec.device.mean, "closed_by_exception": sec.closed_by_exception}
            if sec.kind == "auto":
                inclusive = sec.host.total / 1000.0 + inside.get(name, 0.0)
                row["inclusive_total_s"] = inclusive
                row["inclusive_mean_ms"] = 1000.0 * inclusive / sec.host.count if sec.host.count else None
                row["inclusive_share_pct"] = (100.0 * inclusive * 1000.0 / iteration_total
                                              if iteration_total > 0 else None)
        return out

    def slowest_iterations(self, table: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
        """The kept slowest iterations, each with its sections and the one past its own median the most."""
        n = self.iteration.host.count
        runs = {name: (sec.runs or None) if sec.kind == "user" else sec.host.count
                for name, sec in self.sections.items() if name in table}
        medians = {name: median_per_iteration(self.sections[name].host, n, runs[name]) for name in runs}
        return self.slowest.entries(medians, {k: v for k, v in runs.items() if v is not None}, n)
