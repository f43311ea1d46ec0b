"""The suite's Lightning callbacks, one file each."""

from lightning_perf.callbacks.ab_trial import ABTrial
from lightning_perf.callbacks.eval_no_grad_guard import EvalNoGradGuard
from lightning_perf.callbacks.iteration_timer import IterationTimer
from lightning_perf.callbacks.memory_snapshot import MemorySnapshot
from lightning_perf.callbacks.perf_suite import PerfSuite
from lightning_perf.callbacks.quality_gate import QualityGate
from lightning_perf.callbacks.section_profiler import SectionProfiler
from lightning_perf.callbacks.step_trace import StepTrace
from lightning_perf.callbacks.vram_monitor import VRAMMonitor

__all__ = ["ABTrial", "EvalNoGradGuard", "IterationTimer", "MemorySnapshot", "PerfSuite", "QualityGate",
           "SectionProfiler", "StepTrace", "VRAMMonitor"]
