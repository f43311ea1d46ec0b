"""IterationTimer: the hooks (``callback``), the FLOPs count (``flops``), what a checkpoint keeps (``state``) and the
summary section and console line (``summary``); its counts and clocks are ``measure.timing.iteration_ledger``'s."""

from lightning_perf.callbacks.iteration_timer.callback import IterationTimer

__all__ = ["IterationTimer"]
