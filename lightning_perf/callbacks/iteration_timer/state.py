"""IterationTimer's checkpoint state: what a resume needs (cumulative counts, times, histograms, the tail's records),
written by ``_state_of`` and read back by ``_load_into``, which reads everything before it assigns anything."""

from __future__ import annotations

from typing import Any, Dict

from lightning_perf.callbacks.core.state import StateError, StateReader
from lightning_perf.measure.timing.clock import now
from lightning_perf.measure.timing.epochs import MAX_EPOCH_RECORDS
from lightning_perf.measure.timing.tail import CauseBook, SlowestIterations


class CheckpointState:
    """IterationTimer's ``state_dict`` and ``load_state_dict`` contents, as methods of the timer (one of its
    bases)."""

    def _state_of(self) -> Dict[str, Any]:
        if self._clock is not None:  # the device intervals already passed go with the checkpoint (never waits)
            try:
                for ms in self._clock.poll():
                    self._device.add(ms)
            except Exception as err:  # noqa: BLE001 - a measurement never stops a checkpoint
                self._record_failure("state_dict (device events)", err)
        return {
            "iterations": self.iterations,
            "batches": self.batches,
            "samples": self.samples,
            "train_time_s": self._train_time_s(),
            "eval_time_s": self._eval_time_s(),
            "counted_samples": self._counted_samples,
            "counted_batches": self._counted_batches,
            "items": self.items,
            "counted_items": self._counted_items,
            "flops": {"per_batch": self._flops, "source": self._flops_source, "counted_at": self._flops_counted_at,
                      "count_time_s": self._flops_count_time_s},
            "excluded": dict(self._excluded),
            "warmup_time_s": self._warmup_time_s,
            "startup_time_s": self._startup_time_s,
            "validation_runs": self._validation_runs,
            "fits": self._fits,
            "epochs": list(self._epochs.records),
            "open_epoch": self._epochs.open_record(now(), self._eval_time_fit, self.iterations),
            "histogram_ms": self._histogram().to_dict(),
            "blocks_ms": self._series().to_dict(),
            "device_histogram_ms": self._device.to_dict(),
            "tail": {"slowest": self._slowest.to_state(), "gc_pause_s": self._causes.gc_pause_s,
                     "own_s": self._causes.own_s,
                     "causes": {name: hist.to_dict() for name, hist in self._causes.hists.items()},
                     "alloc_retries": self._alloc_retries},
        }

    def _load_into(self, state_dict: Dict[str, Any]) -> None:
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
        if self.flops_per_batch != "auto" or source != "auto":  # a count is kept for "auto" only; a number stays
            counted_flops, source = self._flops, self._flops_source
        tail = s.mapping("tail")
        slowest = SlowestIterations(self.keep_slowest)
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
            _excluded={**self._excluded, "warmup": s.mapping("excluded").count("warmup")},
            _warmup_time_s=s.number("warmup_time_s"), _startup_time_s=s.number("startup_time_s", None, allow_none=True),
            _validation_runs=s.count("validation_runs"),
            _fits=s.count("fits"),
            _host=s.histogram("histogram_ms", self._histogram()), _blocks=s.series("blocks_ms", self._series()),
            _device=s.histogram("device_histogram_ms", self._device), _slowest=slowest,
            _causes=causes, _alloc_retries=retries)
        for name, value in read.items():  # all read: nothing is assigned from a state that fails halfway
            setattr(self, name, value)
        self._epochs.records, self._epochs.carried = epochs, open_epoch
        self._resumed_at = self.iterations
