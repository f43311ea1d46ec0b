"""Memory differences decided against their own noise: the matrix's "least memory", bench's frontier and bench-compare's
memory column say a peak differs only beyond the spread of repeats, or, with one run a side, beyond a floor measured
on A/A runs (docs/bench.md, "Memory noise floor"). Pure Python; figures in MiB (2^20 bytes), as the summary's
``_mb`` fields and bench's ``memory_peak_mb`` hold them."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Optional, Sequence

#: Process memory (host RSS, NVML): no difference below this many MiB is ever decided. A/A runs moved such a peak by
#: up to 8.8 MiB (bench on CPU, the smallest configurations' RSS rise: 0.1 against 8.9 MiB for the same
#: configuration in two rounds): twice that.
FLOOR_MIB = 16.0
#: Process memory with one run a side: nor below this share of the larger peak. Host RSS of two runs of one command
#: moved by 12% (162 of 1350 MiB) where nothing differed.
FLOOR_PCT = 15.0
#: A CUDA allocator's peak (``torch.cuda.max_memory_allocated``) counts the bytes torch asked for, which the same code
#: asks for again: its floor is the caching allocator's rounding of a large block (2 MiB), or 1% of the larger peak.
ALLOCATOR_FLOOR_MIB = 2.0
ALLOCATOR_FLOOR_PCT = 1.0
#: Where a peak comes from: ``allocator`` (CUDA) or ``process`` (host RSS, NVML).
SOURCES = ("allocator", "process")


def _finite(values: Sequence[Any]) -> list:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0]


def memory_change(base: Sequence[Optional[float]], candidate: Sequence[Optional[float]],
                  source: str = "process") -> Dict[str, Any]:
    """The candidate's peak against the base's, each a list of runs' peaks (MiB), from ``source`` (:data:`SOURCES`):
    ``delta_mib`` (medians' difference), ``floor_mib`` (what a difference must exceed), ``how`` (``spread of
    repeats`` with two runs a side or more, never below the source's least floor; else ``A/A floor``), ``sign`` (+1
    more, -1 less, 0 within the floor; None where a side has no figure) and ``decided``."""
    least, pct = (ALLOCATOR_FLOOR_MIB, ALLOCATOR_FLOOR_PCT) if source == "allocator" else (FLOOR_MIB, FLOOR_PCT)
    b, c = _finite(base), _finite(candidate)
    out: Dict[str, Any] = {"delta_mib": None, "floor_mib": None, "how": None, "sign": None, "decided": False}
    if not b or not c:
        return out
    mb, mc = statistics.median(b), statistics.median(c)
    if len(b) >= 2 and len(c) >= 2:
        spread = max(max(b) - min(b), max(c) - min(c))
        floor, how = max(least, spread), "spread of repeats"
    else:
        floor, how = max(least, pct / 100.0 * max(mb, mc)), "A/A floor"
    delta = mc - mb
    sign = 0 if abs(delta) <= floor else (1 if delta > 0 else -1)
    out.update(delta_mib=delta, floor_mib=floor, how=how, sign=sign, decided=sign != 0)
    return out


def floor_words(change: Dict[str, Any]) -> str:
    """``within the memory noise floor (+3.2 MiB, floor 16 MiB: A/A floor)``, or the decided change in words:
    ``42.0 MiB more`` / ``42.0 MiB less``."""
    if change.get("sign") is None:
        return "no memory figure to compare"
    delta = change["delta_mib"]
    if not change["decided"]:
        return f"within the memory noise floor ({delta:+.1f} MiB, floor {change['floor_mib']:.0f} MiB: {change['how']})"
    return f"{abs(delta):.1f} MiB {'more' if delta > 0 else 'less'}"
