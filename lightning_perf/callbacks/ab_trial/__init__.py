"""ABTrial: a change tried inside one fit in alternating blocks of iterations, switched at its hooks."""

from lightning_perf.callbacks.ab_trial.callback import ABTrial

__all__ = ["ABTrial"]
