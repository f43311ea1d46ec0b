"""What the GPU and the host are doing, read on the memory sampler's thread: NVML utilisation, power, SM clock,
temperature and clock throttling, CPU use of this process and of the machine, the hypervisor's steal, and how long the
training thread waited for a CPU; per phase a mean and a p5 in bounded memory. No Lightning import here."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from lightning_perf.measure.stats.streaming import LogHistogram

#: Readings from NVML, in the order the summary lists them.
GPU_READINGS = ("gpu_util_pct", "mem_util_pct", "power_w", "sm_clock_mhz", "temperature_c", "gpu_throttled_pct")
#: Readings from psutil.
HOST_READINGS = ("process_cpu_cores", "host_cpu_pct", "host_steal_pct")
#: Readings from the kernel's scheduler statistics of the training thread.
SCHED_READINGS = ("cpu_wait_pct",)
READINGS = GPU_READINGS + HOST_READINGS + SCHED_READINGS
#: NVML's clock event (throttle) reasons that mean the board slowed itself: software power cap (0x4), hardware
#: slowdown (0x8), software thermal slowdown (0x20), hardware thermal slowdown (0x40), power brake (0x80). Idle,
#: application clock settings, sync boost and display clock settings are not a slowdown of work.
THROTTLE_REASONS_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
#: Host CPU figures are rates over at least this span: the kernel counts CPU time in 10 ms ticks, so a 50 ms span
#: would read a busy core as anything from 0.8 to 1.2 cores.
HOST_MIN_SPAN_S = 0.25
#: The p5 comes from a log-bucket histogram (:class:`LogHistogram`): within this relative error of a sample value.
P5_RELATIVE_ACCURACY = 0.005


def _reason(call: str, err: BaseException) -> str:
    return f"{call} failed: {type(err).__name__}: {err}"


class NvmlActivityReader:
    """GPU utilisation and memory-controller utilisation (%), power (W), SM clock (MHz), temperature (C) of one
    device, and whether the board was slowing its clocks for power or heat (``gpu_throttled_pct``: 100 for a sample
    with a reason of :data:`THROTTLE_REASONS_MASK`, else 0, so its mean is the share of samples throttled). A query that fails (``NVMLError_NotSupported`` on many boards, in WSL, in containers) is dropped with its
    reason in :attr:`unavailable`; the other readings go on.

    Args:
        nvml: the ``pynvml`` module (initialised).
        handle: the device's NVML handle.
    """

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self.unavailable: Dict[str, str] = {}
        clock_sm = getattr(nvml, "NVML_CLOCK_SM", 1)
        sensor = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
        self._queries: List[tuple] = [
            (("gpu_util_pct", "mem_util_pct"), "nvmlDeviceGetUtilizationRates",
             lambda: self._utilisation(nvml.nvmlDeviceGetUtilizationRates(handle))),
            (("power_w",), "nvmlDeviceGetPowerUsage", lambda: (nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,)),
            (("sm_clock_mhz",), "nvmlDeviceGetClockInfo", lambda: (float(nvml.nvmlDeviceGetClockInfo(handle,
                                                                                                   clock_sm)),)),
            (("temperature_c",), "nvmlDeviceGetTemperature",
             lambda: (float(nvml.nvmlDeviceGetTemperature(handle, sensor)),)),
        ]
        # NVML 12.5 renamed the query (the old name is deprecated): whichever this nvidia-ml-py has
        reasons = next((name for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                                          "nvmlDeviceGetCurrentClocksThrottleReasons") if hasattr(nvml, name)), None)
        if reasons is None:
            self.unavailable["gpu_throttled_pct"] = "this nvidia-ml-py has no clock throttle reasons query"
        else:
            self._queries.append((("gpu_throttled_pct",), reasons, lambda: (
                100.0 if getattr(nvml, reasons)(handle) & THROTTLE_REASONS_MASK else 0.0,)))

    @staticmethod
    def _utilisation(rates: Any) -> tuple:
        return float(rates.gpu), float(rates.memory)

    def read(self) -> Dict[str, float]:
        values: Dict[str, float] = {}
        for names, call, query in self._queries:
            if names[0] in self.unavailable:
                continue
            try:
                values.update(zip(names, query()))
            except Exception as err:  # noqa: BLE001 - NVMLError_* has many subclasses: NotSupported, NoPermission...
                for name in names:
                    self.unavailable[name] = f"NVML {_reason(call, err)}"
        return values


def _machine_times(times: Any) -> tuple:
    """(total, busy) CPU seconds of the machine, counted as psutil's ``cpu_percent`` counts them: guest time is in
    user time already, idle and iowait are not busy."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total, total - times.idle - getattr(times, "iowait", 0.0)


