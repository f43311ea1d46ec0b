"""The registry the conformance test runs over: every callback of the suite, with its section name.

Each entry: class name -> (factory for a fast test instance, summary section name, YAML init_args).
"""

from lightning_perf import EvalNoGradGuard, IterationTimer, VRAMMonitor

SUITE = {
    "IterationTimer": (lambda: IterationTimer(warmup_steps=1), "iteration_timer", {"warmup_steps": 1}),
    "EvalNoGradGuard": (lambda: EvalNoGradGuard(), "eval_no_grad_guard", {"mode": "warn"}),
    "VRAMMonitor": (lambda: VRAMMonitor(nvml_interval_s=0.01), "vram", {"nvml_interval_s": 0.01}),
}
