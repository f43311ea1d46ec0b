"""IterationTimer's checkpoint state: what a resume needs (cumulative counts, times, histograms, the tail's records),
written by ``state_of`` and read back by ``load_into``, which reads everything before it assigns anything."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict

from lightning_perf.callbacks.core.state import StateError, StateReader
from lightning_perf.measure.timing.clock import now
from lightning_perf.measure.timing.epochs import MAX_EPOCH_RECORDS
from lightning_perf.measure.timing.tail import CauseBook, SlowestIterations

if TYPE_CHECKING:
    from lightning_perf.callbacks.iteration_timer.callback import IterationTimer


def state_of(timer: "IterationTimer") -> Dict[str, Any]:
    if timer._clock is not None:  # the device intervals already passed go with the checkpoint (never waits)
        try:
            for ms in timer._clock.poll():
                timer._device.add(ms)
        except Exception as err:  # noqa: BLE001 - a measurement never stops a checkpoint
            timer._record_failure("state_dict (device events)", err)
    return {
        "iterations": timer.iterations,
        "batches": timer.batches,
        "samples": timer.samples,
        "train_time_s": timer._train_time_s(),
        "eval_time_s": timer._eval_time_s(),
        "counted_samples": timer._counted_samples,
        "counted_batches": timer._counted_batches,
        "items": timer.items,
        "counted_items": timer._counted_items,
        "flops": {"per_batch": timer._flops, "source": timer._flops_source, "counted_at": timer._flops_counted_at,
                  "count_time_s": timer._flops_count_time_s},
        "excluded": dict(timer._excluded),
        "warmup_time_s": timer._warmup_time_s,
        "startup_time_s": timer._startup_time_s,
        "validation_runs": timer._validation_runs,
        "fits": timer._fits,
        "epochs": list(timer._epochs.records),
        "open_epoch": timer._epochs.open_record(now(), timer._eval_time_fit, timer.iterations),
        "histogram_ms": timer._histogram().to_dict(),
        "blocks_ms": timer._series().to_dict(),
        "device_histogram_ms": timer._device.to_dict(),
        "tail": {"slowest": timer._slowest.to_state(), "gc_pause_s": timer._causes.gc_pause_s,
                 "own_s": timer._causes.own_s,
                 "causes": {name: hist.to_dict() for name, hist in timer._causes.hists.items()},
                 "alloc_retries": timer._alloc_retries},
    }


def load_into(timer: "IterationTimer", state_dict: Dict[str, Any]) -> None:
    s = StateReader(state_dict)
    epochs = [{"epoch": e.count("epoch"), "time_s": e.number("time_s"), "iterations": e.count("iterations"),
               "it_per_s": e.number("it_per_s", None, allow_none=True), "eval_time_s": e.number("eval_time_s")}
              for e in s.records("epochs")[:MAX_EPOCH_RECORDS]]
    carried = s.mapping("open_epoch", allow_none=True)
    open_epoch = None if carried is None or not carried.data else {
        "epoch": carried.count("epoch"), "iterations": carried.count("iterations"),
        "time_s": carried.number("time_s"), "eval_time_s": carried.number("eval_time_s")}
    flops = s.mapping("flops")
    counted_flops = flops.number("per_batch", None, allow_none=True)
    source = flops.text("source")
    if timer.flops_per_batch != "auto" or source != "auto":  # a count is kept for "auto" only; a number stays
        counted_flops, source = timer._flops, timer._flops_source
    tail = s.mapping("tail")
    slowest = SlowestIterations(timer.keep_slowest)
    rows = tail.data.get("slowest", [])
    if not isinstance(rows, list) or not all(isinstance(r, (list, tuple)) and len(r) in (6, 7) for r in rows):
        raise StateError("tail.slowest is not a list of 7-number rows")
    slowest.load(rows)
    causes = CauseBook()
    causes.gc_pause_s = tail.number("gc_pause_s")
    causes.own_s = tail.number("own_s")  # 0 in a checkpoint of an older version
    cause_states = tail.mapping("causes")
    causes.hists = {name: cause_states.histogram(name) for name in cause_states.data}
    retries = tail.count("alloc_retries", None) if tail.data.get("alloc_retries") is not None else None
    read = dict(
        iterations=s.count("iterations"), batches=s.count("batches"), samples=s.count("samples"),
        _prior_train_time_s=s.number("train_time_s"), _prior_eval_time_s=s.number("eval_time_s"),
        _counted_samples=s.count("counted_samples"), _counted_batches=s.count("counted_batches"),
        items=s.count("items"), _counted_items=s.count("counted_items"),
        _flops=counted_flops, _flops_source=source,
        _flops_counted_at=flops.count("counted_at", None) if flops.data.get("counted_at") is not None else None,
        _flops_count_time_s=flops.number("count_time_s"),
        _excluded={**timer._excluded, "warmup": s.mapping("excluded").count("warmup")},
        _warmup_time_s=s.number("warmup_time_s"), _startup_time_s=s.number("startup_time_s", None, allow_none=True),
        _validation_runs=s.count("validation_runs"),
        _fits=s.count("fits"),
        _host=s.histogram("histogram_ms", timer._histogram()), _blocks=s.series("blocks_ms", timer._series()),
        _device=s.histogram("device_histogram_ms", timer._device), _slowest=slowest,
        _causes=causes, _alloc_retries=retries)
    for name, value in read.items():  # all read: nothing is assigned from a state that fails halfway
        setattr(timer, name, value)
    timer._epochs.records, timer._epochs.carried = epochs, open_epoch
    timer._resumed_at = timer.iterations
