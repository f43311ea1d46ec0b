"""Where to look next: StepTrace's traces joined to IterationTimer's slow iterations, and the evidence lines of the
diagnosis (a trace, a memory snapshot, an allocator under pressure). Pure Python on the summary's dicts."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from lightning_perf.measure.memory.allocator import pressure_line
from lightning_perf.summary.fields import fixed


def read_field(node: Any, key: str) -> Any:
    """A field of a typed section or of a plain dict (fields a newer writer adds are plain dicts here)."""
    if node is None:
        return None
    if isinstance(node, Mapping):
        return node.get(key)
    return getattr(node, key, None)


def link_traces(data: Dict[str, Any]) -> None:
    """Each of IterationTimer's kept slow iterations gets ``trace``: the capture that holds it (``covers: this``),
    else the one that started right after it (``covers: next``, a capture its slowness triggered)."""
    tail = read_field(data.get("iteration_timer"), "tail")
    captures = read_field(data.get("step_trace"), "captures") or ()
    # a capture whose trace could not be written (path null) links nothing
    captures = [c for c in captures if isinstance(c, dict) and c.get("path")]
    if not isinstance(tail, dict) or not captures:
        return
    for entry in tail.get("slowest") or ():
        step = entry.get("step") if isinstance(entry, dict) else None
        if not isinstance(step, int):
            continue
        link = None
        for capture in captures:
            first, last = capture.get("first_step"), capture.get("last_step")
            if isinstance(first, int) and isinstance(last, int) and first <= step <= last:
                link = dict(capture, covers="this")
                break
            if capture.get("slow_step") == step or first == step + 1:
                link = link or dict(capture, covers="next")
        if link is not None:
            entry["trace"] = {key: link.get(key) for key in ("path", "first_step", "last_step", "covers")}


def _steps(capture: Any) -> str:
    first, last = read_field(capture, "first_step"), read_field(capture, "last_step")
    return f"step {first}" if first == last else f"steps {first}-{last}"


def trace_lines(section: Any) -> List[str]:
    """One line per capture: slow-triggered ones first."""
    captures = [c for c in (read_field(section, "captures") or []) if c is not None and read_field(c, "path")]
    captures.sort(key=lambda c: read_field(c, "trigger") != "slow")
    out = []
    for capture in captures:
        why = ""
        if read_field(capture, "trigger") == "slow" and read_field(capture, "slow_ms") is not None:
            slow_ms = read_field(capture, "slow_ms")
            times = slow_ms / max(read_field(capture, "median_ms") or 1e-9, 1e-9)
            why = (f" after step {read_field(capture, 'slow_step')} took {fixed(slow_ms, '.0f')} ms"
                   f" ({fixed(times, '.1f')}x the median)")
        out.append(f"see trace {read_field(capture, 'path')} ({_steps(capture)}{why})")
    return out


def when(dump: Any) -> str:
    """``out of memory in training step 3``, ``out of memory in validate after step 8``, ``steps 3-4``."""
    step, phase = read_field(dump, "step"), read_field(dump, "phase")
    if read_field(dump, "trigger") != "oom":
        return f"the steps window ending at step {step}"
    return f"out of memory in training step {step}" if phase in ("train", None) else (
        f"out of memory in {phase} after step {step}")


def snapshot_lines(section: Any) -> List[str]:
    """One line per memory snapshot: out-of-memory ones first, with the failed request and the largest allocation."""
    dumps = [d for d in (read_field(section, "snapshots") or []) if d is not None]
    dumps.sort(key=lambda d: read_field(d, "trigger") != "oom")
    out = []
    for dump in dumps:
        bits = snapshot_findings(dump)
        out.append(f"see memory snapshot {read_field(dump, 'path')} ({when(dump)}"
                   + (": " + "; ".join(bits) if bits else "") + ")")
    return out


def snapshot_findings(dump: Any) -> List[str]:
    """What a snapshot shows first: the request that failed and the largest live allocation, each with its line."""
    bits = []
    failed = read_field(dump, "failed_request")
    if failed is not None and read_field(failed, "size_mb") is not None:
        where = read_field(failed, "frame") or "an unknown frame"
        bits.append(f"it asked for {fixed(read_field(failed, 'size_mb'), '.1f')} MiB at {where}")
    top = (read_field(dump, "top_allocations") or [None])[0]
    if top is not None and read_field(top, "size_mb") is not None:
        bits.append(f"the largest live allocation, {fixed(read_field(top, 'size_mb'), '.1f')} MiB, from"
                    f" {read_field(top, 'frame') or 'an unknown frame'}")
    return bits


def pressure_lines(summary: Any) -> List[str]:
    """An allocator that retried in training (VRAMMonitor's train phase, else IterationTimer's tail), in one line."""
    retries = read_field(read_field(read_field(read_field(summary, "vram"), "phases"), "train"), "alloc_retries")
    if retries is None:
        retries = read_field(read_field(read_field(summary, "iteration_timer"), "tail"), "alloc_retries")
    line = pressure_line(retries)
    return [line] if line else []


def evidence_lines(summary: Any) -> List[str]:
    """The diagnosis's ``evidence``: what the run recorded that shows what ran or what held memory."""
    lines: List[str] = pressure_lines(summary)
    lines += snapshot_lines(read_field(summary, "memory_snapshot"))
    lines += trace_lines(read_field(summary, "step_trace"))
    return lines


def first_evidence(lines: Optional[List[str]]) -> str:
    """For the one-line diagnosis: the first evidence line, and how many more are in the summary."""
    if not lines:
        return ""
    more = len(lines) - 1
    return f" Evidence: {lines[0]}" + (f" (+{more} more in the summary's diagnosis.evidence)" if more else "")
