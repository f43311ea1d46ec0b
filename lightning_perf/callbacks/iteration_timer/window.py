"""IterationTimer's logging window: the figures of the iterations since the last scalars went to the loggers, and
the rates they give (``perf/it_per_s``, ``perf/ms_per_iter``, ...)."""

from __future__ import annotations

from typing import Dict, Optional

from lightning_perf.measure.timing.flops import mfu_pct, tflops_per_s


class LoggingWindow:
    """Seconds, iterations, batches, samples and items of the measured iterations since the last log, and the
    seconds of those over the tail threshold. The step path adds to the fields; :meth:`rates` reads them once."""

    __slots__ = ("seconds", "iterations", "batches", "samples", "items", "tail_s")

    def __init__(self) -> None:
        self.seconds, self.iterations, self.batches, self.samples, self.items, self.tail_s = 0.0, 0, 0, 0, 0, 0.0

    def rates(self, samples_known: bool, items_known: bool, tail_known: bool, flops_per_batch: Optional[float],
              peak_flops: Optional[float]) -> Dict[str, Optional[float]]:
        """The window's logged scalars; each of samples/s, items/s, the tail's share and TFLOP/s (and MFU, with the
        device's peak) only where it is known. The window must hold an iteration and time."""
        seconds = self.seconds
        metrics: Dict[str, Optional[float]] = {
            "perf/it_per_s": self.iterations / seconds,
            "perf/ms_per_iter": 1000.0 * seconds / self.iterations,
            "perf/batches_per_s": self.batches / seconds,
        }
        if samples_known:
            metrics["perf/samples_per_s"] = self.samples / seconds
        if items_known:
            metrics["perf/items_per_s"] = self.items / seconds
        if tail_known:
            metrics["perf/tail_time_pct"] = 100.0 * self.tail_s / seconds
        if flops_per_batch is not None:
            tflops = tflops_per_s(flops_per_batch, self.batches, seconds)
            metrics["perf/tflops_per_s"] = tflops
            if peak_flops is not None:
                metrics["perf/mfu_pct"] = mfu_pct(tflops, peak_flops)
        return metrics
