"""IterationTimer's results: its summary section (``iteration_timer`` in the summary file), the scalars logged at the
end of training and its line for the console, built from the timer's counts and histograms (any read: nothing here
changes the timer)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

from lightning_perf.measure.timing.flops import mfu_pct, tflops_per_s
from lightning_perf.measure.timing.tail import tail_block
from lightning_perf.measure.timing.tail_advice import tail_insights, tail_line
from lightning_perf.summary.projection import project_time

if TYPE_CHECKING:
    from lightning_perf.callbacks.iteration_timer.callback import IterationTimer


def summary_section(timer: "IterationTimer") -> Dict[str, Any]:
    s = timer._histogram().summary()
    counted_s = timer._histogram().total / 1000.0
    unavailable: Dict[str, str] = {}
    samples_per_s = None
    if timer._samples_unknown is not None:
        unavailable["samples_per_s"] = timer._samples_unknown
    elif counted_s > 0:
        samples_per_s = timer._counted_samples / counted_s
    if timer._histogram().count == 0:
        unavailable["ms_per_iter"] = (
            f"no iteration was measured: {timer.iterations} iterations ran and the first"
            f" {timer.warmup_steps} of each fit are warm-up"
        )
    startup = timer._startup_time_s if timer._fits else None
    if startup is None:
        unavailable["startup_time_s"] = ("training never started" if not timer._fits else
                                         "resumed from a checkpoint that kept no startup time (an older version)")
    if timer._clock is None:
        unavailable["device_ms_per_iter"] = "device timing needs CUDA" if timer.device_timing else "switched off"
    elif timer._device.count == 0:
        unavailable["device_ms_per_iter"] = "no CUDA event interval completed"
    flops = _flops_section(timer, counted_s, unavailable)
    items_per_s = None
    if timer.items_fn is None:
        unavailable["items_per_s"] = "no `items_fn` given: pass `items_fn=` (batch -> tokens, pixels, ...)"
    elif timer._items_unknown is not None:
        unavailable["items_per_s"] = timer._items_unknown
    elif counted_s > 0:
        items_per_s = timer._counted_items / counted_s
    target = target_iterations(timer)
    if target is None:
        unavailable["projected_time_to_target_s"] = "no target: set `target_steps` or the trainer's `max_steps`"
    section: Dict[str, Any] = {
        "iterations": timer.iterations,
        "batches": timer.batches,
        "samples": timer.samples if timer._samples_unknown is None else None,
        "measured_iterations": timer._histogram().count,
        "warmup_steps": timer.warmup_steps,
        "excluded": dict(timer._excluded),
        "warmup_time_s": timer._warmup_time_s,
        "startup_time_s": startup,
        "fits": timer._fits,
        "manual_optimization": timer._manual,
        "resumed_at_iteration": timer._resumed_at,
        "ms_per_iter": s,
        "it_per_s": 1000.0 / s["mean"] if s["mean"] else None,
        "batches_per_s": timer._counted_batches / counted_s if counted_s > 0 else None,
        "samples_per_s": samples_per_s,
        "items": timer.items if timer.items_fn is not None and timer._items_unknown is None else None,
        "items_per_s": items_per_s,
        **flops,
        "device_ms_per_iter": timer._device.summary() if timer._device.count else None,
        "device_events_dropped": timer._clock.dropped if timer._clock is not None else 0,
        "device_timed_iterations": timer._device.count if (timer._clock is not None or timer._device.count) else None,
        "device_timing_every_n_iterations": timer.device_timing_every_n_iterations,
        "train_time_s": timer._train_time_s(),
        "eval_time_s": timer._eval_time_s(),
        "sanity_check_time_s": timer._sanity_time_s,
        "validation_runs": timer._validation_runs,
        "eval_time_per_validation_s": (
            timer._eval_time_s() / timer._validation_runs if timer._validation_runs else None),
        "epochs": list(timer._epochs.records),
        "ranks": timer._ranks,
        "histogram_ms": timer._histogram().to_dict(),
        "blocks_ms": timer._series().to_dict(),
        "tail": _tail_section(timer, unavailable),
        "unavailable": unavailable,
    }
    section["target_steps"] = target
    unknown = {"train_s": None, "with_eval_s": None}
    total = project_time(section, target) if target is not None else unknown
    left = project_time(section, target, done=timer.iterations) if target is not None else unknown
    section["projected_time_to_target_s"] = total["train_s"]
    section["projected_time_to_target_with_eval_s"] = total["with_eval_s"]
    section["projected_remaining_s"] = left["train_s"]
    section["projected_remaining_with_eval_s"] = left["with_eval_s"]
    return section


def target_iterations(timer: "IterationTimer") -> Optional[int]:
    """N in iterations. A target taken from ``max_steps`` counts optimizer steps: under manual optimization
    (an iteration is a batch) it is converted at the ratio of batches to optimizer steps seen so far."""
    target = timer._target
    if target is None or not (timer._manual and timer._target_from_max_steps):
        return target
    steps = timer._last_global_step - timer._first_global_step
    fit_iters = timer._fit_iterations
    if steps <= 0 or fit_iters <= 0:
        return target
    return int(round(target * fit_iters / steps))


def _tail_section(timer: "IterationTimer", unavailable: Dict[str, str]) -> Dict[str, Any]:
    gc_figures = {"collections": timer._gc.collections, "full_collections": timer._gc.full_collections,
                  "pause_s": timer._gc.pause_s}
    if timer._alloc_retries is None:
        unavailable["tail.alloc_retries"] = ("the CUDA allocator's retries are read on CUDA only"
                                             if timer._clock is None else "not read: training did not end")
    block = tail_block(timer._histogram(), timer._causes, timer._slowest,
                       {"gc": gc_figures, "alloc_retries": timer._alloc_retries, "dataloader": timer._loader_info})
    block["insights"] = tail_insights(block)
    if block["share_pct"] is None:
        unavailable["tail"] = "no iteration was measured"
    return block


def _flops_section(timer: "IterationTimer", counted_s: float, unavailable: Dict[str, str]) -> Dict[str, Any]:
    """TFLOP/s over the measured iterations (FLOPs of a batch x measured batches / measured time) and MFU."""
    tflops = tflops_per_s(timer._flops, timer._counted_batches, counted_s)
    mfu = mfu_pct(tflops, timer._peak_flops)
    if timer._flops is None:
        unavailable["tflops_per_s"] = (
            "no `flops_per_batch` given: pass a number or 'auto'" if timer.flops_per_batch is None else
            timer._flops_reason or "`flops_per_batch='auto'` counts after the warm-up and no iteration got there")
    elif tflops is None:
        unavailable["tflops_per_s"] = "no iteration was measured"
    if mfu is None:
        unavailable["mfu_pct"] = (timer._peak_reason if timer._peak_flops is None else unavailable["tflops_per_s"])
    return {"flops_per_batch": timer._flops, "flops_source": timer._flops_source,
            "flops_count_time_s": timer._flops_count_time_s, "tflops_per_s": tflops,
            "available_flops": timer._peak_flops, "available_flops_source": timer._peak_source,
            "flops_dtype": timer._dtype_name, "mfu_pct": mfu}


def verdict_line(timer: "IterationTimer") -> str:
    """One line for the console: the headline (mean), the typical iteration (median), the tail, the totals."""
    s = timer._histogram().summary()
    if s["mean"] is None:
        return f"IterationTimer: no iteration measured ({timer.iterations} ran, {timer.warmup_steps} warm-up per fit)"
    line = (f"IterationTimer: {s['mean']:.2f} ms/iter mean ({1000.0 / s['mean']:.2f} it/s), median {s['median']:.2f},"
            f" p95 {s['p95']:.2f} ms, over {timer._histogram().count} of {timer.iterations} iterations;"
            f" train {timer._train_time_s():.1f} s, eval {timer._eval_time_s():.1f} s")
    section = summary_section(timer)
    train, with_eval = section["projected_time_to_target_s"], section["projected_time_to_target_with_eval_s"]
    if train is not None:
        line += f"; {section['target_steps']:,} iterations: {train:.1f} s training"
        if with_eval is not None and with_eval != train:
            line += f", {with_eval:.1f} s with evaluation"
    return line + "\n" + tail_line(section["tail"])


def final_scalars(timer: "IterationTimer") -> Dict[str, Optional[float]]:
    """The scalars logged at the end of training: the percentiles, it/s, TFLOP/s and MFU over every measured
    iteration, and the train and eval times."""
    s = timer._histogram().summary()
    tflops = tflops_per_s(timer._flops, timer._counted_batches, timer._histogram().total / 1000.0)
    return {
        "perf/final_ms_per_iter_p50": s["p50"],
        "perf/final_ms_per_iter_p95": s["p95"],
        "perf/final_ms_per_iter_p99": s["p99"],
        "perf/final_it_per_s": 1000.0 / s["mean"] if s["mean"] else None,
        "perf/final_tflops_per_s": tflops,
        "perf/final_mfu_pct": mfu_pct(tflops, timer._peak_flops),
        "perf/train_time_s": timer._train_time_s(),
        "perf/eval_time_s": timer._eval_time_s(),
    }
