"""IterationTimer: the hooks (``callback``), the FLOPs count (``flops``), what a checkpoint keeps (``state``), the
summary section and console line (``summary``) and the logging window (``window``)."""

from lightning_perf.callbacks.iteration_timer.callback import IterationTimer

__all__ = ["IterationTimer"]
