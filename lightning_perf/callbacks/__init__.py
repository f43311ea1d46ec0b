"""The suite's Lightning callbacks, one file each."""

from lightning_perf.callbacks.iteration_timer import IterationTimer

__all__ = ["IterationTimer"]
