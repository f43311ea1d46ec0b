"""The summary file: its typed definition, atomic writer, reader, compare and report. Needs no torch."""

from lightning_perf.summary.io import load_summary, read_summary, write_json_atomic
from lightning_perf.summary.model import PerfSummary, validate
from lightning_perf.summary.schema import SCHEMA_VERSION, SECTIONS, SUMMARY_FILENAME, SummaryError

__all__ = [
    "PerfSummary",
    "SCHEMA_VERSION",
    "SECTIONS",
    "SUMMARY_FILENAME",
    "SummaryError",
    "load_summary",
    "read_summary",
    "validate",
    "write_json_atomic",
]
