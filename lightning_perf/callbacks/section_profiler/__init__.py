"""SectionProfiler: the hooks (``callback``) and its Lightning-facing helpers: the batch transfer's timing, the fetch
marks, the checkpoint I/O timer, the CUDA events of sections, the saved ledger and the periodic report."""

from lightning_perf.callbacks.section_profiler.callback import SectionProfiler

__all__ = ["SectionProfiler"]
