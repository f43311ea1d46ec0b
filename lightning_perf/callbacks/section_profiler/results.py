"""SectionProfiler's results: its table, findings and console report, and its summary section (``section_profiler`` in
the summary file), read from the ledger (any read: nothing here changes the profiler)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from lightning_perf.callbacks.section_profiler import fetch_marks
from lightning_perf.measure.sections.report import THRESHOLDS, final_table, insights, slowest_section

SYNC_REASON = ("no separate section: DDP all-reduces gradients inside backward, overlapped with it, so that time is"
               " part of `backward`; timing it apart would need a DDP communication hook installed on your model,"
               " which a measurement must not do. `ranks` shows each rank's sections: a straggler's data loading or"
               " forward is what the others wait for, and `diagnosis.straggler` names it.")
SINGLE_DEVICE_SYNC_REASON = ("no separate section: a run on a single device has no gradients to synchronize with"
                             " other devices")


class Results:
    """SectionProfiler's table, findings, report and summary section, as methods of the profiler (one of its
    bases)."""

    def table(self) -> Dict[str, Dict[str, Any]]:
        """Per section: count, total, mean, min, max, p50, p95, share, device mean (``SectionLedger.table``)."""
        return self._ledger.table()

    def insights(self, table: Optional[Dict[str, Dict[str, Any]]] = None) -> List[str]:
        """Plain-language findings (``measure.sections.report.insights``)."""
        return insights(self.table() if table is None else table, self._workers)

    def slowest_section(self, table: Optional[Dict[str, Dict[str, Any]]] = None) -> Optional[str]:
        """The automatic or top-level user section with the largest total (nested user sections are inside theirs)."""
        return slowest_section(self.table() if table is None else table)

    def format_report(self) -> str:
        table = self.table()
        return final_table(table, self._ledger.iteration.host, self._ledger.final_row, self.insights(table))

    def _summary_section(self) -> Dict[str, Any]:
        ledger = self._ledger
        table = self.table()
        unavailable: Dict[str, str] = {}
        if self._disabled_reason:
            unavailable["sections"] = self._disabled_reason
        if ledger.manual:
            unavailable["forward"] = ("manual optimization: the forward is in training_step with the rest of the step"
                                      " (backward and optimizer_step are carved out of it)")
            if self._steps_reason:
                unavailable["optimizer_step"] = self._steps_reason
        if self._device is None:
            unavailable["device_mean_ms"] = "device timing needs CUDA" if self.device_timing else "switched off"
        unavailable["synchronization"] = SINGLE_DEVICE_SYNC_REASON if self._world_size == 1 else SYNC_REASON
        if ledger.gap_mode and self.data_loading_boundary == "fetch":
            unavailable["data_loading_fetch"] = fetch_marks.GAP_REASON
        if self._checkpoint_reason:
            unavailable["checkpointing"] = self._checkpoint_reason
        if self._active and self._workers_reason and (self._workers is not None or ledger.iteration.host.count
                                                      or self._workers_at_stop):
            unavailable["workers"] = self._workers_reason
        if self._active and ledger.final_row is None:
            unavailable["after_last_iteration"] = (
                "no iteration ended in this fit" if ledger.fit_iterations == 0 else
                "the fit did not reach its end (on_fit_end): the work after the last iteration is not complete")
        return {
            "enabled": self._active,
            "data_loading_boundary": "batch_gap" if ledger.gap_mode else "fetch",
            "workers": self._workers,
            "manual_optimization": ledger.manual,
            "warmup_steps": self.warmup_steps,
            "device_timing_every_n_iterations": self.device_timing_every_n_iterations,
            "iterations": ledger.iteration.host.count,
            "iteration_ms": ledger.iteration.host.summary(),
            "sections": table,
            "slowest_section": self.slowest_section(table),
            "insights": self.insights(table),
            "validation": {"runs": ledger.validation_runs, "total_s": ledger.validation_s},
            "after_last_iteration": ledger.final_row,
            "slowest_iterations": ledger.slowest_iterations(table),
            "overhead_us_per_step": 1e6 * self._overhead_s / max(1, ledger.iterations) if self._active else None,
            "report_every_n_steps": self.report_every_n_steps,
            "ranks": self._ranks,
            "unavailable": unavailable,
            "thresholds": dict(THRESHOLDS),
        }
