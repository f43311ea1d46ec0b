"""StepTrace: a torch.profiler trace (Chrome/Perfetto JSON) of chosen training steps, or of those after a slow one."""

from __future__ import annotations

import math
import os
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lightning_perf.callbacks.core.arguments import (bad_argument, check_bool, check_number, check_path,
                                                     check_positive_int)
from lightning_perf.callbacks.core.base import PerfCallback, guarded, reads_state
from lightning_perf.measure.timing.clock import now
from lightning_perf.measure.timing.tail import OWN_WORK
from lightning_perf.measure.timing.trace import activity_names, finish_capture, start_capture, trace_name

#: The median a slow iteration is judged against: of the last RECENT iterations (a ring, O(1) memory), taken again
#: every MEDIAN_EVERY iterations (a sort of 64 numbers); the step path only stores and compares.
RECENT = 64
MEDIAN_EVERY = 16
_NEVER = math.inf


def _windows(steps: Sequence[int]) -> List[Tuple[int, int]]:
    """Consecutive steps as one window each: [5, 6, 7, 20] -> [(5, 7), (20, 20)]."""
    out: List[Tuple[int, int]] = []
    for step in sorted(set(steps)):
        if out and step == out[-1][1] + 1:
            out[-1] = (out[-1][0], step)
        else:
            out.append((step, step))
    return out


