"""Quality baselines: reading one (a dict, a baseline file or an earlier perf_summary.json), writing one, and the
verdict of a value against it. Pure Python."""

from __future__ import annotations

import json
import math
from typing import Any, Dict, Optional

from lightning_perf.summary.io import write_json_atomic

BASELINE_KIND = "lightning_perf.quality_baseline"


class BaselineError(ValueError):
    """A baseline is missing, not JSON, or lacks what is gated."""


def read_baseline(source: Any) -> Dict[str, float]:
    """metric -> baseline value, from a dict, a file written by :func:`write_baseline`, or a perf_summary.json."""
    return read_baseline_with_gaps(source)[0]


def read_baseline_with_gaps(source: Any) -> "tuple[Dict[str, float], Dict[str, str]]":
    """(metric -> value, metric -> why the baseline run could not measure it)."""
    gaps: Dict[str, str] = {}
    if isinstance(source, dict):
        data: Any = source
        where = "baseline dict"
    else:
        where = str(source)
        try:
            with open(where, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            raise BaselineError(f"baseline file {where!r} does not exist") from None
        except (OSError, UnicodeDecodeError) as err:
            raise BaselineError(f"baseline file {where!r} cannot be read: {err}") from None
        except json.JSONDecodeError as err:
            raise BaselineError(f"baseline file {where!r} is not valid JSON ({err.msg} at line {err.lineno})") from None
        if not isinstance(data, dict):
            raise BaselineError(f"baseline file {where!r} must hold a JSON object")
        if data.get("kind") == BASELINE_KIND:
            data = data.get("metrics", {})
        elif "schema_version" in data:  # an earlier run's perf_summary.json
            section = data.get("quality_gate") or {}
            metrics = section.get("metrics")
            if not isinstance(metrics, dict):
                raise BaselineError(f"{where!r} is a perf_summary.json without a quality_gate section")
            unavailable = section.get("unavailable") or {}
            gaps = {k: str(v) for k, v in unavailable.items() if k not in metrics and k not in ("passed", "metrics")}
            data = {k: v.get("value") for k, v in metrics.items() if isinstance(v, dict)}
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
    return values, gaps


def read_baseline_meta(source: Any) -> Dict[str, Any]:
    """What a baseline says about how it was measured: ``{"images": n, "step": s}``, each when known (a baseline
    file or a summary that recorded it: ``step`` is the global step of its last check), else ``{}``. Never raises:
    the values were read (and checked) already."""
    if isinstance(source, dict):
        return {}
    try:
        with open(str(source), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    if data.get("kind") == BASELINE_KIND:
        found = {"images": data.get("images"), "step": data.get("step")}
    else:
        gate = data.get("quality_gate") if isinstance(data.get("quality_gate"), dict) else {}
        found = {"images": gate.get("images_scored"), "step": gate.get("step")}
    return {k: v for k, v in found.items() if isinstance(v, int) and not isinstance(v, bool) and v >= 0}


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
