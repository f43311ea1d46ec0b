"""The perf_summary.json schema: version, statuses, section names and the checks a reader applies."""

from __future__ import annotations

from typing import Any, Dict

SCHEMA_VERSION = 2
SUMMARY_FILENAME = "perf_summary.json"
STATUSES = ("running", "completed", "failed", "interrupted")

#: Section name of each callback, in the order they are shown.
SECTIONS = ("iteration_timer", "section_profiler", "vram", "eval_no_grad_guard", "quality_gate")


class SummaryError(ValueError):
    """A summary file is missing, unreadable, not JSON, or not of a schema this version reads."""


def validate(data: Any, source: str = "<summary>") -> Dict[str, Any]:
    """Checks the top level of a summary and returns it; raises :class:`SummaryError` naming what is wrong."""
    if not isinstance(data, dict):
        raise SummaryError(f"{source}: expected a JSON object at the top level, got {type(data).__name__}")
    version = data.get("schema_version")
    if version is None:
        raise SummaryError(f"{source}: no `schema_version`; this is not a lightning_perf summary")
    if not isinstance(version, int) or version < 1 or version > SCHEMA_VERSION:
        raise SummaryError(
            f"{source}: unsupported schema_version {version!r}; this lightning_perf reads versions 1..{SCHEMA_VERSION}"
        )
    status = data.get("status")
    if status not in STATUSES:
        raise SummaryError(f"{source}: unknown status {status!r}; expected one of {', '.join(STATUSES)}")
    if not isinstance(data.get("run"), dict):
        raise SummaryError(f"{source}: `run` must be an object")
    for name in SECTIONS:
        if name in data and data[name] is not None and not isinstance(data[name], dict):
            raise SummaryError(f"{source}: section `{name}` must be an object")
    return data