class StepTrace(PerfCallback):
    r"""A torch.profiler trace of the training steps that matter: the ``steps`` you name, and (with ``slow_factor``)
    the next ``capture_steps`` steps after an iteration that took more than ``slow_factor`` times the median, at most
    ``max_captures`` times a run. Each capture is one Chrome/Perfetto JSON file (open it in https://ui.perfetto.dev
    or chrome://tracing) with CPU ops and, on CUDA, the kernels; the summary's ``step_trace.captures`` lists each with
    the ops that took the most time, IterationTimer's tail links it from the slow iteration it follows or covers, and
    the diagnosis says "see trace ...".

    Steps are numbered as IterationTimer's tail numbers them: the global step at the iteration's end (``steps=[100]``
    traces the iteration that ends at global step 100). A slow iteration is timed here on the host from one batch end
    to the next (the tail's round trip); the first iteration of an epoch and the first after a validation are not
    judged (the tail names their causes already), nor the iteration after a capture; the median is of the last 64
    judged iterations. A capture starts the profiler at the batch end before the window (so the trace holds each
    iteration's whole round trip, the data loading of its first batch included) and stops it at the window's last
    batch end, where the trace is written; that work is lightning_perf's own (IterationTimer names its iteration for
    it), and the captured steps themselves run slower under the profiler (docs/evidence.md gives the figures).

    Args:
        steps: global steps to trace (consecutive steps make one trace).
        slow_factor: trace the steps after an iteration over this many times the median; None: only ``steps``.
        capture_steps: iterations in each slow-triggered capture.
        max_captures: most slow-triggered captures in a run.
        warmup_steps: iterations timed before an iteration can count as slow.
        trace_dir: where trace files go; default ``<trainer.log_dir>/traces``.
        record_shapes: record the input shapes of each op (bigger traces).
        with_stack: record the Python stack of each op (much bigger traces, slower capture).
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.

    Logged metrics: none (the traces are files; their paths are printed once and are in the summary).

    Raises:
        ValueError: for a step below 1, a ``slow_factor`` not above 1, a ``capture_steps``, ``max_captures`` or
            ``warmup_steps`` that is no positive integer (``max_captures``/``warmup_steps`` may be 0).

    Example::

        trainer = Trainer(callbacks=[StepTrace(steps=[100, 101], slow_factor=3.0, max_captures=2)])
    """

    section_name = "step_trace"
    _transient = ("_profiler",)

    def __init__(
        self,
        steps: Optional[List[int]] = None,
        slow_factor: Optional[float] = None,
        capture_steps: int = 2,
        max_captures: int = 2,
        warmup_steps: int = 10,
        trace_dir: Optional[str] = None,
        record_shapes: bool = False,
        with_stack: bool = False,
        summary_path: Optional[str] = None,
        run_name: Optional[str] = None,
        run_notes: Optional[str] = None,
    ) -> None:
        super().__init__(summary_path=summary_path, run_name=run_name, run_notes=run_notes)
        if steps is not None and (not isinstance(steps, (list, tuple)) or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in steps)):
            raise bad_argument("StepTrace", "steps", steps, "Expected a list of global steps (integers >= 1) or None.")
        self.steps = list(steps or [])
        self.slow_factor = check_number("StepTrace", "slow_factor", slow_factor, above=1.0, allow_none=True,
                                        what="a factor of the median iteration")
        check_positive_int("StepTrace", "capture_steps", capture_steps)
        check_positive_int("StepTrace", "max_captures", max_captures, minimum=0)
        check_positive_int("StepTrace", "warmup_steps", warmup_steps, minimum=0)
        self.capture_steps, self.max_captures, self.warmup_steps = capture_steps, max_captures, warmup_steps
        self.trace_dir = check_path("StepTrace", "trace_dir", trace_dir)
        self.record_shapes = check_bool("StepTrace", "record_shapes", record_shapes)
        self.with_stack = check_bool("StepTrace", "with_stack", with_stack)
        self._profiler: Any = None
        self._reset_run()

    def _reset_run(self) -> None:
        self._pending: List[Tuple[int, int, Optional[Dict[str, Any]]]] = [(a, b, None) for a, b in
                                                                          _windows(self.steps)]
        self._next_first: float = self._pending[0][0] if self._pending else _NEVER
        self._window: Optional[Tuple[int, int, Optional[Dict[str, Any]]]] = None
        self._started_at = 0.0
        self._start_cost = 0.0
        self._captures: List[Dict[str, Any]] = []
        self._slow_captures = 0
        self._slow_seen = 0
        self._passed: List[int] = []  # requested steps the run never reached a start of (a resume past them)
        self._recent = [0.0] * RECENT
        self._judged = 0
        self._median: Optional[float] = None
        self._step = 0
        self._last_end: Optional[float] = None
        self._on_cuda = False
        self._dir = ""
        self._rank: Optional[int] = None
        self._unavailable: Dict[str, str] = {}

    @property
    def _watching(self) -> bool:
        return self.slow_factor is not None and self._slow_captures < self.max_captures

    # -- set-up ----------------------------------------------------------------------------------------------------
    @guarded
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop(trainer, complete=False)
        self._reset_run()
        self._start_run(trainer, stage)
        self._on_cuda = trainer.strategy.root_device.type == "cuda"
        root = trainer.log_dir or trainer.default_root_dir
        self._dir = self.trace_dir or os.path.join(str(root), "traces")
        self._rank = trainer.global_rank if trainer.world_size > 1 else None

    @guarded
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._step = trainer.global_step
        while self._pending and self._pending[0][0] <= self._step:  # a resume past a requested window
            first, last, _ = self._pending.pop(0)
            self._passed.extend(range(first, last + 1))
        self._next_first = self._pending[0][0] if self._pending else _NEVER
        if self._step + 1 >= self._next_first:  # a window from the first iteration on
            self._start(trainer)

    # -- the step path: at a batch end, one test while nothing is due; a clock read and a store while watching -------
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        try:
            if self._profiler is None and not self._watching and not self._pending:
                return
            end = now()
            step = trainer.global_step
            if step == self._step:  # a micro-batch of an accumulating iteration
                return
            self._step = step
            if self._profiler is not None:
                if self._window is not None and step >= self._window[1]:
                    self._stop(trainer, complete=True)
                    self._last_end = None  # the next iteration holds the trace's writing
            elif self._watching:
                last, self._last_end = self._last_end, end
                if last is not None:
                    self._judge(1000.0 * (end - last), step)
            if self._profiler is None and step + 1 >= self._next_first:
                # from this batch end on: the next iteration's round trip, its data loading included
                self._start(trainer)
        except Exception as err:  # noqa: BLE001 - `guarded`, inline
            self._record_failure("on_train_batch_end", err)

    def _judge(self, ms: float, step: int) -> None:
        n = self._judged = self._judged + 1
        self._recent[(n - 1) % RECENT] = ms
        if n > self.warmup_steps and (n % MEDIAN_EVERY == 0 or self._median is None):
            self._median = statistics.median(self._recent[:n] if n < RECENT else self._recent)
        median = self._median
        if median is None or ms <= self.slow_factor * median:  # type: ignore[operator]
            return
        self._slow_seen += 1
        if self._slow_captures >= self.max_captures or (self._pending and self._pending[0][2] is not None):
            return
        self._slow_captures += 1
        trigger = {"slow_step": step, "slow_ms": ms, "median_ms": median}
        self._pending.insert(0, (step + 1, step + self.capture_steps, trigger))
        self._next_first = step + 1

    def _not_judged(self) -> None:
        self._last_end = None

    @guarded
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._not_judged()

    @guarded
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._not_judged()

    # -- a capture -------------------------------------------------------------------------------------------------
    def _start(self, trainer: Trainer) -> None:
        first, last, trigger = self._window = self._pending.pop(0)
        self._next_first = self._pending[0][0] if self._pending else _NEVER
        if first <= self._step:  # a window that starts before this iteration (cannot be reached again)
            self._passed.extend(range(first, last + 1))
            self._window = None
            return
        began = now()
        self._profiler = start_capture(self._on_cuda, self.record_shapes, self.with_stack)
        self._started_at = now()
        self._start_cost = self._started_at - began
        OWN_WORK.add(self._start_cost)

    def _stop(self, trainer: Optional[Trainer], complete: bool) -> None:
        """Ends the capture in progress (``complete``: its last step ended) and writes its trace."""
        prof, window = self._profiler, self._window
        self._profiler = self._window = None
        if prof is None or window is None:
            return
        captured_s = now() - self._started_at
        began = now()
        first, last, trigger = window
        last_seen = last if complete else max(first, self._step)
        path = os.path.abspath(os.path.join(self._dir, trace_name(first, last_seen, self._rank)))
        try:
            ops, problem = finish_capture(prof, path)
        except Exception as err:  # noqa: BLE001 - a trace that cannot be written never stops training
            self._record_failure("trace", err)
            return
        cost = now() - began
        OWN_WORK.add(cost)
        self._captures.append({
            "path": None if problem else path, "first_step": first, "last_step": last_seen,
            "complete": complete and problem is None, "write_error": problem,
            "trigger": "slow" if trigger else "requested", **(trigger or {"slow_step": None, "slow_ms": None,
                                                                          "median_ms": None}),
            "captured_ms": 1000.0 * captured_s, "start_ms": 1000.0 * self._start_cost, "write_ms": 1000.0 * cost,
            "top_ops": ops})
        if problem is not None:  # the capture's top ops stay in the summary; no file is claimed, logged or linked
            self._warn_once("trace_written", f"the trace of steps {first}-{last_seen} could not be written:"
                                             f" {problem}. Training goes on; the summary keeps the capture's top ops"
                                             " and this reason (step_trace.captures[].write_error).")
            return
        if trainer is None or trainer.is_global_zero:
            rank_zero_info(f"StepTrace: steps {first}-{last_seen} traced to {path}" + (
                f" (after step {trigger['slow_step']} took {trigger['slow_ms']:.1f} ms, the median"
                f" {trigger['median_ms']:.1f} ms)" if trigger else ""))

    # -- the end ---------------------------------------------------------------------------------------------------
    @guarded
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop(trainer, complete=False)

    @guarded
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write_summary(trainer)

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._stop(trainer, complete=False)  # the steps up to the failure are what the user wants to see
        self._write_summary(trainer, exception)

    @guarded
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop(trainer, complete=False)
        self._flush_summary(trainer)

    @property
    def captures(self) -> List[Dict[str, Any]]:
        """The captures of this run so far: ``path``, ``first_step``, ``last_step``, ``trigger``, ``top_ops``, ..."""
        return [dict(c) for c in self._captures]

    def _summary_section(self) -> Dict[str, Any]:
        unavailable = dict(self._unavailable)
        traced = {s for c in self._captures for s in range(c.get("first_step", 0), c.get("last_step", -1) + 1)}
        passed = [s for s in self._passed if s not in traced]  # a resume: those traced before it are in `captures`
        if passed:
            unavailable["steps"] = (f"steps {', '.join(map(str, passed))} were not traced: the run started"
                                    " (or resumed) after them, or the run ended first")
        left = [s for a, b, t in self._pending if t is None for s in range(a, b + 1)]
        if left:
            unavailable["steps_not_reached"] = f"the run ended before steps {', '.join(map(str, left))}"
        return {
            "activities": activity_names(self._on_cuda),
            "steps": list(self.steps),
            "slow_factor": self.slow_factor,
            "capture_steps": self.capture_steps,
            "max_captures": self.max_captures,
            "warmup_steps": self.warmup_steps,
            "trace_dir": os.path.abspath(self._dir) if self._dir else None,
            "median_ms": self._median,
            "slow_iterations": self._slow_seen if self.slow_factor is not None else None,
            "captures": self.captures,
            "unavailable": unavailable,
        }

    def state_dict(self) -> Dict[str, Any]:
        return {"captures": self.captures, "slow_captures": self._slow_captures}

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        captures = state_dict.get("captures")
        if isinstance(captures, list):  # traces of before a resume stay in the summary; the cap counts them
            self._captures = [dict(c) for c in captures if isinstance(c, dict)]
        count = state_dict.get("slow_captures")
        if isinstance(count, int) and not isinstance(count, bool):
            self._slow_captures = count
