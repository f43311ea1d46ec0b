"""lightning_perf: Lightning callbacks that tell how fast training really runs and where time and memory go.

The callbacks are imported lazily so that ``lightning-perf compare`` and ``report`` work without torch.
"""

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "IterationTimer": "lightning_perf.callbacks.iteration_timer.callback",
    "VRAMMonitor": "lightning_perf.callbacks.vram_monitor.callback",
    "EvalNoGradGuard": "lightning_perf.callbacks.eval_no_grad_guard.callback",
    "QualityGate": "lightning_perf.callbacks.quality_gate.callback",
    "SectionProfiler": "lightning_perf.callbacks.section_profiler.callback",
    "PerfSuite": "lightning_perf.callbacks.perf_suite.callback",
    "ABTrial": "lightning_perf.callbacks.ab_trial.callback",
    "StepTrace": "lightning_perf.callbacks.step_trace.callback",
    "MemorySnapshot": "lightning_perf.callbacks.memory_snapshot.callback",
    "profile_section": "lightning_perf.measure.sections.user_sections",
    "phase": "lightning_perf.measure.memory.user_phases",
    "allow_grad_in_eval": "lightning_perf.measure.evaluation.autograd",
    "PerfCheckFailed": "lightning_perf.errors",
    "PerfConfigError": "lightning_perf.errors",
}

#: The callbacks of the suite, in the order they appear in a summary.
CALLBACKS = ("IterationTimer", "SectionProfiler", "VRAMMonitor", "EvalNoGradGuard", "QualityGate")

__all__ = ["__version__", "CALLBACKS", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_perf' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(__all__)
