"""Memory probes: torch allocator peaks per phase, NVML device/process memory, host RSS, a peak-hold sampler
thread and a leak detector. No Lightning import here."""

from __future__ import annotations

import ctypes
import os
import threading
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional

MB = 1024.0 * 1024.0


# -- host memory ----------------------------------------------------------------------------------------------------
class RssReader:
    """Resident set size of this process in MB; reads /proc/self/statm through an open descriptor (a few µs)."""

    def __init__(self) -> None:
        self._fd: Optional[int] = None
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            import psutil

            self._process = psutil.Process()

    def __call__(self) -> float:
        if self._fd is not None:
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[1]) * self._page / MB
        return self._process.memory_info().rss / MB

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def host_total_mb() -> Optional[float]:
    try:
        import psutil

        return psutil.virtual_memory().total / MB
    except Exception:  # noqa: BLE001
        return None


# -- torch allocator ------------------------------------------------------------------------------------------------
class AllocatorPeaks:
    """Peak allocated/reserved MB of one CUDA device, per phase, from torch's allocator counters.

    Resets torch's global peak counters at each phase start (``reset_peak_memory_stats``) and keeps the lifetime
    peak itself, so code that reads ``torch.cuda.max_memory_allocated()`` later still gets a true lifetime peak from
    :attr:`lifetime_peak_allocated_mb`. None of these calls synchronizes the device.

    Args:
        device: the CUDA device.
        backend: the module with ``max_memory_allocated``, ``max_memory_reserved``, ``memory_allocated``,
            ``reset_peak_memory_stats``; ``torch.cuda`` by default, a simulated one in tests.
    """

    def __init__(self, device: Any, backend: Any = None) -> None:
        if backend is None:
            import torch

            backend = torch.cuda
        self.device = device
        self.backend = backend
        peaks = self.current_peaks()
        self.lifetime_peak_allocated_mb = peaks["peak_allocated_mb"]
        self.lifetime_peak_reserved_mb = peaks["peak_reserved_mb"]

    def start_phase(self) -> None:
        self.end_phase()  # whatever happened since the last read belongs to the lifetime peak
        self.backend.reset_peak_memory_stats(self.device)

    def end_phase(self) -> Dict[str, float]:
        peaks = self.current_peaks()
        self.lifetime_peak_allocated_mb = max(self.lifetime_peak_allocated_mb, peaks["peak_allocated_mb"])
        self.lifetime_peak_reserved_mb = max(self.lifetime_peak_reserved_mb, peaks["peak_reserved_mb"])
        return peaks

    # torch.cuda.memory_allocated, max_memory_allocated and max_memory_reserved each flatten the allocator's whole
    # statistics dict (memory_allocated: 130 us a call on an H100 host, benchmarks/cuda_calls.py); the nested dict
    # they start from costs 14, so the figures are read from one nested dict where the backend has it.
    def _nested(self) -> Optional[Dict[str, Any]]:
        nested = getattr(self.backend, "memory_stats_as_nested_dict", None)
        return None if nested is None else nested(self.device)

    def current_peaks(self) -> Dict[str, float]:
        try:
            stats = self._nested()
            return {
                "peak_allocated_mb": stats["allocated_bytes"]["all"]["peak"] / MB,  # type: ignore[index]
                "peak_reserved_mb": stats["reserved_bytes"]["all"]["peak"] / MB,  # type: ignore[index]
            }
        except (KeyError, TypeError):  # no nested dict here (None), or not this shape
            return {
                "peak_allocated_mb": self.backend.max_memory_allocated(self.device) / MB,
                "peak_reserved_mb": self.backend.max_memory_reserved(self.device) / MB,
            }

    def allocated_mb(self) -> float:
        try:
            return self._nested()["allocated_bytes"]["all"]["current"] / MB  # type: ignore[index]
        except (KeyError, TypeError):
            return self.backend.memory_allocated(self.device) / MB


# -- NVML -----------------------------------------------------------------------------------------------------------
class NvmlUnavailable(RuntimeError):
    """NVML cannot give figures here; the message is the reason recorded in the summary."""


def load_pynvml() -> Any:
    """The ``pynvml`` module of nvidia-ml-py (a function, so tests can put a simulated NVML in its place)."""
    import pynvml

    return pynvml


