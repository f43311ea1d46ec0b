"""The registry the conformance test runs over: every callback of the suite, with its section name.

Each entry: class name -> (factory for a fast test instance, summary section name, YAML init_args).
"""

from lightning_perf import (EvalNoGradGuard, IterationTimer, MemorySnapshot, QualityGate, SectionProfiler, StepTrace,
                            VRAMMonitor)

SUITE = {
    "IterationTimer": (lambda: IterationTimer(warmup_steps=1), "iteration_timer", {"warmup_steps": 1}),
    "EvalNoGradGuard": (lambda: EvalNoGradGuard(), "eval_no_grad_guard", {"mode": "warn"}),
    # TinyModel returns no images: the gate measures its logged val_loss (image metrics: test_quality_gate.py)
    "QualityGate": (lambda: QualityGate(metrics=[], monitor={"val_loss": "min"}), "quality_gate",
                    {"metrics": [], "monitor": {"val_loss": "min"}}),
    "SectionProfiler": (lambda: SectionProfiler(warmup_steps=1, print_reports=False), "section_profiler",
                        {"warmup_steps": 1}),
    "VRAMMonitor": (lambda: VRAMMonitor(nvml_interval_s=0.01), "vram", {"nvml_interval_s": 0.01}),
    "StepTrace": (lambda: StepTrace(steps=[2], slow_factor=3.0, max_captures=1), "step_trace",
                  {"steps": [2], "slow_factor": 3.0}),
    "MemorySnapshot": (lambda: MemorySnapshot(steps=[2, 3]), "memory_snapshot", {"steps": [2, 3]}),
}
