"""Memory differences decided against their own noise: the matrix's "least memory", bench's frontier and bench-compare's
memory column say a peak differs only beyond the spread of repeats, or, with one run a side, beyond a floor measured
on A/A runs (docs/bench.md, "Memory noise floor"). Pure Python; figures in MiB (2^20 bytes), as the summary's
``_mb`` fields and bench's ``memory_peak_mb`` hold them."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Optional, Sequence

from lightning_perf.summary.fields import fixed

#: Each source's floor: (MiB, % of the larger peak); with one run a side a difference must exceed the larger of the
#: two, with repeats the larger of the MiB and the spread of the runs.
#:
#: - ``process`` (host RSS): A/A runs moved such a peak by up to 8.8 MiB (bench on CPU, the smallest configurations'
#:   RSS rise: 0.1 against 8.9 MiB for the same configuration in two rounds): twice that; and host RSS of two runs of
#:   one command (a GAN, 1.3 GiB) read 12% (162 MiB) apart where nothing differed: 15%.
#: - ``nvml`` (the device's used memory, the CUDA context and every process on it included): 64 MiB or 2%, reasoned
#:   from the context's size and other processes' allocations, not measured here (no GPU).
#: - ``allocator`` (``torch.cuda.max_memory_allocated``/``reserved``): the bytes torch asked for, which the same code
#:   asks for again: the caching allocator's rounding of a large block (2 MiB), or 1%.
FLOORS = {"process": (16.0, 15.0), "nvml": (64.0, 2.0), "allocator": (2.0, 1.0)}
#: Where a peak comes from (:data:`FLOORS`' keys).
SOURCES = tuple(FLOORS)
#: The source of each memory field of the summary.
FIELD_SOURCES = {"peak_allocated_mb": "allocator", "peak_reserved_mb": "allocator", "nvml_peak_used_mb": "nvml",
                 "host_rss_peak_mb": "process"}
#: The least process-memory floor, in MiB (a difference below it is never decided).
FLOOR_MIB = FLOORS["process"][0]


def floor_mib(source: str, base: float, candidate: float) -> float:
    """The floor, in MiB, of one run a side from ``source`` (:data:`FLOORS`; an unknown one is the allocator's)."""
    mib, pct = FLOORS.get(source, FLOORS["allocator"])
    return max(mib, pct / 100.0 * max(abs(base), abs(candidate)))


def _finite(values: Sequence[Any]) -> list:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0]


def memory_change(base: Sequence[Optional[float]], candidate: Sequence[Optional[float]],
                  source: str = "process") -> Dict[str, Any]:
    """The candidate's peak against the base's, each a list of runs' peaks (MiB), from ``source`` (:data:`FLOORS`):
    ``delta_mib`` (medians' difference), ``floor_mib`` (what a difference must exceed), ``how`` (``spread of
    repeats`` with two runs a side or more, never below the source's least floor; else ``A/A floor``), ``sign`` (+1
    more, -1 less, 0 within the floor; None where a side has no figure) and ``decided``."""
    least = FLOORS.get(source, FLOORS["allocator"])[0]
    b, c = _finite(base), _finite(candidate)
    out: Dict[str, Any] = {"delta_mib": None, "floor_mib": None, "how": None, "sign": None, "decided": False}
    if not b or not c:
        return out
    mb, mc = statistics.median(b), statistics.median(c)
    if len(b) >= 2 and len(c) >= 2:
        spread = max(max(b) - min(b), max(c) - min(c))
        floor, how = max(least, spread), "spread of repeats"
    else:
        floor, how = floor_mib(source, mb, mc), "A/A floor"
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
        return (f"within the memory noise floor ({fixed(delta, '+.1f')} MiB, floor {fixed(change['floor_mib'], '.0f')}"
                f" MiB: {change['how']})")
    return f"{fixed(abs(delta), '.1f')} MiB {'more' if delta > 0 else 'less'}"