class NvmlReader:
    """Device used/total and this process's memory from NVML, for one device. Raises NvmlUnavailable on failure."""

    def __init__(self, device_index: int, pci_bus_id: Optional[str] = None) -> None:
        try:
            self.nvml = load_pynvml()
        except ImportError as err:
            raise NvmlUnavailable(f"pynvml is not installed (pip install nvidia-ml-py): {err}") from None
        try:
            self.nvml.nvmlInit()
            if pci_bus_id:
                self.handle = self.nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
            else:
                self.handle = self.nvml.nvmlDeviceGetHandleByIndex(device_index)
            self.total_mb = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).total / MB
        except Exception as err:  # noqa: BLE001 - NVMLError_* has many subclasses: LibraryNotFound, NotSupported...
            raise NvmlUnavailable(f"NVML failed: {type(err).__name__}: {err}") from None
        self.pid = os.getpid()
        self.process_reason: Optional[str] = None

    def read(self) -> Dict[str, Optional[float]]:
        try:
            used = self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / MB
        except Exception as err:  # noqa: BLE001
            raise NvmlUnavailable(f"NVML memory query failed: {type(err).__name__}: {err}") from None
        process = None
        if self.process_reason is None:
            try:
                for proc in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
                    if proc.pid == self.pid and proc.usedGpuMemory is not None:
                        process = proc.usedGpuMemory / MB
                if process is None:
                    self.process_reason = "this process is not in NVML's process list (containers, WSL)"
            except Exception as err:  # noqa: BLE001
                self.process_reason = f"NVML process query failed: {type(err).__name__}: {err}"
        return {"nvml_used_mb": used, "nvml_process_mb": process}

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


# -- background sampling --------------------------------------------------------------------------------------------
class PeakSampler:
    """Samples ``read()`` every ``interval_s`` on a daemon thread and holds the peak of each field per phase.

    The training thread only switches phases (at phase boundaries); it never waits for a sample.
    ``read`` returns a dict of floats (or None); a read that raises stops sampling and sets :attr:`error`.
    ``on_tick(phase)``, when given, runs on the thread after each periodic sample (not at phase boundaries): the
    device activity readings ride on this thread.
    """

    def __init__(self, read: Callable[[], Dict[str, Optional[float]]], interval_s: float,
                 on_tick: Optional[Callable[[Optional[str]], None]] = None) -> None:
        self._read = read
        self.on_tick = on_tick
        self.interval_s = interval_s
        self.peaks: Dict[str, Dict[str, float]] = {}
        self.last: Dict[str, Optional[float]] = {}
        self.phase: Optional[str] = None
        self.error: Optional[str] = None
        self.samples = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _sample(self) -> None:
        try:
            values = self._read()
        except Exception as err:  # noqa: BLE001
            self.error = f"{type(err).__name__}: {err}"
            self._stop.set()
            return
        with self._lock:
            self.samples += 1
            self.last = values
            if self.phase is None:
                return
            held = self.peaks.setdefault(self.phase, {})
            for key, value in values.items():
                if value is not None and value > held.get(key, float("-inf")):
                    held[key] = value

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()
            if self.on_tick is not None and self.error is None:
                self.on_tick(self.phase)

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="lightning_perf-memory-sampler", daemon=True)
            self._thread.start()

    def set_phase(self, phase: Optional[str]) -> None:
        """Closes the current phase with one last sample and opens ``phase`` with a first one."""
        if self.error is None:
            self._sample()
        with self._lock:
            self.phase = phase
        if phase is not None and self.error is None:
            self._sample()

    def peak(self, phase: str, key: str) -> Optional[float]:
        return self.peaks.get(phase, {}).get(key)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(1.0, 5 * self.interval_s))
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