class HostActivityReader:
    """CPU use of this process (in cores: 1.0 is one core busy all the time; its threads, not DataLoader worker
    processes), of the whole machine (% of all logical cores) and the hypervisor's steal (% of the machine's CPU
    time a virtual machine's hypervisor gave to others; Linux), from psutil's CPU time counters over spans of at
    least ``min_span_s``; a read within a shorter span gives nothing. Independent of ``psutil.cpu_percent``'s shared
    state, so user code calling it does not disturb these figures.

    Args:
        min_span_s: the shortest span a figure covers.
        clock: a monotonic clock in seconds.
    """

    def __init__(self, min_span_s: float = HOST_MIN_SPAN_S, clock: Callable[[], float] = time.monotonic,
                 psutil_module: Any = None) -> None:
        if psutil_module is None:
            import psutil as psutil_module
        self._psutil = psutil_module
        self._process = psutil_module.Process()
        self.min_span_s = min_span_s
        self._clock = clock
        self.logical_cores: Optional[int] = psutil_module.cpu_count(logical=True)
        self.unavailable: Dict[str, str] = {}
        self._failed = False
        self._last = self._snapshot()
        if self._last[4] is None:
            self.unavailable["host_steal_pct"] = "the kernel counts no steal time here (psutil reports it on Linux)"

    def _snapshot(self) -> tuple:
        own = self._process.cpu_times()
        times = self._psutil.cpu_times()
        total, busy = _machine_times(times)
        return self._clock(), own.user + own.system, total, busy, getattr(times, "steal", None)

    def read(self) -> Dict[str, float]:
        if self._failed or self._clock() - self._last[0] < self.min_span_s:
            return {}
        try:
            now = self._snapshot()
        except Exception as err:  # noqa: BLE001 - a process table that cannot be read (a sandbox) ends these
            self._failed = True
            for name in HOST_READINGS:
                self.unavailable[name] = f"psutil {_reason('cpu_times', err)}"
            return {}
        last, self._last = self._last, now
        values = {"process_cpu_cores": max(0.0, now[1] - last[1]) / max(now[0] - last[0], 1e-9)}
        if now[2] > last[2]:
            values["host_cpu_pct"] = min(100.0, max(0.0, 100.0 * (now[3] - last[3]) / (now[2] - last[2])))
            if now[4] is not None and last[4] is not None:
                values["host_steal_pct"] = min(100.0, max(0.0, 100.0 * (now[4] - last[4]) / (now[2] - last[2])))
        return values


class ThreadWaitReader:
    """The share of wall time one thread (the training loop's) was ready to run but waited for a CPU, from the
    kernel's scheduler statistics (``/proc/self/task/<tid>/schedstat``: ns on a CPU, ns waiting on a run queue,
    time slices), over spans of at least ``min_span_s``. Other processes or threads taking the cores the loop needs
    raise it; a thread that sleeps or waits for I/O or a lock does not (that is not waiting for a CPU). Linux only:
    elsewhere, or where the kernel keeps no such statistics, construction raises ``OSError``.

    Args:
        tid: the thread's native id (``threading.get_native_id()`` on that thread).
        min_span_s: the shortest span a figure covers.
        clock: a monotonic clock in seconds.
        path: the statistics file (by default the thread's own).
    """

    def __init__(self, tid: int, min_span_s: float = HOST_MIN_SPAN_S, clock: Callable[[], float] = time.monotonic,
                 path: Optional[str] = None) -> None:
        self.path = path or f"/proc/self/task/{tid}/schedstat"
        self.min_span_s = min_span_s
        self._clock = clock
        self.unavailable: Dict[str, str] = {}
        self._last = self._snapshot()

    def _snapshot(self) -> tuple:
        with open(self.path, encoding="ascii") as fh:
            return self._clock(), int(fh.read().split()[1]) / 1e9

    def read(self) -> Dict[str, float]:
        if self.unavailable or self._clock() - self._last[0] < self.min_span_s:
            return {}
        try:
            now = self._snapshot()
        except Exception as err:  # noqa: BLE001 - the thread ended, or the file went away: this reading stops
            self.unavailable["cpu_wait_pct"] = _reason(f"reading {self.path}", err)
            return {}
        last, self._last = self._last, now
        return {"cpu_wait_pct": min(100.0, max(0.0, 100.0 * (now[1] - last[1]) / max(now[0] - last[0], 1e-9)))}


