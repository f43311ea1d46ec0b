"""PerfSuite: one Lightning callback that drives several lightning_perf callbacks (each hook dispatched once)."""

from lightning_perf.callbacks.perf_suite.callback import PerfSuite

__all__ = ["PerfSuite"]
