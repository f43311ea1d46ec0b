"""A quality gate's tolerances: one value, or one per gated metric, checked at construction."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Sequence

from lightning_perf.callbacks.core.arguments import bad_argument

TOLERANCE_MODES = ("relative", "absolute")
DEFAULT_TOLERANCE_MODE = "relative"
#: The largest tolerance accepted: a baseline times a larger one can overflow to infinity, a gate that never fails.
MAX_TOLERANCE = 1e6


def check_tolerance(owner: str, name: str, value: Any) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or not math.isfinite(value)
            or value > MAX_TOLERANCE):
        raise bad_argument(owner, name, value, f"Expected a tolerance from 0 to {MAX_TOLERANCE:g} (0.005 is 0.5%"
                           " when relative; a larger one overflows with the baseline and can never fail).")
    return float(value)


def check_tolerance_mode(owner: str, name: str, value: Any) -> str:
    if value not in TOLERANCE_MODES:
        raise bad_argument(owner, name, value, f"Possible choices are: {', '.join(TOLERANCE_MODES)}.")
    return value


def per_metric(owner: str, name: str, value: Any, gated: Sequence[str], check: Callable[[str, str, Any], Any],
               default: Any) -> Dict[str, Any]:
    """One value for every gated metric: a single value for all, or a dict (unnamed metrics get ``default``)."""
    if isinstance(value, dict):
        unknown = [k for k in value if k not in gated]
        if unknown:
            raise bad_argument(owner, name, value, f"Unknown metric(s) {', '.join(unknown)}; gated metrics are:"
                               f" {', '.join(gated)}.")
        return {m: check(owner, name, value.get(m, default)) for m in gated}
    checked = check(owner, name, value)
    return {m: checked for m in gated}
