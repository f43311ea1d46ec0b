"""IterationTimer's FLOPs: at train start, when ``flops_per_batch="auto"`` counts and the device's peak FLOP/s; once
after the warm-up, the count of one training batch on a copy of the model, its time left out of every clock."""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer

from lightning_perf.callbacks.core.summary_book import error_message
from lightning_perf.measure.timing.clock import now
from lightning_perf.measure.timing.flops import count_step_flops, peak_flops


class FlopsCount:
    """IterationTimer's FLOP count, as methods of the timer (one of its bases)."""

    def _start_flops(self, trainer: Trainer) -> None:
        """At train start: when "auto" counts (after the warm-up, once per run), and the device's peak FLOP/s."""
        auto = self.flops_per_batch == "auto" and self._flops is None
        if auto and self._manual:
            self._flops_reason = ("`flops_per_batch='auto'` counts automatic optimization's training_step and"
                                  " backward; under manual optimization the step runs the optimizer itself: pass"
                                  " `flops_per_batch=` (a number)")
            self._warn_once("flops", f"{self._flops_reason}. TFLOP/s and MFU are not reported.")
        self._flops_due = max(self.warmup_steps, 1) if auto and not self._manual else -1
        from lightning.fabric.utilities.throughput import get_available_flops

        self._peak_flops, self._peak_source, self._peak_reason, self._dtype_name = peak_flops(
            self.available_flops, self.flops_per_batch, getattr(trainer, "precision", None),
            trainer.strategy.root_device, get_available_flops)

    def _count_flops(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Counts the FLOPs of one training batch (training_step and backward) once, on a copy of the model, between
        two iterations; the time it takes is left out of the run's, the epoch's and the next iteration's."""
        self._flops_due = -1
        start = now()
        try:
            from lightning.fabric.utilities import measure_flops

            flops = count_step_flops(pl_module, lambda module, data: module.training_step(data, batch_idx), batch,
                                     measure_flops, keep=[trainer], silence=("log", "log_dict"))
            if flops <= 0:
                raise ValueError("0 FLOPs counted: torch's FlopCounterMode counts matmuls, convolutions and"
                                 " attention, and the step ran none of them")
            self._flops, self._flops_source, self._flops_counted_at = float(flops), "auto", self.iterations
        except Exception as err:  # noqa: BLE001 - a measurement never raises into training
            self._flops_reason = (f"`flops_per_batch='auto'` could not count this model's training step"
                                  f" ({type(err).__name__}: {error_message(err)}); pass `flops_per_batch=` (a number)")
            self._warn_once("flops", f"{self._flops_reason}. TFLOP/s and MFU are not reported.")
        finally:
            spent = now() - start
            self._flops_count_time_s += spent
            self._ledger.skip(spent)  # the clocks skip the count
            if self._clock is not None:
                self._clock.break_chain()
                self._restart_device_chain()
