"""The summary file: schema, atomic writer, reader, compare and report. Needs no torch."""

from lightning_perf.summary.io import load_summary, write_json_atomic
from lightning_perf.summary.schema import SCHEMA_VERSION, SECTIONS, SUMMARY_FILENAME, SummaryError, validate

__all__ = [
    "SCHEMA_VERSION",
    "SECTIONS",
    "SUMMARY_FILENAME",
    "SummaryError",
    "load_summary",
    "validate",
    "write_json_atomic",
]
