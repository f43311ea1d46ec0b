"""A torch.profiler capture of a few training steps: start, stop, a Chrome/Perfetto JSON trace and the ops that took
the most time. No Lightning import here; nothing here runs on a step that is not captured."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Dict, List, Optional, Tuple

#: Ops kept in the summary for each capture, by their own (self) time.
TOP_OPS = 10


def activities(on_cuda: bool) -> List[Any]:
    """CPU always; CUDA where the run is on a CUDA device (its kernels and copies in the same trace)."""
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])


def activity_names(on_cuda: bool) -> List[str]:
    return ["cpu", "cuda"] if on_cuda else ["cpu"]


def start_capture(on_cuda: bool, record_shapes: bool, with_stack: bool) -> Any:
    """A started ``torch.profiler.profile``; every op from here on is recorded until :func:`finish_capture`."""
    from torch.profiler import profile

    prof = profile(activities=activities(on_cuda), record_shapes=record_shapes, with_stack=with_stack)
    prof.start()
    return prof


def finish_capture(prof: Any, path: str) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """Stops ``prof``, writes its trace to ``path`` (folders made) and returns the top ops by self time, and None, or
    why no whole trace is at ``path`` (then nothing is left there, nor torch's ``.tmp``)."""
    prof.stop()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    _remove(path)  # an earlier run's trace of the same steps would pass for this one's
    prof.export_chrome_trace(path)
    problem = trace_problem(path)
    if problem is not None:
        for left in (path, path + ".tmp"):
            with contextlib.suppress(OSError):
                _remove(left)
    return top_ops(prof), problem


def trace_problem(path: str) -> Optional[str]:
    """Why ``path`` is no whole trace, or None. torch's export does not raise where the file cannot be written (a
    full disk, a file-size limit): it leaves a cut ``.tmp`` and no file. The check is of the file's ends (a JSON
    object or array that closes), not a parse: a trace of many steps runs to hundreds of MB."""
    tmp = " (a cut .tmp was left: a full disk or a file-size limit?)" if os.path.exists(path + ".tmp") else ""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            head = fh.read(64).lstrip()[:1]
            fh.seek(max(0, size - 64))
            tail = fh.read().rstrip()[-1:]
    except FileNotFoundError:
        return f"torch's export wrote no file at {path}{tmp}"
    except OSError as err:
        return f"{path} cannot be read back: {err}"
    if not size:
        return f"torch's export left {path} empty{tmp}"
    if (head, tail) not in ((b"{", b"}"), (b"[", b"]")):
        return f"torch's export left {path} cut short ({size} bytes, its JSON does not close){tmp}"
    return None


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def top_ops(prof: Any, k: int = TOP_OPS) -> List[Dict[str, Any]]:
    """The ``k`` ops (and ``record_function`` ranges) with the most self time: device time where any was recorded,
    else CPU time. ``total_ms`` includes what ran inside the op (a user's range holds the ops it wraps)."""
    rows = []
    for event in prof.key_averages():
        device_self = float(getattr(event, "self_device_time_total", 0.0) or 0.0)
        rows.append({"name": str(event.key), "calls": int(event.count),
                     "self_cpu_ms": float(event.self_cpu_time_total) / 1000.0,
                     "total_cpu_ms": float(event.cpu_time_total) / 1000.0,
                     "self_device_ms": device_self / 1000.0 if device_self else None})
    on_device = any(r["self_device_ms"] for r in rows)
    key = "self_device_ms" if on_device else "self_cpu_ms"
    rows.sort(key=lambda r: -(r[key] or 0.0))
    return rows[:k]


def trace_name(first: int, last: int, rank: Optional[int] = None) -> str:
    """``step_100.pt.trace.json``, ``step_100-101.pt.trace.json``; ``.rank1`` before the suffix under DDP."""
    steps = str(first) if first == last else f"{first}-{last}"
    return f"step_{steps}" + (f".rank{rank}" if rank is not None else "") + ".pt.trace.json"
