"""IterationTimer's results: its summary section (``iteration_timer`` in the summary file), the scalars logged at the
end of training and its line for the console, built from the timer's counts and histograms (any read: nothing here
changes the timer)."""

from __future__ import annotations

from typing import Any, Dict, Optional

from lightning_perf.measure.timing.flops import mfu_pct, tflops_per_s
from lightning_perf.measure.timing.tail import tail_block
from lightning_perf.measure.timing.tail_advice import tail_insights, tail_line
from lightning_perf.summary.projection import project_time


class Results:
    """IterationTimer's summary section, final scalars and console line, as methods of the timer (one of its
    bases)."""

    def _summary_section(self) -> Dict[str, Any]:
        s = self._histogram().summary()
        counted_s = self._histogram().total / 1000.0
        unavailable: Dict[str, str] = {}
        samples_per_s = None
        if self._samples_unknown is not None:
            unavailable["samples_per_s"] = self._samples_unknown
        elif counted_s > 0:
            samples_per_s = self._ledger.counted_samples / counted_s
        if self._histogram().count == 0:
            unavailable["ms_per_iter"] = (
                f"no iteration was measured: {self.iterations} iterations ran and the first"
                f" {self.warmup_steps} of each fit are warm-up"
            )
        startup = self._ledger.startup_time_s if self._ledger.fits else None
        if startup is None:
            unavailable["startup_time_s"] = ("training never started" if not self._ledger.fits else
                                             "resumed from a checkpoint that kept no startup time (an older version)")
        if self._clock is None:
            unavailable["device_ms_per_iter"] = "device timing needs CUDA" if self.device_timing else "switched off"
        elif self._device.count == 0:
            unavailable["device_ms_per_iter"] = "no CUDA event interval completed"
        flops = self._flops_section(counted_s, unavailable)
        items_per_s = None
        if self.items_fn is None:
            unavailable["items_per_s"] = "no `items_fn` given: pass `items_fn=` (batch -> tokens, pixels, ...)"
        elif self._items_unknown is not None:
            unavailable["items_per_s"] = self._items_unknown
        elif counted_s > 0:
            items_per_s = self._ledger.counted_items / counted_s
        target = self._target_iterations()
        if target is None:
            unavailable["projected_time_to_target_s"] = "no target: set `target_steps` or the trainer's `max_steps`"
        section: Dict[str, Any] = {
            "iterations": self.iterations,
            "batches": self.batches,
            "samples": self.samples if self._samples_unknown is None else None,
            "measured_iterations": self._histogram().count,
            "warmup_steps": self.warmup_steps,
            "excluded": dict(self._ledger.excluded),
            "warmup_time_s": self._ledger.warmup_time_s,
            "startup_time_s": startup,
            "fits": self._ledger.fits,
            "manual_optimization": self._manual,
            "resumed_at_iteration": self._ledger.resumed_at,
            "ms_per_iter": s,
            "it_per_s": 1000.0 / s["mean"] if s["mean"] else None,
            "batches_per_s": self._ledger.counted_batches / counted_s if counted_s > 0 else None,
            "samples_per_s": samples_per_s,
            "items": self.items if self.items_fn is not None and self._items_unknown is None else None,
            "items_per_s": items_per_s,
            **flops,
            "device_ms_per_iter": self._device.summary() if self._device.count else None,
            "device_events_dropped": self._clock.dropped if self._clock is not None else 0,
            "device_timed_iterations": (self._device.count if (self._clock is not None or self._device.count)
                                        else None),
            "device_timing_every_n_iterations": self.device_timing_every_n_iterations,
            "train_time_s": self._train_time_s(),
            "eval_time_s": self._eval_time_s(),
            "sanity_check_time_s": self._ledger.sanity_time_s,
            "validation_runs": self._ledger.validation_runs,
            "eval_time_per_validation_s": (
                self._eval_time_s() / self._ledger.validation_runs if self._ledger.validation_runs else None),
            "epochs": list(self._ledger.epochs.records),
            "ranks": self._ranks,
            "histogram_ms": self._histogram().to_dict(),
            "blocks_ms": self._series().to_dict(),
            "tail": self._tail_section(unavailable),
            "unavailable": unavailable,
        }
        section["target_steps"] = target
        unknown = {"train_s": None, "with_eval_s": None}
        total = project_time(section, target) if target is not None else unknown
        left = project_time(section, target, done=self.iterations) if target is not None else unknown
        section["projected_time_to_target_s"] = total["train_s"]
        section["projected_time_to_target_with_eval_s"] = total["with_eval_s"]
        section["projected_remaining_s"] = left["train_s"]
        section["projected_remaining_with_eval_s"] = left["with_eval_s"]
        return section

    def _target_iterations(self) -> Optional[int]:
        """N in iterations. A target taken from ``max_steps`` counts optimizer steps: under manual optimization
        (an iteration is a batch) it is converted at the ratio of batches to optimizer steps seen so far."""
        target = self._target
        if target is None or not (self._manual and self._target_from_max_steps):
            return target
        steps = self._last_global_step - self._first_global_step
        fit_iters = self._ledger.fit_iterations
        if steps <= 0 or fit_iters <= 0:
            return target
        return int(round(target * fit_iters / steps))

    def _tail_section(self, unavailable: Dict[str, str]) -> Dict[str, Any]:
        gc_figures = {"collections": self._gc.collections, "full_collections": self._gc.full_collections,
                      "pause_s": self._gc.pause_s}
        if self._alloc_retries is None:
            unavailable["tail.alloc_retries"] = ("the CUDA allocator's retries are read on CUDA only"
                                                 if self._clock is None else "not read: training did not end")
        block = tail_block(self._histogram(), self._ledger.causes, self._ledger.slowest,
                           {"gc": gc_figures, "alloc_retries": self._alloc_retries, "dataloader": self._loader_info})
        block["insights"] = tail_insights(block)
        if block["share_pct"] is None:
            unavailable["tail"] = "no iteration was measured"
        return block

    def _flops_section(self, counted_s: float, unavailable: Dict[str, str]) -> Dict[str, Any]:
        """TFLOP/s over the measured iterations (FLOPs of a batch x measured batches / measured time) and MFU."""
        tflops = tflops_per_s(self._flops, self._ledger.counted_batches, counted_s)
        mfu = mfu_pct(tflops, self._peak_flops)
        if self._flops is None:
            unavailable["tflops_per_s"] = (
                "no `flops_per_batch` given: pass a number or 'auto'" if self.flops_per_batch is None else
                self._flops_reason or "`flops_per_batch='auto'` counts after the warm-up and no iteration got there")
        elif tflops is None:
            unavailable["tflops_per_s"] = "no iteration was measured"
        if mfu is None:
            unavailable["mfu_pct"] = (self._peak_reason if self._peak_flops is None else unavailable["tflops_per_s"])
        return {"flops_per_batch": self._flops, "flops_source": self._flops_source,
                "flops_count_time_s": self._flops_count_time_s, "tflops_per_s": tflops,
                "available_flops": self._peak_flops, "available_flops_source": self._peak_source,
                "flops_dtype": self._dtype_name, "mfu_pct": mfu}

    def _verdict_line(self) -> str:
        """One line for the console: the headline (mean), the typical iteration (median), the tail, the totals."""
        s = self._histogram().summary()
        if s["mean"] is None:
            return (f"IterationTimer: no iteration measured ({self.iterations} ran, {self.warmup_steps} warm-up"
                    " per fit)")
        line = (f"IterationTimer: {s['mean']:.2f} ms/iter mean ({1000.0 / s['mean']:.2f} it/s),"
                f" median {s['median']:.2f}, p95 {s['p95']:.2f} ms, over {self._histogram().count} of"
                f" {self.iterations} iterations;"
                f" train {self._train_time_s():.1f} s, eval {self._eval_time_s():.1f} s")
        section = self._summary_section()
        train, with_eval = section["projected_time_to_target_s"], section["projected_time_to_target_with_eval_s"]
        if train is not None:
            line += f"; {section['target_steps']:,} iterations: {train:.1f} s training"
            if with_eval is not None and with_eval != train:
                line += f", {with_eval:.1f} s with evaluation"
        return line + "\n" + tail_line(section["tail"])

    def _final_scalars(self) -> Dict[str, Optional[float]]:
        """The scalars logged at the end of training: the percentiles, it/s, TFLOP/s and MFU over every measured
        iteration, and the train and eval times."""
        s = self._histogram().summary()
        tflops = tflops_per_s(self._flops, self._ledger.counted_batches, self._histogram().total / 1000.0)
        return {
            "perf/final_ms_per_iter_p50": s["p50"],
            "perf/final_ms_per_iter_p95": s["p95"],
            "perf/final_ms_per_iter_p99": s["p99"],
            "perf/final_it_per_s": 1000.0 / s["mean"] if s["mean"] else None,
            "perf/final_tflops_per_s": tflops,
            "perf/final_mfu_pct": mfu_pct(tflops, self._peak_flops),
            "perf/train_time_s": self._train_time_s(),
            "perf/eval_time_s": self._eval_time_s(),
        }
