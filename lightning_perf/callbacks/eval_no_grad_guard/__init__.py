"""EvalNoGradGuard: evaluation that runs with autograd on or with modules in training mode, caught at its hooks."""

from lightning_perf.callbacks.eval_no_grad_guard.callback import EvalNoGradGuard

__all__ = ["EvalNoGradGuard"]