def heap_trimmer() -> Optional[Callable[[], Any]]:
    """The C library's ``malloc_trim(0)`` (glibc), which gives the heap's free pages back to the OS, or None where the
    process's C library has none. Memory a phase freed stays resident otherwise (allocations under malloc's mmap
    threshold, up to 32 MB once large blocks were freed, come from a heap that keeps its pages), so the next phase's
    RSS would still hold it: 150 x 2 MB freed read 810 MB resident before the trim and 512 after it, here."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # no such symbol; Windows takes no None for the process itself
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


# -- leak detection -------------------------------------------------------------------------------------------------
class LeakDetector:
    """Tells memory that keeps growing (a leak) from memory that grew and stopped, in O(1) memory.

    Values are averaged over windows of ``window`` iterations after ``warmup`` iterations. Two readings of them:

    - **while the phase runs** (:meth:`add` returns True once): ``windows`` consecutive window means each rise and
      the rise across them is at least ``threshold_mb_per_100`` MB per 100 iterations: growth so far, worth a warning;
    - **the verdict** (:meth:`result`, ``suspected``): a leak is growth that continues. It is read on the floor of
      the later half of the window means seen (at least ``windows`` of them; :meth:`trend`): the floor rises by at
      least the threshold, and still rises by half of it at the end. Memory that rose and then stayed flat (a first
      epoch, a cache filling, workers starting) is not a leak (``growth_stopped`` where the warning fired), nor is
      memory that rises and falls again (a sawtooth whose teeth are shorter than an eighth of the phase: its troughs
      stay level).

    The window means are kept in at most :attr:`HISTORY` entries: when full, neighbours are merged and each entry
    spans twice the windows, so a phase of any length costs the same memory.

    ``stride``: the caller reads memory once every ``stride`` iterations (a read of the CUDA allocator costs tens of
    microseconds) and passes each reading to :meth:`add`; windows, warm-up and the rate stay in iterations.
    """

    HISTORY = 64

    def __init__(self, window: int = 25, windows: int = 4, threshold_mb_per_100: float = 2.0, warmup: int = 10,
                 stride: int = 1) -> None:
        self.window, self.windows, self.threshold, self.warmup = window, windows, threshold_mb_per_100, warmup
        self.stride = max(1, int(stride))
        self._per_window = max(1, window // self.stride)  # readings per window
        self.reset()

    def reset(self) -> None:
        self.seen = 0
        self._sum = 0.0
        self._n = 0
        self._means: Deque[float] = deque(maxlen=self.windows)
        self.suspected = False  # the warning's reading: growth so far
        self.rate_mb_per_100: Optional[float] = None
        self.max_rate_mb_per_100: Optional[float] = None
        self._history: List[float] = []  # window means, each entry the mean of `_span` windows
        self._span = 1
        self._merge_sum, self._merge_n = 0.0, 0

    def add(self, mb: float) -> bool:
        """Adds one sample; returns True the first time the growth so far is worth a warning."""
        self.seen += 1
        if self.seen * self.stride <= self.warmup:
            return False
        self._sum += mb
        self._n += 1
        if self._n < self._per_window:
            return False
        mean = self._sum / self._n
        self._means.append(mean)
        self._keep(mean)
        self._sum, self._n = 0.0, 0
        if len(self._means) < self.windows:
            return False
        means = list(self._means)
        rate = 100.0 * (means[-1] - means[0]) / ((self.windows - 1) * self._per_window * self.stride)
        self.rate_mb_per_100 = rate
        self.max_rate_mb_per_100 = rate if self.max_rate_mb_per_100 is None else max(self.max_rate_mb_per_100, rate)
        rising = all(b > a for a, b in zip(means, means[1:]))
        if rising and rate >= self.threshold and not self.suspected:
            self.suspected = True
            return True
        return False

    def _keep(self, mean: float) -> None:
        self._merge_sum += mean
        self._merge_n += 1
        if self._merge_n < self._span:
            return
        self._history.append(self._merge_sum / self._merge_n)
        self._merge_sum, self._merge_n = 0.0, 0
        if len(self._history) >= self.HISTORY:
            pairs = zip(self._history[0::2], self._history[1::2])
            self._history = [(a + b) / 2.0 for a, b in pairs]
            self._span *= 2

    def trend(self) -> Optional[Dict[str, float]]:
        """The floor of the later half, MB per 100 iterations: that half in 4 equal chunks, each chunk's lowest window
        mean (a sawtooth's troughs stay level, a leak's rise), ``later`` the least-squares slope of the 4 floors and
        ``recent`` the rise from the third to the fourth. None before ``windows`` window means."""
        if len(self._history) < self.windows:
            return None
        later = self._history[-max(self.windows, len(self._history) // 2):]
        chunk = max(1, len(later) // 4)
        later = later[-4 * chunk:]
        floors = [min(later[i * chunk:(i + 1) * chunk]) for i in range(len(later) // chunk)]
        iterations = chunk * self._span * self._per_window * self.stride  # between two floors
        return {"later": 100.0 * _slope(floors) / iterations, "recent": 100.0 * (floors[-1] - floors[-2]) / iterations}

    def result(self) -> Dict[str, Any]:
        trend = self.trend()
        continuing = (trend is not None and trend["later"] > 0.0 and trend["later"] >= self.threshold
                      and trend["recent"] >= 0.5 * self.threshold)
        return {
            "suspected": continuing,
            "rate_mb_per_100_iters": trend["later"] if trend is not None else self.rate_mb_per_100,
            "growth_stopped": self.suspected and not continuing,
            "samples": self.seen,
            "iterations_per_sample": self.stride,
        }


def _slope(values: List[float]) -> float:
    """Least-squares slope of ``values`` against 0, 1, 2, ... (per entry)."""
    n = len(values)
    x_mean, y_mean = (n - 1) / 2.0, sum(values) / n
    sxx = sum((i - x_mean) ** 2 for i in range(n))
    return sum((i - x_mean) * (v - y_mean) for i, v in enumerate(values)) / sxx if sxx else 0.0
