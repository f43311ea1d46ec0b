"""Time to N iterations from a run's iteration_timer section: training only, and with evaluation at its cadence.

Pure Python on summary dicts, shared by IterationTimer (which writes the projection into its section) and
`lightning-perf compare` (which projects both runs to the same N).
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Tuple


def _num(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def project_time(section: Dict[str, Any], n: int, done: int = 0) -> Dict[str, Optional[float]]:
    """Seconds for iterations ``done`` .. ``n`` of a run like this one.

    Training: the mean ms/iter over measured iterations (every iteration after the warm-up, its round trip with
    data waits, epoch starts, checkpoint saves and stalls included) times the iterations, plus the warm-up's extra
    cost (its measured time beyond the mean, per fit) when ``done`` is 0. With evaluation: plus the run's mean time
    per validation times the validations N iterations trigger at the run's observed cadence (validations per
    iteration). A summary of schema 1 has no warm-up time or validation count: its figures are training-only from
    the mean and ``with_eval_s`` is None.

    Returns:
        ``{"train_s": ..., "with_eval_s": ...}``, None where the run has no measured iteration.
    """
    stats = section.get("ms_per_iter") if isinstance(section.get("ms_per_iter"), dict) else {}
    mean_ms = _num(stats.get("mean"))
    if mean_ms is None or n < 0:
        return {"train_s": None, "with_eval_s": None}
    left = max(0, n - done)
    train = left * mean_ms / 1000.0
    if done == 0:
        warm_time = _num(section.get("warmup_time_s"))
        warm_iters = _num((section.get("excluded") or {}).get("warmup")) or 0.0
        fits = max(1.0, _num(section.get("fits")) or 1.0)
        if warm_time is not None:
            train += max(0.0, warm_time - warm_iters * mean_ms / 1000.0) / fits
    runs = _num(section.get("validation_runs"))
    iterations = _num(section.get("iterations"))
    eval_s = _num(section.get("eval_time_s"))
    with_eval = None
    if runs is not None and eval_s is not None:
        if runs == 0 or not iterations:
            with_eval = train
        else:
            with_eval = train + (eval_s / runs) * (runs / iterations) * left
    return {"train_s": train, "with_eval_s": with_eval}


def _missing(section: Dict[str, Any], names: tuple) -> Optional[str]:
    """The first figure of ``names`` that is missing or not a finite number >= 0, as a reason; None when all are."""
    for name in names:
        value = _num(section.get(name))
        if value is None or not math.isfinite(value) or value < 0:
            return f"no {name}" + (" (a summary written before lightning_perf measured it)"
                                   if name == "startup_time_s" and section.get(name) is None else "")
    return None


def warmup_cost(section: Dict[str, Any]) -> Tuple[Optional[float], Optional[str]]:
    """Seconds a fit of a run like this one spends from its start to its first measured iteration beyond the steady
    pace: the startup (IterationTimer's ``setup`` to the training loop: model setup, ``configure_model`` where
    ``torch.compile`` wraps, the sanity check) plus the warm-up iterations' time beyond as many iterations at the
    mean, per fit. It is what :func:`project_time` adds to N x mean, plus the startup.

    Returns:
        ``(seconds, None)``, or ``(None, reason)`` when a figure it needs is missing or not finite.
    """
    stats = section.get("ms_per_iter") if isinstance(section.get("ms_per_iter"), dict) else {}
    mean_ms = _num(stats.get("mean"))
    if mean_ms is None or not 0.0 < mean_ms < math.inf:
        return None, "no measured iteration (mean ms/iter)"
    reason = _missing(section, ("startup_time_s", "warmup_time_s", "fits"))
    if reason is None and not _num(section.get("fits")):
        reason = "no fit reached training"
    if reason is not None:
        return None, reason
    fits = float(section["fits"])
    extra = project_time(section, 0)["train_s"] or 0.0
    cost = float(section["startup_time_s"]) / fits + extra
    return (cost, None) if math.isfinite(cost) else (None, "the warm-up figures give no finite time")


def end_to_end_time(section: Dict[str, Any], n: float) -> Tuple[Optional[float], Optional[str]]:
    """Seconds for a whole fit of ``n`` iterations like this run: its warm-up cost (:func:`warmup_cost`), ``n`` x the
    mean ms/iter, and evaluation at the run's cadence (its evaluation time per iteration, as :func:`project_time`'s
    ``with_eval_s``). At the run's own length this is its startup + train time + eval time.

    Returns:
        ``(seconds, None)``, or ``(None, reason)`` when a figure it needs is missing or not finite.
    """
    cost, reason = warmup_cost(section)
    if cost is None:
        return None, reason
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n < 0:
        return None, f"no iteration count to project to ({n!r})"
    reason = _missing(section, ("validation_runs", "eval_time_s"))
    if reason is not None:
        return None, reason
    runs, iterations = float(section["validation_runs"]), _num(section.get("iterations"))
    eval_per_iteration = float(section["eval_time_s"]) / iterations if runs and iterations else 0.0
    total = cost + n * (float(section["ms_per_iter"]["mean"]) / 1000.0 + eval_per_iteration)
    return (total, None) if math.isfinite(total) else (None, "the figures give no finite time")
