"""The suite's Lightning callbacks, one package each (`core`: what they share)."""

from lightning_perf.callbacks.ab_trial.callback import ABTrial
from lightning_perf.callbacks.eval_no_grad_guard.callback import EvalNoGradGuard
from lightning_perf.callbacks.iteration_timer.callback import IterationTimer
from lightning_perf.callbacks.memory_snapshot.callback import MemorySnapshot
from lightning_perf.callbacks.perf_suite.callback import PerfSuite
from lightning_perf.callbacks.quality_gate.callback import QualityGate
from lightning_perf.callbacks.section_profiler.callback import SectionProfiler
from lightning_perf.callbacks.step_trace.callback import StepTrace
from lightning_perf.callbacks.vram_monitor.callback import VRAMMonitor

__all__ = ["ABTrial", "EvalNoGradGuard", "IterationTimer", "MemorySnapshot", "PerfSuite", "QualityGate",
           "SectionProfiler", "StepTrace", "VRAMMonitor"]
