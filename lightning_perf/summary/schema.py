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
    _check_numbers(data, source)
    return data


#: Figures that compare and report compute with: each must be a number or null where present.
_NUMERIC = {
    "iteration_timer": ("iterations", "measured_iterations", "it_per_s", "samples_per_s", "batches_per_s",
                        "train_time_s", "eval_time_s", "warmup_time_s", "validation_runs", "fits"),
}
_NUMERIC_MAPS = {("iteration_timer", "ms_per_iter"), ("iteration_timer", "excluded")}


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _check_numbers(data: Dict[str, Any], source: str) -> None:
    """A schema-valid file with ``"ms_per_iter": {"mean": "fast"}`` is refused here, with the field named."""
    for section, fields in _NUMERIC.items():
        sec = data.get(section)
        if not isinstance(sec, dict):
            continue
        for field in fields:
            if field in sec and not _is_number(sec[field]):
                raise SummaryError(f"{source}: `{section}.{field}` must be a number or null, got {sec[field]!r}")
    for section, field in _NUMERIC_MAPS:
        values = (data.get(section) or {}).get(field) if isinstance(data.get(section), dict) else None
        if values is None:
            continue
        if not isinstance(values, dict):
            raise SummaryError(f"{source}: `{section}.{field}` must be an object")
        for key, value in values.items():
            if not _is_number(value):
                raise SummaryError(f"{source}: `{section}.{field}.{key}` must be a number or null, got {value!r}")
    phases = (data.get("vram") or {}).get("phases") if isinstance(data.get("vram"), dict) else None
    for phase, values in (phases or {}).items() if isinstance(phases, dict) else ():
        for key, value in (values or {}).items() if isinstance(values, dict) else ():
            if not _is_number(value):
                raise SummaryError(f"{source}: `vram.phases.{phase}.{key}` must be a number or null, got {value!r}")
    metrics = (data.get("quality_gate") or {}).get("metrics") if isinstance(data.get("quality_gate"), dict) else None
    for name, entry in (metrics or {}).items() if isinstance(metrics, dict) else ():
        if isinstance(entry, dict) and not _is_number(entry.get("value")):
            raise SummaryError(f"{source}: `quality_gate.metrics.{name}.value` must be a number or null,"
                               f" got {entry.get('value')!r}")
