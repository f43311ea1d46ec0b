"""A sweep's rounds: every (size, batch) configuration measured once a round, rounds interleaved, one CSV row per
configuration and round (a sweep's rows of one configuration are its rounds, in order). Here they are combined into
one row per configuration, keeping each round's rates for the intervals between rounds. Needs no torch."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Optional, Tuple

from lightning_perf.bench.noise_floor import MIN_EFFECT_PCT, ratio_between

#: ``bench --rounds``' default: 3 rounds, the least whose spread gives an interval with 4 degrees of freedom between
#: two configurations; a configuration's rounds cost no new process (the sweep's model factory runs once a round).
DEFAULT_ROUNDS = 3

_KEY = ("sweep_id", "mode", "device", "precision", "tile_size", "batch_size")


def _geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def combine_rounds(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per configuration of each sweep, in first-seen order: the time is the geometric mean of the rounds'
    mean times (the rates follow from it), ``std_time_ms`` the mean of the rounds' spreads over iterations, the peak
    memory the largest; ``rounds`` (rounds with a figure), ``between_rounds_pct`` (the spread of the rounds' times,
    std of their logs in %, None with one round), ``round_errors`` (what rounds failed), and each round's samples/s
    and pixels/s in ``_samples_rounds`` / ``_pixels_rounds`` (None for a failed round), for the intervals."""
    grouped: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = {}
    for r in rows:
        grouped.setdefault(tuple(r.get(k) for k in _KEY), []).append(r)
    out = []
    for group in grouped.values():
        ok = [r for r in group if not r.get("error") and r.get("throughput_samples_per_sec") and r.get("avg_time_ms")]
        row = dict(ok[-1] if ok else group[-1])
        if len(ok) > 1:
            mean = _geomean([r["avg_time_ms"] for r in ok])
            batch, size = row["batch_size"], row["tile_size"]
            peaks = [r["memory_peak_mb"] for r in ok if r.get("memory_peak_mb") is not None]
            row.update(avg_time_ms=mean, total_time_ms=mean,
                       std_time_ms=statistics.fmean(r["std_time_ms"] or 0.0 for r in ok),
                       throughput_samples_per_sec=batch * 1000.0 / mean,
                       pixels_per_sec=batch * size * size * 1000.0 / mean,
                       memory_peak_mb=max(peaks) if peaks else None)
            for key in ("forward_time_ms", "backward_time_ms", "optimizer_time_ms"):
                known = [r[key] for r in ok if r.get(key) is not None]
                row[key] = statistics.fmean(known) if known else None
            row["efficiency_pixels_per_sec_per_mb"] = (row["pixels_per_sec"] / row["memory_peak_mb"]
                                                       if row["memory_peak_mb"] else None)
        row["rounds"] = len(ok)
        row["between_rounds_pct"] = (100.0 * statistics.stdev(math.log(r["avg_time_ms"]) for r in ok)
                                     if len(ok) > 1 else None)
        row["round_errors"] = "; ".join(f"round {k}: {r['error']}" for k, r in enumerate(group, start=1)
                                        if r.get("error")) if ok else ""
        counted = {id(r) for r in ok}
        row["_samples_rounds"] = [r.get("throughput_samples_per_sec") if id(r) in counted else None for r in group]
        row["_pixels_rounds"] = [r.get("pixels_per_sec") if id(r) in counted else None for r in group]
        out.append(row)
    return out


def rounds_of(rows: List[Dict[str, Any]]) -> int:
    """The fewest rounds of the configurations in ``rows`` (1 for rows not combined)."""
    return min((r.get("rounds") or 1 for r in rows), default=1)


def between_rounds(new: List[Optional[float]], old: List[Optional[float]],
                   min_effect_pct: float = MIN_EFFECT_PCT) -> Optional[Dict[str, Any]]:
    """The change from ``old`` to ``new`` (per-round rates, or per-round ratios) between rounds: ``change_pct``,
    ``low_pct``/``high_pct`` (95%), ``sign`` (+1/-1 where the interval excludes no change and the change is at least
    ``min_effect_pct``, else 0) and ``rounds``; None with fewer than two rounds a side."""
    cmp = ratio_between(new, old)
    if cmp["low"] is None:
        return None
    change = 100.0 * (cmp["ratio"] - 1.0)
    beyond = (cmp["low"] > 1.0 or cmp["high"] < 1.0) and abs(change) >= min_effect_pct
    return {"change_pct": change, "low_pct": 100.0 * (cmp["low"] - 1.0), "high_pct": 100.0 * (cmp["high"] - 1.0),
            "sign": 0 if not beyond else (1 if change > 0 else -1), "rounds": min(cmp["runs"])}


def interval_words(found: Dict[str, Any]) -> str:
    """``95% CI -3% to +5% between 3 rounds``."""
    return f"95% CI {found['low_pct']:+.0f}% to {found['high_pct']:+.0f}% between {found['rounds']} rounds"


def per_round_ratio(top: List[Optional[float]], bottom: List[Optional[float]]) -> List[Optional[float]]:
    """Round by round, ``top / bottom`` (the rounds pair up: the same round measured both)."""
    return [t / b if t and b else None for t, b in zip(top, bottom)]
