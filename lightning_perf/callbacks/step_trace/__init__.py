"""StepTrace: a torch.profiler trace of chosen training steps, or of those after a slow one."""

from lightning_perf.callbacks.step_trace.callback import StepTrace

__all__ = ["StepTrace"]
