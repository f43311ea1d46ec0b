"""Quality baselines: reading one (a dict, a baseline file or an earlier perf_summary.json), writing one, and the
verdict of a value against it. Pure Python."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple

from lightning_perf.summary.io import read_json, write_json_atomic
from lightning_perf.summary.schema import SummaryError

BASELINE_KIND = "lightning_perf.quality_baseline"
#: The tolerance of a quality gate unless told otherwise: seed 001's +-0.5%, relative to the baseline.
DEFAULT_TOLERANCE = 0.005


class BaselineError(ValueError):
    """A baseline is missing, not JSON, or lacks what is gated."""


def read_baseline(source: Any) -> Dict[str, float]:
    """metric -> baseline value, from a dict, a file written by :func:`write_baseline`, or a perf_summary.json."""
    return load_baseline(source)[0]


def read_baseline_with_gaps(source: Any) -> Tuple[Dict[str, float], Dict[str, str]]:
    """(metric -> value, metric -> why the baseline run could not measure it)."""
    values, gaps, _ = load_baseline(source)
    return values, gaps


def read_baseline_meta(source: Any) -> Dict[str, Any]:
    """What a baseline says about how it was measured (see :func:`load_baseline`); ``{}`` where it cannot be read."""
    try:
        return load_baseline(source)[2]
    except BaselineError:
        return {}


def load_baseline(source: Any) -> Tuple[Dict[str, float], Dict[str, str], Dict[str, Any]]:
    """(metric -> value, metric -> why the baseline run could not measure it, how it was measured), the file read
    once. How it was measured: ``{"images": n, "step": s}``, each when known (a baseline file or a summary that
    recorded it: ``step`` is the global step of its last check); ``{}`` for a dict.

    Raises:
        BaselineError: one line: a file the CLI's readers would refuse (missing, empty, not JSON, nested too
            deeply: their words), not a JSON object, a summary without a quality_gate section, a value not a finite
            number.
    """
    gaps: Dict[str, str] = {}
    meta: Dict[str, Any] = {}
    if isinstance(source, dict):
        data: Any = source
        where = "baseline dict"
    else:
        where = str(source)
        try:
            data = read_json(where)
        except SummaryError as err:
            raise BaselineError(f"baseline file {err}") from None
        if not isinstance(data, dict):
            raise BaselineError(f"baseline file {where!r} must hold a JSON object")
        if data.get("kind") == BASELINE_KIND:
            meta = {"images": data.get("images"), "step": data.get("step")}
            data = data.get("metrics", {})
        elif "schema_version" in data:  # an earlier run's perf_summary.json
            section = data.get("quality_gate") or {}
            metrics = section.get("metrics") if isinstance(section, dict) else None
            if not isinstance(metrics, dict):
                raise BaselineError(f"{where!r} is a perf_summary.json without a quality_gate section")
            meta = {"images": section.get("images_scored"), "step": section.get("step")}
            unavailable = section.get("unavailable") or {}
            gaps = {k: str(v) for k, v in unavailable.items() if k not in metrics and k not in ("passed", "metrics")}
            data = {k: v.get("value") for k, v in metrics.items() if isinstance(v, dict)}
        if not isinstance(data, dict):
            raise BaselineError(f"baseline file {where!r}: `metrics` must be a JSON object")
    values: Dict[str, float] = {}
    for name, value in data.items():
        if isinstance(value, dict):
            value = value.get("value")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BaselineError(f"{where}: metric {name!r} has a non-numeric baseline {value!r}")
        if not math.isfinite(value):
            raise BaselineError(f"{where}: metric {name!r} has a baseline of {value!r}; expected a finite number")
        values[str(name)] = float(value)
    meta = {k: v for k, v in meta.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}
    return values, gaps, meta


def write_baseline(path: str, metrics: Dict[str, Dict[str, Any]], step: Optional[int],
                   images: Optional[int] = None) -> None:
    """Writes metric values and directions (and how many images were scored) as a baseline file, atomically."""
    write_json_atomic(path, {
        "kind": BASELINE_KIND,
        "step": step,
        "images": images,
        "metrics": {name: {"value": m["value"], "mode": m["mode"]} for name, m in metrics.items()
                    if m.get("value") is not None},
    })


def verdict(value: float, baseline: float, mode: str, tolerance: float, relative: bool) -> Dict[str, Any]:
    """Whether ``value`` is within tolerance of ``baseline`` in the bad direction of ``mode`` ("max" or "min")."""
    allowed = tolerance * abs(baseline) if relative else tolerance
    delta = value - baseline
    passed = delta >= -allowed if mode == "max" else delta <= allowed
    return {
        "value": value,
        "baseline": baseline,
        "delta": delta,
        "delta_pct": 100.0 * delta / abs(baseline) if baseline else None,
        "tolerance": tolerance,
        "tolerance_mode": "relative" if relative else "absolute",
        "allowed_delta": allowed,
        "mode": mode,
        "passed": passed,
    }


def gate_baseline(source: Any, gated: Any) -> Tuple[Dict[str, float], Dict[str, str], Dict[str, Any]]:
    """:func:`load_baseline` for a gate of the metrics ``gated``: (values, gated metric -> why it is not gated, how it
    was measured). A metric the baseline run could not measure (LPIPS offline) is not gated; one it lacks is an error.

    Raises:
        BaselineError: as :func:`load_baseline`, or the baseline lacks a gated metric.
    """
    values, gaps, meta = load_baseline(source)
    not_gated = {m: f"the baseline run could not measure it: {gaps[m]}" for m in gated if m not in values and m in gaps}
    missing = [m for m in gated if m not in values and m not in gaps]
    if missing:
        raise BaselineError(f"It lacks gated metric(s) {', '.join(missing)}; it has:"
                            f" {', '.join(sorted(values)) or 'nothing'}.")
    return values, not_gated, meta
