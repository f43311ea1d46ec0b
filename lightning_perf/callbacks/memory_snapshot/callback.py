"""MemorySnapshot: the CUDA allocator's history with stacks, dumped on an out-of-memory error and over chosen steps."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lightning_perf.callbacks.core.arguments import bad_argument, check_bool, check_path, check_positive_int
from lightning_perf.callbacks.core.base import PerfCallback, guarded, reads_state
from lightning_perf.measure.memory import snapshot as snapshots
from lightning_perf.measure.timing.clock import now
from lightning_perf.measure.timing.tail import OWN_WORK
from lightning_perf.summary.evidence import when

STACKS = ("python", "all")
_NEVER = float("inf")


class MemorySnapshot(PerfCallback):
    r"""What held the GPU's memory, allocation by allocation, with the Python line of each: the CUDA allocator's
    history (``torch.cuda.memory._record_memory_history``, at most ``max_entries`` events) recorded from set-up with
    ``on_oom`` (training, validation, test and predict) or over the ``steps`` window, and dumped where it matters: on an
    out-of-memory error (``torch.cuda.OutOfMemoryError``) and at the window's end. Each dump is a pickle (drag it into
    https://pytorch.org/memory_viz) and PyTorch's HTML views of it (``trace_plot``, ``segment_plot``); the summary's
    ``memory_snapshot.snapshots`` has their paths, the ``top_k`` largest live allocations and, on an OOM, the request
    that failed, each with the innermost frame of your code; the paths are printed once and the diagnosis names
    them. Recording costs on every allocation and free while it is on (docs/evidence.md gives the figures); nothing on
    the step path otherwise. Off CUDA it warns once and records nothing.

    Steps are numbered as IterationTimer's tail numbers them: the global step at the iteration's end.

    Args:
        on_oom: record from set-up and dump on an out-of-memory error.
        steps: ``[first, last]``: record (if not already) from the batch end before step ``first`` and dump at the
            end of step ``last``; None: no window.
        max_entries: allocator events kept (the oldest drop out).
        stacks: ``"python"`` (Python frames; cheaper) or ``"all"`` (with C++ frames).
        top_k: largest live allocations kept in the summary per dump.
        html: also write PyTorch's HTML views beside each pickle.
        snapshot_dir: where dumps go; default ``<trainer.log_dir>/memory_snapshots``.
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.

    Logged metrics: none (the snapshots are files; their paths are printed once and are in the summary).

    Raises:
        ValueError: for ``steps`` that is not two steps ``first <= last`` (>= 1), a ``max_entries`` or ``top_k`` below
            1, or ``stacks`` other than ``"python"`` or ``"all"``.

    Example::

        trainer = Trainer(callbacks=[MemorySnapshot(on_oom=True, steps=[100, 102])])
    """

    section_name = "memory_snapshot"
    _transient = ("_backend",)

    def __init__(
        self,
        on_oom: bool = True,
        steps: Optional[List[int]] = None,
        max_entries: int = 100_000,
        stacks: str = "python",
        top_k: int = 10,
        html: bool = True,
        snapshot_dir: Optional[str] = None,
        summary_path: Optional[str] = None,
        run_name: Optional[str] = None,
        run_notes: Optional[str] = None,
    ) -> None:
        super().__init__(summary_path=summary_path, run_name=run_name, run_notes=run_notes)
        self.on_oom = check_bool("MemorySnapshot", "on_oom", on_oom)
        if steps is not None and (not isinstance(steps, (list, tuple)) or len(steps) != 2 or any(
                isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in steps) or steps[0] > steps[1]):
            raise bad_argument("MemorySnapshot", "steps", steps,
                               "Expected [first, last]: two global steps, 1 <= first <= last, or None.")
        self.steps = list(steps) if steps is not None else None
        check_positive_int("MemorySnapshot", "max_entries", max_entries)
        check_positive_int("MemorySnapshot", "top_k", top_k)
        if stacks not in STACKS:
            raise bad_argument("MemorySnapshot", "stacks", stacks, f"Possible choices are: {', '.join(STACKS)}.")
        self.max_entries, self.stacks, self.top_k = max_entries, stacks, top_k
        self.html = check_bool("MemorySnapshot", "html", html)
        self.snapshot_dir = check_path("MemorySnapshot", "snapshot_dir", snapshot_dir)
        self._backend: Any = None
        self._snapshots: List[Dict[str, Any]] = []
        self._reset_run()

    def _reset_run(self) -> None:
        self._recording = False
        self._recorded = False
        self._window_open = False
        self._first = self.steps[0] if self.steps else _NEVER
        self._step = 0
        self._dir = ""
        self._stage = "fit"
        self._unavailable: Dict[str, str] = {}

    def _device(self, trainer: Trainer) -> Any:
        return trainer.strategy.root_device

    # -- set-up and tear-down ----------------------------------------------------------------------------------------
    @guarded
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop_recording()
        self._snapshots = []
        self._reset_run()
        self._start_run(trainer, stage)
        self._stage = str(getattr(stage, "value", stage))
        root = trainer.log_dir or trainer.default_root_dir
        self._dir = self.snapshot_dir or os.path.join(str(root), "memory_snapshots")
        device = self._device(trainer)
        if device.type != "cuda":
            self._unavailable["recording"] = f"the allocator's history is CUDA's; this run is on {device.type}"
            self._warn_once("cpu", f"no CUDA allocator on {device.type}: no memory snapshot is recorded.")
            self._first = _NEVER
            return
        self._backend = snapshots.memory_backend()
        if self.on_oom:
            self._start_recording()

    def _start_recording(self) -> None:
        if not self._recording:
            snapshots.start_recording(self._backend, self.max_entries, self.stacks)
            self._recording = self._recorded = True

    def _stop_recording(self) -> None:
        if self._recording:
            self._recording = False
            try:
                snapshots.stop_recording(self._backend)
            except Exception as err:  # noqa: BLE001
                self._record_failure("stop_recording", err)

    @guarded
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop_recording()
        self._flush_summary(trainer)

    # -- the window: opened at the batch end before it (its first batch's transfer to the device included) ---------
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        try:
            if self._first == _NEVER and not self._window_open:
                return
            self._step = trainer.global_step
            if self._window_open and self._step >= self.steps[1]:  # type: ignore[index]
                self._window_open = False
                began = now()
                self._dump(trainer, "steps", f"steps_{self.steps[0]}-{self.steps[1]}")  # type: ignore[index]
                if not self.on_oom:
                    self._stop_recording()
                OWN_WORK.add(now() - began)
            elif not self._window_open and self._step + 1 >= self._first:
                self._open_window()
        except Exception as err:  # noqa: BLE001 - `guarded`, inline
            self._record_failure("on_train_batch_end", err)

    def _open_window(self) -> None:
        self._first = _NEVER
        self._window_open = True
        self._start_recording()

    @guarded
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._step = trainer.global_step
        if self.steps and self._step >= self.steps[1]:
            self._first = _NEVER
            self._unavailable["steps"] = f"the run started (or resumed) at step {self._step}, after the window"
        elif self._step + 1 >= self._first:  # a window from the first iteration on (or a resume inside it)
            self._open_window()

    # -- dumps ---------------------------------------------------------------------------------------------------
    def _dump(self, trainer: Trainer, trigger: str, name: str) -> None:
        if not self._recording:
            return
        began = now()
        rank = f".rank{trainer.global_rank}" if trainer.world_size > 1 else ""
        running = getattr(getattr(trainer.state, "stage", None), "value", None)  # train, validate, sanity_check, ...
        # in training, an OOM's step is the iteration that failed (the tail's numbering: the step at its end)
        step = trainer.global_step + (1 if trigger == "oom" and running == "train" else 0)
        prefix = "" if self._stage == "fit" else f"{self._stage}_"
        taken = snapshots.dump(self._backend, os.path.join(self._dir, f"{prefix}{name}{rank}"), self.html, self.top_k)
        entry = {"trigger": trigger, "stage": self._stage, "phase": running, "step": step, **taken,
                 "history_full": taken["trace_entries"] >= self.max_entries, "dump_ms": 1000.0 * (now() - began)}
        self._snapshots.append(entry)
        if trainer.is_global_zero:
            rank_zero_info(snapshot_line(entry))

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if snapshots.is_out_of_memory(exception):
            if self._recording:
                self._dump(trainer, "oom", f"oom_after_step_{trainer.global_step}")
            else:
                self._unavailable["oom"] = ("out of memory, but the allocator's history was not being recorded"
                                            + (f" ({self._unavailable['recording']})" if "recording" in
                                               self._unavailable else " (`on_oom=False`)"))
        self._stop_recording()  # Lightning calls no teardown hook after an exception
        self._write_summary(trainer, exception)

    @guarded
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write_summary(trainer)

    # -- results -------------------------------------------------------------------------------------------------
    @property
    def snapshots(self) -> List[Dict[str, Any]]:
        """The dumps of this run so far: ``path``, ``html``, ``top_allocations``, ``failed_request``, ..."""
        return [dict(s) for s in self._snapshots]

    def _summary_section(self) -> Dict[str, Any]:
        unavailable = dict(self._unavailable)
        if self.steps and self._first != _NEVER:
            unavailable.setdefault("steps", f"the run ended before step {self.steps[0]}")
        return {"on_oom": self.on_oom, "steps": self.steps, "max_entries": self.max_entries, "stacks": self.stacks,
                "recorded": self._recorded, "snapshot_dir": os.path.abspath(self._dir) if self._dir else None,
                "snapshots": self.snapshots, "unavailable": unavailable}

    def state_dict(self) -> Dict[str, Any]:
        return {"snapshots": self.snapshots}

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        kept = state_dict.get("snapshots")
        if isinstance(kept, list):  # dumps of before a resume stay in the summary
            self._snapshots = [dict(s) for s in kept if isinstance(s, dict)]


def snapshot_line(entry: Dict[str, Any]) -> str:
    """One dump in one line: why, where, and the allocation most likely to matter."""
    text = f"MemorySnapshot: {when(entry)}: snapshot {entry.get('path')}"
    views = entry.get("html") or {}
    if views:
        text += " (HTML: " + ", ".join(views.values()) + ")"
    failed = entry.get("failed_request")
    if failed:
        text += f"; the failed request: {failed['size_mb']:.1f} MiB from {failed.get('frame') or 'an unknown frame'}"
    top = (entry.get("top_allocations") or [None])[0]
    if top:
        text += f"; the largest live allocation: {top['size_mb']:.1f} MiB from {top.get('frame') or 'an unknown frame'}"
    return text
