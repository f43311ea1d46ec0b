"""VRAMMonitor's bookkeeping of memory per phase: the phases, peak-hold, the leak detectors' settings and the
console line. No Lightning import here."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from lightning_perf.measure.memory.readers import LeakDetector

#: ``eval_in_train_hooks``: evaluation a training hook runs inside ``lightning_perf.phase(...)``.
PHASES = ("train", "validation", "test", "predict", "eval_in_train_hooks")
#: Training iterations per leak reading: a CUDA allocator read costs ~20 µs on an H100 host, a host RSS read 10 to
#: 45 µs right after a CPU step (the kernel walks the process's memory counters; 1 µs in a tight loop). One reading
#: per window of 16 iterations: the allocator's count at an iteration's end is exact, and a host leak that the
#: threshold flags (20 MB per 100 iterations) rises 3 MB a window, above RSS's drift between two readings.
TRAIN_LEAK_STRIDE_CUDA = 16
TRAIN_LEAK_STRIDE_HOST = 16
LEAK_THRESHOLD_CUDA = 2.0  # MB per 100 iterations, torch allocator
LEAK_THRESHOLD_RSS = 20.0  # MB per 100 iterations, host RSS
#: The logged name of each phase: ``vram/<key>_peak_allocated_mb``.
EVAL_KEY = {"validation": "eval", "test": "test", "predict": "predict", "train": "train",
            "eval_in_train_hooks": "eval_in_train_hooks"}


def hold_max(held: Dict[str, Optional[float]], values: Dict[str, Optional[float]]) -> None:
    """Peak-hold: each known value raises its entry in ``held``."""
    for key, value in values.items():
        if value is not None:
            held[key] = max(value, held.get(key) or 0.0)


def leak_detectors(on_cuda: bool, window: int, threshold: Optional[float]) -> Tuple[LeakDetector, LeakDetector,
                                                                                      float, int]:
    """(training's detector, evaluation's, the threshold in MB per 100 iterations, training's stride)."""
    if threshold is None:
        threshold = LEAK_THRESHOLD_CUDA if on_cuda else LEAK_THRESHOLD_RSS
    stride = TRAIN_LEAK_STRIDE_CUDA if on_cuda else TRAIN_LEAK_STRIDE_HOST
    train = LeakDetector(window=window, threshold_mb_per_100=threshold, warmup=50, stride=stride)
    evaluation = LeakDetector(window=max(2, window // 5), threshold_mb_per_100=threshold, warmup=2)
    return train, evaluation, float(threshold), stride


def leak_warning(rate_mb_per_100: float, phase: str) -> str:
    """The warning while the phase runs: growth so far. The summary's verdict waits for the phase's later half."""
    unit = "iterations" if phase == "train" else f"{phase} batches"
    return (f"memory has risen by {rate_mb_per_100:.1f} MiB per 100 {unit} so far: a leak is suspected if it goes on"
            " (the summary decides on the later half of the phase; growth that stops is no leak). Look for"
            " tensors kept across steps (a list of losses or outputs without .detach(), an autograd graph kept alive"
            " by evaluation without torch.no_grad()).")


def memory_verdict(phases: Dict[str, Dict[str, Optional[float]]], leaks: Dict[str, Dict[str, Any]],
                   on_allocator: bool, usage: Any) -> str:
    """One line for the console: each phase's peak (allocator on CUDA, else host RSS), its usage (``usage(held)``),
    and leaks."""
    parts = []
    for phase in PHASES:
        held = phases.get(phase)
        peak = (held.get("peak_allocated_mb") if on_allocator else held.get("host_rss_peak_mb")) if held else None
        if peak is None:
            continue
        pct = usage(held)
        parts.append(f"{phase} peak {peak:.0f} MiB" + (f" ({pct:.0f}% used)" if pct is not None else ""))
    suspected = [f"{phase} (+{r['rate_mb_per_100_iters']:.1f} MiB/100 it)" for phase, r in leaks.items()
                 if r.get("suspected") and r.get("rate_mb_per_100_iters") is not None]
    stopped = [phase for phase, r in leaks.items() if r.get("growth_stopped") and not r.get("suspected")]
    source = "allocator" if on_allocator else "host RSS"
    return (f"VRAMMonitor ({source}): " + (", ".join(parts) or "no phase measured")
            + ("; leak suspected in " + ", ".join(suspected) if suspected else "; no leak")
            + (f" (memory rose in {', '.join(stopped)}, then stopped)" if stopped else ""))


def usage_pct(held: Dict[str, Optional[float]], total_mb: Optional[float], on_allocator: bool) -> Optional[float]:
    """The phase's peak as a share of device (host on CPU) memory: 100 - usage is the headroom left."""
    if not total_mb:
        return None
    keys = ("peak_reserved_mb", "nvml_peak_used_mb") if on_allocator else ("host_rss_peak_mb",)
    values = [held.get(k) for k in keys if held.get(k) is not None]
    return 100.0 * max(values) / total_mb if values else None
