"""The device's energy per phase, read on the memory sampler's thread: NVML's energy counter where the board has one,
else its power reading integrated over time. No Lightning import here."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, Optional

#: A phase's energy is reported only once its readings span at least this long: the board updates its energy counter
#: (and its power reading) every 20 to 100 ms, so a shorter span would be mostly the steps of that update.
MIN_SPAN_S = 1.0
COUNTER = "energy counter"
POWER_X_TIME = "power x time"


def _reason(call: str, err: BaseException) -> str:
    return f"NVML {call} failed: {type(err).__name__}: {err}"


class EnergyMeter:
    """Joules per phase of one device. :meth:`tick` (the sampler's thread, after each sample) reads the energy counter
    (``nvmlDeviceGetTotalEnergyConsumption``, mJ since the driver loaded; Volta and newer) and credits the rise since
    the previous tick to the phase of this tick; where the board has no counter, the power (``nvmlDeviceGetPowerUsage``,
    mW) integrated by the trapezoid rule between ticks. The first tick chooses the source, so no NVML call is made at
    construction (that runs on the training thread). A phase change between two ticks credits that one interval to
    the new phase: at most one sampling interval of energy per phase boundary, of either sign.

    Args:
        nvml: the ``pynvml`` module (initialised).
        handle: the device's NVML handle.
        clock: a monotonic clock in seconds.
        min_span_s: the shortest span a phase's figure covers (default :data:`MIN_SPAN_S`).
    """

    def __init__(self, nvml: Any, handle: Any, clock: Callable[[], float] = time.monotonic,
                 min_span_s: Optional[float] = None) -> None:
        self.nvml, self.handle, self._clock = nvml, handle, clock
        self.min_span_s = MIN_SPAN_S if min_span_s is None else float(min_span_s)
        self.source: Optional[str] = None
        self.counter_reason: Optional[str] = None  # why the counter is not the source
        self.error: Optional[str] = None  # why readings stopped: the totals would be short, so none is reported
        self.readings = 0
        self._last: Optional[tuple] = None  # (time s, counter mJ or power W)
        self._phases: Dict[str, list] = {}  # phase -> [joules, seconds]
        self._lock = threading.Lock()

    def _read(self) -> float:
        if self.source == COUNTER:
            return float(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        return self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0

    def _choose_source(self) -> None:
        try:
            self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
            self.source = COUNTER
        except Exception as err:  # noqa: BLE001 - NotSupported before Volta, in some VMs; or an older nvidia-ml-py
            self.counter_reason = _reason("nvmlDeviceGetTotalEnergyConsumption", err)
            try:
                self.nvml.nvmlDeviceGetPowerUsage(self.handle)
                self.source = POWER_X_TIME
            except Exception as err2:  # noqa: BLE001
                self.error = f"no energy counter ({self.counter_reason}) and {_reason('nvmlDeviceGetPowerUsage', err2)}"

    def tick(self, phase: Optional[str]) -> None:
        """One reading, its rise since the last credited to ``phase`` (read but not credited when None)."""
        if self.error is not None:
            return
        try:
            if self.source is None:
                self._choose_source()
                if self.error is not None:
                    return
            now, value = self._clock(), self._read()
        except Exception as err:  # noqa: BLE001 - a reading that fails ends the totals: they would be short
            self.error = _reason("nvmlDeviceGetTotalEnergyConsumption" if self.source == COUNTER
                                 else "nvmlDeviceGetPowerUsage", err) + " (readings stopped)"
            return
        with self._lock:
            self.readings += 1
            last, self._last = self._last, (now, value)
            if last is None or phase is None:
                return
            seconds = now - last[0]
            if self.source == COUNTER:
                if value < last[1]:
                    self.error = (f"the energy counter went back from {last[1]:.0f} to {value:.0f} mJ (the driver"
                                  " reloaded?): readings stopped")
                    return
                joules = (value - last[1]) / 1000.0
            else:
                joules = 0.5 * (value + last[1]) * seconds
            acc = self._phases.setdefault(phase, [0.0, 0.0])
            acc[0] += joules
            acc[1] += seconds

    def phases(self) -> Dict[str, Dict[str, Any]]:
        """Per phase ``energy_j``, ``seconds`` (the span its readings cover) and ``mean_power_w``, or the figures
        None with ``unavailable.energy_j`` where the span is under :attr:`min_span_s` or readings stopped."""
        with self._lock:
            phases = {name: tuple(acc) for name, acc in self._phases.items()}
        out: Dict[str, Dict[str, Any]] = {}
        for name, (joules, seconds) in phases.items():
            entry: Dict[str, Any] = {"energy_j": joules, "seconds": seconds,
                                     "mean_power_w": joules / seconds if seconds > 0 else None, "unavailable": {}}
            why = self.error or (f"its readings span {seconds:.2f} s, under the {self.min_span_s:g} s a figure needs"
                                 " (the board updates its energy reading every 20 to 100 ms)"
                                 if seconds < self.min_span_s else None)
            if why:
                entry.update(energy_j=None, mean_power_w=None)
                entry["unavailable"]["energy_j"] = why
            out[name] = entry
        return out
