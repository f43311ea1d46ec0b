"""MemorySnapshot: the CUDA allocator's history with stacks, dumped on an out-of-memory error and over chosen steps."""

from lightning_perf.callbacks.memory_snapshot.callback import MemorySnapshot

__all__ = ["MemorySnapshot"]