class ActivitySampler:
    """Reads its readers once per :meth:`tick` (called by the memory sampler's thread) and keeps, per phase and
    reading, a :class:`LogHistogram` (mean exact, p5 within 0.5%, a few kB for any run length) and the sum and count
    of the current window. The training thread only reads: :meth:`take_window` at log steps, no device call.

    Args:
        readers: objects with ``read() -> {reading: value}`` and an ``unavailable`` dict.
        unavailable: reasons for readings no reader gives (NVML absent, a CPU run).
    """

    def __init__(self, readers: Sequence[Any], unavailable: Optional[Dict[str, str]] = None) -> None:
        self._readers = list(readers)
        self._base_unavailable = dict(unavailable or {})
        self._stats: Dict[str, Dict[str, LogHistogram]] = {}
        self._windows: Dict[str, Dict[str, List[float]]] = {}
        self._lock = threading.Lock()  # the accumulators: held for microseconds
        self._read_lock = threading.Lock()  # one read at a time: host spans stay consecutive
        self.ticks = 0
        self.error: Optional[str] = None
        self.stopped: Optional[str] = None

    def tick(self, phase: Optional[str]) -> None:
        """One sample of every reader, credited to ``phase`` (read but not kept when None: between phases)."""
        if self.error is not None:
            return
        try:
            with self._read_lock:
                values: Dict[str, float] = {}
                for reader in self._readers:
                    values.update(reader.read())
            with self._lock:
                self.ticks += 1
                if phase is None:
                    return
                stats = self._stats.setdefault(phase, {})
                window = self._windows.setdefault(phase, {})
                for name, value in values.items():
                    hist = stats.get(name)
                    if hist is None:
                        hist = stats[name] = LogHistogram(P5_RELATIVE_ACCURACY)
                    hist.add(value)
                    acc = window.setdefault(name, [0.0, 0])
                    acc[0] += value
                    acc[1] += 1
        except Exception as err:  # noqa: BLE001 - a bug here must not end the memory sampling it rides on
            self.error = f"{type(err).__name__}: {err}"

    def take_window(self, phase: str) -> Dict[str, float]:
        """The mean of each reading of ``phase`` since the last call, and a new window; readings without a sample in
        the window are left out."""
        with self._lock:
            window = self._windows.pop(phase, {})
        return {name: total / count for name, (total, count) in window.items() if count}

    def phases(self) -> List[str]:
        with self._lock:
            return list(self._stats)

    def phase_stats(self, phase: str) -> Dict[str, Optional[Dict[str, Any]]]:
        """Per reading: ``mean``, ``p5``, ``samples``; None for a reading without a sample in ``phase``."""
        with self._lock:
            stats = dict(self._stats.get(phase, {}))
            out: Dict[str, Optional[Dict[str, Any]]] = {}
            for name in READINGS:
                hist = stats.get(name)
                out[name] = None if hist is None or not hist.count else {
                    "mean": hist.mean, "p5": hist.quantile(0.05), "samples": hist.count}
        return out

    @property
    def unavailable(self) -> Dict[str, str]:
        """Reading -> why it has no figure (or, with figures, why they stop early)."""
        reasons = dict(self._base_unavailable)
        for reader in self._readers:
            for name, reason in reader.unavailable.items():
                reasons.setdefault(name, reason)
        stop = self.stopped or (f"activity sampling failed: {self.error}" if self.error else None)
        if stop:
            for name in READINGS:
                reasons.setdefault(name, stop)
        return reasons
