"""Was the machine busy with other work while a run was measured? Read from the summary's ``vram.activity``: the
training thread's wait for a CPU, the hypervisor's steal and the GPU's clock throttling (see docs/diagnosis.md,
"Contention"). Pure Python on the summary dict: no torch."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from lightning_perf.summary.fields import fixed

#: A phase is contended when, on average over it, the training thread waited for a CPU at least this share of the
#: wall time: on an idle 2-core machine a training loop read 0.04%; with one spinning process more than the cores,
#: 51 to 53% (docs/diagnosis.md).
CPU_WAIT_PCT = 10.0
#: ... or a hypervisor gave at least this share of the machine's CPU time to other machines.
STEAL_PCT = 10.0
#: ... or the GPU slowed its clocks for power or heat in at least this share of the samples.
THROTTLED_PCT = 10.0


def _field(node: Any, key: str) -> Any:
    """A field of a plain dict or of a typed section (:mod:`lightning_perf.summary.model`)."""
    if node is None:
        return None
    return node.get(key) if isinstance(node, dict) else getattr(node, key, None)


def contention(summary: Any, phase: str = "train") -> Dict[str, Any]:
    """``contended`` (True, False, or None when nothing could tell), ``causes`` (one phrase each), the figures read,
    and ``reason`` where ``contended`` is None. ``summary``: a decoded summary or a typed one."""
    activity = _field(_field(summary, "vram"), "activity")
    readings = _field(_field(activity, "phases"), phase)
    figures = {name: _field(_field(readings, name), "mean")
               for name in ("cpu_wait_pct", "host_steal_pct", "gpu_throttled_pct", "process_cpu_cores",
                            "host_cpu_pct")}
    figures["host_logical_cores"] = _field(activity, "host_logical_cores")
    wait, steal, throttled = figures["cpu_wait_pct"], figures["host_steal_pct"], figures["gpu_throttled_pct"]
    if wait is None and steal is None and throttled is None:
        why = ("no VRAMMonitor activity in the summary" if not activity else
               f"no contention reading in its {phase} phase (the training thread's CPU wait needs Linux)")
        return {"contended": None, "causes": [], "figures": figures, "reason": why}
    causes: List[str] = []
    if wait is not None and wait >= CPU_WAIT_PCT:
        cores, busy, total = figures["process_cpu_cores"], figures["host_cpu_pct"], figures["host_logical_cores"]
        share = (f" (the process got {fixed(cores, '.2f')} of {total} cores while the machine ran at"
                 f" {fixed(busy, '.0f')}%)"
                 if None not in (cores, busy, total) else "")
        causes.append(f"the training thread waited for a CPU {fixed(wait, '.0f')}% of the time{share}")
    if steal is not None and steal >= STEAL_PCT:
        causes.append(f"the hypervisor gave {fixed(steal, '.0f')}% of the CPU time to other machines (steal)")
    if throttled is not None and throttled >= THROTTLED_PCT:
        causes.append(f"the GPU slowed its clocks for power or heat in {fixed(throttled, '.0f')}% of samples")
    return {"contended": bool(causes), "causes": causes, "figures": figures, "reason": None}


def contention_line(result: Dict[str, Any]) -> Optional[str]:
    """``the machine was busy: ...`` for a contended run; None otherwise."""
    if not result.get("contended"):
        return None
    return "the machine was busy: " + "; ".join(result["causes"])
