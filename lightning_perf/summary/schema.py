"""The perf_summary.json file's constants (version, statuses, section names) and its error; the checks a reader
applies are the typed definition in :mod:`lightning_perf.summary.model` (``validate`` there), which imports these."""

from __future__ import annotations

SCHEMA_VERSION = 2
SUMMARY_FILENAME = "perf_summary.json"
STATUSES = ("running", "completed", "failed", "interrupted")

#: Section name of each callback, in the order they are shown.
SECTIONS = ("iteration_timer", "section_profiler", "vram", "eval_no_grad_guard", "quality_gate")


class SummaryError(ValueError):
    """A summary file is missing, unreadable, not JSON, or not of a schema this version reads."""
