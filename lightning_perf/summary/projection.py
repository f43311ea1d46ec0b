"""Time to N iterations from a run's iteration_timer section: training only, and with evaluation at its cadence.

Pure Python on summary dicts, shared by IterationTimer (which writes the projection into its section) and
`lightning-perf compare` (which projects both runs to the same N).
"""

from __future__ import annotations

from typing import Any, Dict, Optional


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
