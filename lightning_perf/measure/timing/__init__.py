"""Time: the clocks (host now, CUDA events read once done), per-epoch records, batch size, FLOPs and MFU, the slow tail
and its advice, and torch.profiler captures. No Lightning import here."""
