"""The straggler of a DDP run: the rank the others wait for, and its section that makes it slow, from SectionProfiler's
per-rank section means (``section_profiler.ranks``). Pure Python on the summary (docs/diagnosis.md#stragglers)."""

from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from lightning_perf.summary.evidence import read_field as _get
from lightning_perf.summary.fields import fixed

#: A rank is the straggler when its own time in an iteration (every section but the one the ranks synchronise in)
#: exceeds the other ranks' median by at least this % of iteration time: the others wait that long for it.
STRAGGLER_LAG_PCT = 15.0
#: Where DDP's ranks meet (the gradient all-reduce): the others' wait for a straggler lands here, so it is never a
#: straggler's own section. Under manual optimization the step, backward included, is one ``training_step``.
SYNC_SECTIONS = ("backward", "training_step")


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def _per_rank(spread: Any) -> Optional[List[float]]:
    """A section's per-rank means where every rank has one (a section one rank alone runs, rank 0's checkpoint
    writes, has per-write means that do not add up to the others' iterations), else None."""
    values = [_number(v) for v in (_get(spread, "per_rank") or [])]
    return values if len(values) >= 2 and all(v is not None for v in values) else None  # type: ignore[misc]


def _others(values: List[float], rank: int) -> float:
    return statistics.median(v for r, v in enumerate(values) if r != rank)


def straggler(summary: Any) -> Optional[Dict[str, Any]]:
    """The rank the others wait for under DDP, or None (one process, no per-rank figures, or no rank that far out).

    Each rank's own time is the sum of its automatic sections' means but the sync section (``SYNC_SECTIONS``): the
    rank with the most is the straggler when it exceeds the other ranks' median by ``STRAGGLER_LAG_PCT`` % of the
    iteration (``section_profiler.iteration_ms.mean``). Its section is the one with the largest excess over the other
    ranks' median of that section.

    Returns:
        ``rank``, ``section``, ``ms`` (its mean of the section), ``others_median_ms``, ``ratio`` (null where the
        others' median is 0), ``excess_ms`` (the section's), ``lag_ms`` and ``lag_pct`` (its own time beyond the
        others', ms an iteration and % of iteration time), ``others_wait_ms`` (the other ranks' median of the sync
        section less the straggler's: their wait at the all-reduce), ``ranks``, ``line``.
    """
    profiler = _get(summary, "section_profiler")
    iteration = _number(_get(_get(profiler, "iteration_ms"), "mean"))
    ranks = _get(profiler, "ranks") or {}
    own = {name: values for name, spread in ranks.items()
           if name not in SYNC_SECTIONS and (values := _per_rank(spread)) is not None}
    if not own or iteration is None or iteration <= 0:
        return None
    count = len(next(iter(own.values())))
    if any(len(values) != count for values in own.values()):
        return None
    totals = [sum(values[r] for values in own.values()) for r in range(count)]
    rank = max(range(count), key=lambda r: totals[r])
    lag = totals[rank] - _others(totals, rank)
    if lag < STRAGGLER_LAG_PCT / 100.0 * iteration:
        return None
    section = max(own, key=lambda name: own[name][rank] - _others(own[name], rank))
    ms, median = own[section][rank], _others(own[section], rank)
    sync = next((values for name in SYNC_SECTIONS if (values := _per_rank(ranks.get(name))) is not None), None)
    wait = _others(sync, rank) - sync[rank] if sync is not None and len(sync) == count else None
    found = {"rank": rank, "section": section, "ms": ms, "others_median_ms": median,
             "ratio": ms / median if median > 0 else None, "excess_ms": ms - median, "lag_ms": lag,
             "lag_pct": 100.0 * lag / iteration, "others_wait_ms": wait, "ranks": count}
    found["line"] = straggler_line(found)
    return found


def straggler_line(found: Dict[str, Any]) -> str:
    """``rank 3 waits 32.8x longer for data (`data_loading`) than the other ranks' median (20.8 ms against 0.6 ms an
    iteration); the other 3 ranks wait for it 19.7 ms an iteration (31% of iteration time), at the gradient
    all-reduce in `backward```."""
    rank, section, ratio = found["rank"], found["section"], _number(found.get("ratio"))
    how = f"{fixed(ratio, '.1f')}x longer" if ratio is not None else f"{fixed(found['excess_ms'], '.1f')} ms longer"
    what = f"waits {how} for data (`data_loading`)" if section == "data_loading" else f"takes {how} in `{section}`"
    others = found["ranks"] - 1
    wait = _number(found.get("others_wait_ms"))
    return (f"rank {rank} {what} than the other ranks' median ({fixed(found['ms'], '.1f')} ms against"
            f" {fixed(found['others_median_ms'], '.1f')} ms an iteration); the other {others}"
            f" rank{'s' if others > 1 else ''} wait for it {fixed(found['lag_ms'], '.1f')} ms an iteration"
            f" ({fixed(found['lag_pct'], '.0f')}% of iteration time)"
            + (", at the gradient all-reduce in `backward`" if wait is not None and wait > 0 else ""))
