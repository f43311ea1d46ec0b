"""The CUDA caching allocator's health: retries (the cache freed and an allocation tried again, a stall each), OOMs,
fragmentation (reserved but not allocated) and the largest free cached block. Read from torch's nested statistics
dict at a window or a phase end, never per step. No Lightning import here."""

from __future__ import annotations

from typing import Any, Dict, Optional

MB = 1024.0 * 1024.0
#: The diagnosis's words for an allocator under pressure.
PRESSURE_ADVICE = "try `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` or a smaller batch"


def _counter(stats: Dict[str, Any], key: str) -> Optional[int]:
    value = stats.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _current(stats: Dict[str, Any], key: str) -> Optional[float]:
    try:
        return float(stats[key]["all"]["current"])
    except (KeyError, TypeError, ValueError):
        return None


class AllocatorHealth:
    """Counters of one CUDA device's allocator, as deltas from :meth:`start` (a phase's start), and its state now.

    Args:
        device: the CUDA device.
        backend: the module with ``memory_stats_as_nested_dict`` (and ``memory_snapshot`` for the largest free
            block); ``torch.cuda`` in a run, a simulated one in tests.
    """

    def __init__(self, device: Any, backend: Any) -> None:
        self.device, self.backend = device, backend
        self._base: Dict[str, Optional[int]] = {}
        #: Per phase: retries and OOMs summed over its entries, fragmentation and largest free block at its last end.
        self.phases: Dict[str, Dict[str, Optional[float]]] = {}

    def enter(self, phase: str) -> None:
        self.start()

    def exit(self, phase: str) -> None:
        """A phase ends (a sync costs nothing here): its counters add to what its earlier entries saw."""
        reading = self.read(largest_free=True)
        held = self.phases.setdefault(phase, {})
        for name in ("alloc_retries", "ooms"):
            if reading[name] is not None:
                held[name] = (held.get(name) or 0) + reading[name]  # type: ignore[operator]
            else:
                held.setdefault(name, None)
        for name in ("fragmentation_mb", "fragmentation_pct", "largest_free_block_mb"):
            held[name] = reading[name]

    def window_metrics(self, prefix: str, phase: str) -> Dict[str, Optional[float]]:
        """The logged figures of a window in ``phase``: its retries so far and the fragmentation now."""
        reading = self.read()
        retries = reading["alloc_retries"]
        if retries is not None:
            retries += self.phases.get(phase, {}).get("alloc_retries") or 0
        return {prefix + "alloc_retries": retries, prefix + "fragmentation_pct": reading["fragmentation_pct"]}

    def phase_metrics(self, prefix: str, phase: str) -> Dict[str, Optional[float]]:
        """The logged figures at a phase's end: what :meth:`exit` kept."""
        held = self.phases.get(phase, {})
        return {prefix + "alloc_retries": held.get("alloc_retries"), prefix + "fragmentation_pct":
                held.get("fragmentation_pct")}

    def _stats(self) -> Dict[str, Any]:
        """The nested statistics dict; empty (every figure null) where the backend has none or it fails."""
        nested = getattr(self.backend, "memory_stats_as_nested_dict", None)
        try:
            stats = nested(self.device) if nested is not None else None
        except Exception:  # noqa: BLE001 - the peaks of VRAMMonitor go on without these figures
            stats = None
        return stats if isinstance(stats, dict) else {}

    def start(self) -> None:
        stats = self._stats()
        self._base = {"alloc_retries": _counter(stats, "num_alloc_retries"), "ooms": _counter(stats, "num_ooms")}

    def read(self, largest_free: bool = False) -> Dict[str, Optional[float]]:
        """Retries and OOMs since :meth:`start`, fragmentation now (reserved minus allocated, MB and % of
        reserved), and with ``largest_free`` the largest inactive block in the cache (walks every segment: phase
        ends only)."""
        stats = self._stats()
        out: Dict[str, Optional[float]] = {}
        for name, key in (("alloc_retries", "num_alloc_retries"), ("ooms", "num_ooms")):
            now, base = _counter(stats, key), self._base.get(name)
            out[name] = None if now is None else now - (base or 0)
        reserved, allocated = _current(stats, "reserved_bytes"), _current(stats, "allocated_bytes")
        if reserved is None or allocated is None:
            out["fragmentation_mb"] = out["fragmentation_pct"] = None
        else:
            out["fragmentation_mb"] = max(0.0, reserved - allocated) / MB
            out["fragmentation_pct"] = 100.0 * max(0.0, reserved - allocated) / reserved if reserved > 0 else 0.0
        if largest_free:
            out["largest_free_block_mb"] = self.largest_free_block_mb()
        return out

    def largest_free_block_mb(self) -> Optional[float]:
        """The largest cached block no tensor holds (an allocation up to it needs no new cudaMalloc), from
        ``torch.cuda.memory_snapshot()``; None where the backend has no snapshot."""
        snapshot = getattr(self.backend, "memory_snapshot", None)
        if snapshot is None:
            return None
        try:
            segments = snapshot() or ()
        except Exception:  # noqa: BLE001
            return None
        index = getattr(self.device, "index", None)
        largest = 0
        for segment in segments:
            if index is not None and segment.get("device", index) != index:
                continue
            for block in segment.get("blocks") or ():
                if block.get("state") == "inactive":
                    largest = max(largest, int(block.get("size") or 0))
        return largest / MB


def pressure_line(retries: Optional[float], where: str = "in training") -> Optional[str]:
    """The diagnosis's line for an allocator that retried, or None."""
    if not retries:
        return None
    return f"allocator under pressure: {int(retries)} retries {where}; {PRESSURE_ADVICE}"
