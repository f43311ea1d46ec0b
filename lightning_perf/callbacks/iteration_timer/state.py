"""IterationTimer's checkpoint state: what a resume needs, the ledger's (``IterationLedger.to_state``: counts, times,
histograms, the tail's records) with the FLOP count, the device's histogram and the allocator's retries, written by
``_state_of`` and read back by ``_load_into``, which reads everything before it assigns anything."""

from __future__ import annotations

from typing import Any, Dict

from lightning_perf.callbacks.core.state import StateReader


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
        state = self._ledger.to_state()
        state["flops"] = {"per_batch": self._flops, "source": self._flops_source,
                          "counted_at": self._flops_counted_at, "count_time_s": self._flops_count_time_s}
        state["device_histogram_ms"] = self._device.to_dict()
        state["tail"]["alloc_retries"] = self._alloc_retries
        return state

    def _load_into(self, state_dict: Dict[str, Any]) -> None:
        s = StateReader(state_dict)
        flops = s.mapping("flops")
        counted_flops = flops.number("per_batch", None, allow_none=True)
        source = flops.text("source")
        if self.flops_per_batch != "auto" or source != "auto":  # a count is kept for "auto" only; a number stays
            counted_flops, source = self._flops, self._flops_source
        tail = s.mapping("tail")
        retries = tail.count("alloc_retries", None) if tail.data.get("alloc_retries") is not None else None
        read = dict(
            _flops=counted_flops, _flops_source=source,
            _flops_counted_at=flops.count("counted_at", None) if flops.data.get("counted_at") is not None else None,
            _flops_count_time_s=flops.number("count_time_s"),
            _device=s.histogram("device_histogram_ms", self._device), _alloc_retries=retries)
        self._ledger.load(s)  # reads all of its part before it assigns any; a failure leaves the timer as it was
        for name, value in read.items():  # all read: nothing is assigned from a state that fails halfway
            setattr(self, name, value)
