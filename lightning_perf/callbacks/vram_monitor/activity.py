"""VRAMMonitor's device activity: what the GPU and the host are doing (and the device's energy), read on the memory
sampler's thread; the training thread only takes window sums, and the summary and console line read them here."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

from lightning_perf.measure.device.activity import (GPU_READINGS, HOST_MIN_SPAN_S, HOST_READINGS, SCHED_READINGS,
                                                    ActivitySampler, HostActivityReader, NvmlActivityReader,
                                                    ThreadWaitReader)
from lightning_perf.measure.device.energy import EnergyMeter
from lightning_perf.measure.memory.phases import EVAL_KEY, PHASES
from lightning_perf.measure.memory.readers import NvmlReader

# activity reading -> (logged group, logged name); eval phases put their prefix before the name
ACTIVITY_KEYS = {"gpu_util_pct": ("gpu", "util_pct"), "mem_util_pct": ("gpu", "mem_util_pct"),
                 "power_w": ("gpu", "power_w"), "sm_clock_mhz": ("gpu", "sm_clock_mhz"),
                 "temperature_c": ("gpu", "temperature_c"), "process_cpu_cores": ("host", "process_cpu_cores"),
                 "host_cpu_pct": ("host", "cpu_pct"), "gpu_throttled_pct": ("gpu", "throttled_pct"),
                 "host_steal_pct": ("host", "steal_pct"), "cpu_wait_pct": ("host", "cpu_wait_pct")}


class ActivityProbe:
    """The activity readers of one run: NVML (where ``nvml_reader`` is given, else its readings are unavailable for
    ``nvml_reason``), psutil, and the scheduler statistics of the calling (training) thread; with NVML, the device's
    energy rides on the same ticks (docs/energy.md): no NVML call on the training thread."""

    def __init__(self, nvml_reader: Optional[NvmlReader], nvml_reason: str) -> None:
        self.host_cores: Optional[int] = None
        readers: List[Any] = []
        unavailable: Dict[str, str] = {}
        if nvml_reader is not None:
            readers.append(NvmlActivityReader(nvml_reader.nvml, nvml_reader.handle))
        else:
            unavailable.update({name: nvml_reason for name in GPU_READINGS})
        try:
            host = HostActivityReader()
            readers.append(host)
            self.host_cores = host.logical_cores
        except Exception as err:  # noqa: BLE001 - psutil refused (a sandbox): the GPU readings go on
            unavailable.update({name: f"psutil failed: {type(err).__name__}: {err}" for name in HOST_READINGS})
        try:  # called on the training thread (setup): its scheduler statistics, read on the sampler's thread
            readers.append(ThreadWaitReader(threading.get_native_id()))
        except Exception as err:  # noqa: BLE001 - not Linux, or the kernel keeps no scheduler statistics
            unavailable.update({name: f"no scheduler statistics of the training thread: {type(err).__name__}: {err}"
                                for name in SCHED_READINGS})
        self.sampler = ActivitySampler(readers, unavailable)
        self.energy = EnergyMeter(nvml_reader.nvml, nvml_reader.handle) if nvml_reader is not None else None

    def tick(self, phase: Optional[str]) -> None:
        """On the sampler's thread, at each of its samples."""
        self.sampler.tick(phase)
        if self.energy is not None:
            self.energy.tick(phase)

    def note_sampler_stop(self, sampler_error: Optional[str]) -> None:
        if sampler_error:
            self.sampler.stopped = f"sampling stopped: {sampler_error}"

    def window_metrics(self, phase: str) -> Dict[str, float]:
        """The window means of ``phase`` since its last log under their logged keys: sums the thread kept, no call
        to NVML or psutil here."""
        infix = "" if phase == "train" else EVAL_KEY[phase] + "_"
        return {f"{ACTIVITY_KEYS[name][0]}/{infix}{ACTIVITY_KEYS[name][1]}": value
                for name, value in self.sampler.take_window(phase).items()}

    def section(self, interval_s: float, sampler_error: Optional[str], train_batches: int,
                nvml_reason: str) -> Dict[str, Any]:
        """``vram.activity``: per phase the mean and p5 of each reading, and the energy."""
        self.note_sampler_stop(sampler_error)
        activity = self.sampler
        reasons = activity.unavailable
        return {
            "source": " + ".join(src for src, names in (("NVML", GPU_READINGS), ("psutil", HOST_READINGS),
                                                        ("schedstat", SCHED_READINGS))
                                 if any(n not in activity.unavailable for n in names)) or None,
            "interval_s": interval_s,
            "host_min_span_s": HOST_MIN_SPAN_S,
            "host_logical_cores": self.host_cores,
            "ticks": activity.ticks,
            "phases": {phase: activity.phase_stats(phase) for phase in PHASES if phase in activity.phases()},
            "unavailable": reasons,
            "energy": self._energy_section(reasons, sampler_error, train_batches, nvml_reason),
        }

    def _energy_section(self, reasons: Dict[str, str], sampler_error: Optional[str], train_batches: int,
                        nvml_reason: str) -> Optional[Dict[str, Any]]:
        """``vram.activity.energy``: the device's joules per phase (``EnergyMeter``); null, with ``energy`` in
        ``reasons``, without NVML. The per-work figures are joined with IterationTimer's when the summary is built."""
        meter = self.energy
        if meter is None:
            reasons["energy"] = nvml_reason
            return None
        if meter.error is None and sampler_error:
            meter.error = f"sampling stopped: {sampler_error}"  # the totals would be short
        stopped = meter.error or (None if meter.readings else "no energy reading was taken")
        return {"source": meter.source, "min_span_s": meter.min_span_s, "readings": meter.readings,
                "train_batches": train_batches,
                "phases": {p: v for p, v in meter.phases().items() if p in PHASES},
                "unavailable": {k: v for k, v in (("counter", meter.counter_reason), ("energy", stopped)) if v}}

    def verdict(self) -> str:
        """Per phase, GPU utilisation (mean and p5) beside the CPU use of this process and of the machine, so "the
        GPU idles while the process keeps one core of 16 busy" can be read off."""
        parts = []
        for phase in PHASES:
            if phase not in self.sampler.phases():
                continue
            stats = self.sampler.phase_stats(phase)
            bits = []
            gpu, own, machine = stats["gpu_util_pct"], stats["process_cpu_cores"], stats["host_cpu_pct"]
            if gpu is not None:
                bits.append(f"GPU busy {gpu['mean']:.0f}% (p5 {gpu['p5']:.0f}%)")
            if own is not None:
                bits.append(f"process {own['mean']:.1f} of {self.host_cores or '?'} cores")
            if machine is not None:
                bits.append(f"machine CPU {machine['mean']:.0f}%")
            if bits:
                parts.append(f"{phase}: " + ", ".join(bits))
        return "VRAMMonitor activity: " + ("; ".join(parts) or "no sample taken")
