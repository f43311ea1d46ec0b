"""VRAMMonitor: true peak memory per phase (train, validation, test, predict), NVML sampling, headroom and leaks."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lightning_perf.callbacks.core.arguments import bad_argument, check_bool, check_number, check_positive_int
from lightning_perf.callbacks.core.base import PerfCallback, guarded, reads_state
from lightning_perf.callbacks.core.rank_gather import Rows, gather_floats_then, spread_across_ranks
from lightning_perf.callbacks.core.scalars import WAITING, log_scalars
from lightning_perf.callbacks.core.state import StateError, StateReader
from lightning_perf.callbacks.vram_monitor.activity import ActivityProbe
from lightning_perf.callbacks.vram_monitor.hook_phases import HookPhases
from lightning_perf.measure.memory.allocator import AllocatorHealth
from lightning_perf.measure.memory.phases import EVAL_KEY as _EVAL_KEY
from lightning_perf.measure.memory.phases import (PHASES, hold_max as _hold_max, leak_detectors, leak_warning,
                                                  memory_verdict, usage_pct)
from lightning_perf.measure.memory.readers import (
    AllocatorPeaks,
    LeakDetector,
    NvmlReader,
    NvmlUnavailable,
    PeakSampler,
    RssReader,
    heap_trimmer,
    host_total_mb,
)
from lightning_perf.measure.timing.clock import now
from lightning_perf.measure.timing.tail import OWN_WORK

# sampler field -> summary field
_SAMPLED = {"nvml_used_mb": "nvml_peak_used_mb", "nvml_process_mb": "nvml_process_peak_mb",
            "host_rss_mb": "host_rss_peak_mb"}


def cuda_backend() -> Any:
    """The allocator module (``torch.cuda``); a function so tests can simulate a GPU's allocator."""
    import torch

    return torch.cuda


class VRAMMonitor(HookPhases, PerfCallback):
    r"""Peak memory of training and of evaluation, separately, without missing short peaks.

    On CUDA: peak allocated and reserved MB per phase from torch's allocator (this callback resets torch's global
    peak counters with ``torch.cuda.reset_peak_memory_stats`` at each phase start and keeps the lifetime peak
    itself), and device used / process MB from NVML sampled every ``nvml_interval_s`` on a background thread with
    peak-hold per phase. Without CUDA: the process's resident memory (RSS) from the same sampler. The same thread
    reads what the GPU and host are doing (``activity``): NVML utilisation, memory-controller utilisation, power, SM
    clock and temperature, and the CPU use of this process and of the machine; per phase a mean and a p5 in the
    summary, window means in the loggers, no call on the training thread. Sanity checking is not a phase.
    Evaluation that a training hook runs (``on_train_batch_end`` calling a sampling pass) is its own phase,
    ``eval_in_train_hooks``, when wrapped in ``with lightning_perf.phase("eval_in_train_hooks"):``; else it is part
    of the train peak. Also: headroom (peak as a share of device memory, a warning above ``warn_above_pct``) and a leak
    check on memory read at the end of every 16th training iteration (a CUDA allocator read costs ~20 us, a host RSS
    read 10 to 45 us, too much for every step) and of every evaluation batch; its windows and rate are in iterations.

    Args:
        nvml: sample NVML on CUDA devices.
        nvml_interval_s: sampling period of the background thread (NVML, RSS and activity), in (0.001, 60] seconds.
        activity: also sample GPU utilisation, power, clock, temperature and throttling (NVML), host CPU use and
            steal (psutil) and the training thread's wait for a CPU (the kernel's scheduler statistics); and the
            device's energy per phase from NVML (``vram.activity.energy``, docs/energy.md).
        warn_above_pct: warn once per phase when its peak passes this share of device (or host) memory.
        leak_window: iterations per averaging window of the leak check (4 consecutive rising windows flag a leak).
        leak_threshold_mb_per_100: smallest rise, in MB per 100 iterations, that counts as a leak; default 2 on CUDA
            (the allocator's count is exact) and 20 on host RSS (which drifts as the C and Python heaps settle).
        log_every_n_steps: how often the current peaks go to the loggers; default the trainer's.
        show_in_progress_bar: show the current phase peak (MB) in the progress bar as ``vram_peak_mb``.
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.

    Logged metrics (as they apply; every ``log_every_n_steps`` and at phase ends):
        ``vram/train_peak_allocated_mb``, ``vram/train_peak_reserved_mb``, ``vram/eval_peak_allocated_mb``,
        ``vram/eval_peak_reserved_mb``, ``vram/nvml_used_mb``, ``vram/host_rss_peak_mb``,
        ``vram/eval_host_rss_peak_mb``; with ``activity``, window means ``gpu/util_pct``, ``gpu/mem_util_pct``,
        ``gpu/power_w``, ``gpu/sm_clock_mhz``, ``gpu/temperature_c``, ``gpu/throttled_pct``,
        ``host/process_cpu_cores``, ``host/cpu_pct``, ``host/steal_pct``, ``host/cpu_wait_pct`` (training; ``gpu/eval_util_pct``, ... for validation, at its end); and where a training hook runs
        evaluation inside ``lightning_perf.phase("eval_in_train_hooks")``, its own peak at each exit of that phase:
        ``vram/eval_in_train_hooks_peak_allocated_mb``, ``vram/eval_in_train_hooks_peak_reserved_mb``,
        ``vram/eval_in_train_hooks_host_rss_peak_mb``; on CUDA the allocator's health: ``vram/train_alloc_retries``,
        ``vram/train_fragmentation_pct`` and at evaluation ends ``vram/eval_alloc_retries``,
        ``vram/eval_fragmentation_pct``.

    Raises:
        ValueError: for ``nvml_interval_s`` outside (0.001, 60], ``warn_above_pct`` outside (0, 100], a
            ``leak_window`` below 2 or a negative ``leak_threshold_mb_per_100``.

    Example::

        trainer = Trainer(callbacks=[VRAMMonitor(nvml_interval_s=0.02, warn_above_pct=85)])
    """

    section_name = "vram"
    _transient = ("_sampler", "_nvml_reader", "_allocator", "_activity", "_hook_trainer", "_trim_heap")

    def __init__(
        self,
        nvml: bool = True,
        nvml_interval_s: float = 0.05,
        warn_above_pct: float = 90.0,
        leak_window: int = 25,
        leak_threshold_mb_per_100: Optional[float] = None,
        log_every_n_steps: Optional[int] = None,
        show_in_progress_bar: bool = False,
        summary_path: Optional[str] = None,
        run_name: Optional[str] = None,
        run_notes: Optional[str] = None,
        activity: bool = True,
    ) -> None:
        super().__init__(summary_path=summary_path, run_name=run_name, run_notes=run_notes)
        if isinstance(nvml_interval_s, bool) or not isinstance(nvml_interval_s, (int, float)) or not (
            0.001 < nvml_interval_s <= 60
        ):
            raise bad_argument("VRAMMonitor", "nvml_interval_s", nvml_interval_s,
                               "Expected seconds in (0.001, 60]; 0.05 samples 20 times a second.")
        if isinstance(warn_above_pct, bool) or not isinstance(warn_above_pct, (int, float)) or not (
            0 < warn_above_pct <= 100
        ):
            raise bad_argument("VRAMMonitor", "warn_above_pct", warn_above_pct, "Expected a percentage in (0, 100].")
        check_positive_int("VRAMMonitor", "leak_window", leak_window, minimum=2)
        check_number("VRAMMonitor", "leak_threshold_mb_per_100", leak_threshold_mb_per_100, minimum=0,
                     allow_none=True, what="MB per 100 iterations")
        check_positive_int("VRAMMonitor", "log_every_n_steps", log_every_n_steps, allow_none=True)
        self.nvml = check_bool("VRAMMonitor", "nvml", nvml)
        check_bool("VRAMMonitor", "show_in_progress_bar", show_in_progress_bar)
        self.activity = check_bool("VRAMMonitor", "activity", activity)
        self._activity: Optional[ActivityProbe] = None
        self.nvml_interval_s = float(nvml_interval_s)
        self.warn_above_pct = float(warn_above_pct)
        self.leak_window = leak_window
        self.leak_threshold_mb_per_100 = leak_threshold_mb_per_100
        self.log_every_n_steps = log_every_n_steps
        self.show_in_progress_bar = show_in_progress_bar
        self._phases: Dict[str, Dict[str, Optional[float]]] = {}
        self._lifetime = {"peak_allocated_mb": None, "peak_reserved_mb": None}
        self._sampler: Optional[PeakSampler] = None
        self._rss: Optional[RssReader] = None
        self._nvml_reader: Optional[NvmlReader] = None
        self._hook_trainer: Optional[Any] = None
        self._reset_run()

    # -- set-up and tear-down ------------------------------------------------------------------------------------
    def _reset_run(self) -> None:
        self._phases = {}
        self._lifetime = {"peak_allocated_mb": None, "peak_reserved_mb": None}
        self._allocator: Optional[AllocatorPeaks] = None
        self._health: Optional[AllocatorHealth] = None  # retries, OOMs, fragmentation: read at windows and phase ends
        self._trim_heap: Optional[Callable[[], Any]] = None  # on host RSS: malloc_trim, at evaluation runs' ends
        self._device_label = "cpu"
        self._total_mb: Optional[float] = None
        self._unavailable: Dict[str, str] = {}
        self._phase: Optional[str] = None
        self._in_training = False
        self._make_leak_detectors(on_cuda=False)
        self._leaks: Dict[str, Dict[str, Any]] = {}
        self._ranks: Optional[Dict[str, Any]] = None
        self._steps = 0
        self._log_every = 50

    @guarded
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop_probes()
        if stage == "fit":
            self._carry_or_reset(trainer, self._reset_run)
        else:
            self._reset_run()
        # validate/test/predict peaks go to their own file beside the fit's (perf_summary_test.json, ...)
        self._start_run(trainer, stage)
        self._log_every = self.log_every_n_steps or max(1, int(getattr(trainer, "log_every_n_steps", 50) or 50))
        device = self._device(trainer)
        self._device_label = str(device)
        self._rss = RssReader()
        reads = {"host_rss_mb": self._rss}
        self._make_leak_detectors(on_cuda=device.type == "cuda")
        if device.type == "cuda":
            backend = cuda_backend()
            self._allocator = AllocatorPeaks(device, backend)
            self._health = AllocatorHealth(device, backend)
            self._total_mb = backend.get_device_properties(device).total_memory / (1024.0 * 1024.0)
            if self.nvml:
                try:
                    props = backend.get_device_properties(device)
                    bus = getattr(props, "pci_bus_id", None)
                    self._nvml_reader = NvmlReader(device.index or 0, bus if isinstance(bus, str) else None)
                except NvmlUnavailable as err:
                    self._nvml_unavailable(str(err))
            else:
                self._nvml_unavailable("switched off (`nvml=False`)", warn=False)
        else:
            self._total_mb = host_total_mb()
            self._trim_heap = heap_trimmer()
            for key in ("peak_allocated_mb", "peak_reserved_mb", "allocator"):
                self._unavailable[key] = f"no CUDA allocator on {device.type}; host RSS is measured instead"
            self._nvml_unavailable(f"NVML applies to CUDA devices, this run is on {device.type}", warn=False)
        nvml_reader = self._nvml_reader

        def read() -> Dict[str, Optional[float]]:
            values: Dict[str, Optional[float]] = {"host_rss_mb": reads["host_rss_mb"]()}
            if nvml_reader is not None:
                values.update(nvml_reader.read())
            return values

        self._sampler = PeakSampler(read, self.nvml_interval_s, on_tick=self._start_activity())
        self._sampler.start()
        self._listen_to_hook_phases(trainer)

    def _device(self, trainer: Trainer) -> Any:
        return trainer.strategy.root_device

    def _make_leak_detectors(self, on_cuda: bool) -> None:
        self._train_leak, self._eval_leak, self._leak_threshold, self._leak_stride = leak_detectors(
            on_cuda, self.leak_window, self.leak_threshold_mb_per_100)

    def _nvml_unavailable(self, reason: str, warn: bool = True) -> None:
        for key in ("nvml_peak_used_mb", "nvml_process_peak_mb"):
            self._unavailable[key] = reason
        if warn:
            self._warn_once("nvml", f"NVML figures are unavailable ({reason}); allocator figures go on.")

    def _stop_probes(self) -> None:
        self._stop_listening_to_hook_phases()
        if self._sampler is not None:
            self._sampler.stop()
            if self._sampler.error and self._nvml_reader is not None:
                self._nvml_unavailable(f"sampling stopped: {self._sampler.error}")
        if self._activity is not None:
            self._activity.note_sampler_stop(self._sampler_error())
        for probe in (self._rss, self._nvml_reader):
            if probe is not None:
                probe.close()
        self._rss = self._nvml_reader = None

    @guarded
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._stop_probes()
        self._sampler = None
        if stage != "fit":  # a validate/test/predict run's peaks reach its own summary file
            self._write_summary(trainer)
        self._flush_summary(trainer)

    # -- phases --------------------------------------------------------------------------------------------------
    def _enter(self, phase: str) -> None:
        self._phase = phase
        if self._allocator is not None:
            self._allocator.start_phase()
        if self._health is not None:
            self._health.enter(phase)
        if self._sampler is not None:
            self._sampler.set_phase(phase)

    def _exit(self, trainer: Trainer, phase: str) -> None:
        if self._phase != phase:
            return
        self._phase = None
        held = self._phases.setdefault(phase, {})
        if self._health is not None:
            self._health.exit(phase)
        if self._allocator is not None:
            _hold_max(held, self._allocator.end_phase())
            _hold_max(self._lifetime, {"peak_allocated_mb": self._allocator.lifetime_peak_allocated_mb,
                                       "peak_reserved_mb": self._allocator.lifetime_peak_reserved_mb})
        if self._sampler is not None:
            self._sampler.set_phase(None)
        _hold_max(held, self._sampled_peaks(phase))
        self._check_headroom(phase, held)
        log_scalars(trainer, self._phase_metrics(phase))

    def _peaks_so_far(self, phase: str) -> Dict[str, Optional[float]]:
        """During ``phase``: its held peaks raised by what the probes hold so far (no sync)."""
        held = dict(self._phases.get(phase, {}))
        if self._allocator is not None:
            _hold_max(held, self._allocator.current_peaks())
        _hold_max(held, self._sampled_peaks(phase))
        return held

    def _sampled_peaks(self, phase: str) -> Dict[str, Optional[float]]:
        """The sampler's peak-held values of ``phase``, under their summary names."""
        if self._sampler is None:
            return {}
        return {name: self._sampler.peak(phase, key) for key, name in _SAMPLED.items()}

    def _check_headroom(self, phase: str, held: Dict[str, Optional[float]]) -> None:
        pct = self._usage_pct(held)
        if pct is not None and pct > self.warn_above_pct:
            what = "device" if self._allocator is not None else "host"
            self._warn_once(
                f"headroom:{phase}",
                f"{phase} peak memory reached {pct:.1f}% of {what} memory (warn_above_pct={self.warn_above_pct:g});"
                " past this point allocations may fail or spill into shared memory.",
            )

    def _usage_pct(self, held: Dict[str, Optional[float]]) -> Optional[float]:
        return usage_pct(held, self._total_mb, self._allocator is not None)

    def _phase_metrics(self, phase: str, live: bool = False) -> Dict[str, Optional[float]]:
        held = self._peaks_so_far(phase) if live else dict(self._phases.get(phase, {}))
        prefix = f"vram/{_EVAL_KEY[phase]}_"
        metrics: Dict[str, Optional[float]] = {}
        if self._allocator is not None:
            metrics[prefix + "peak_allocated_mb"] = held.get("peak_allocated_mb")
            metrics[prefix + "peak_reserved_mb"] = held.get("peak_reserved_mb")
        if self._sampler is not None and self._sampler.last.get("nvml_used_mb") is not None:
            metrics["vram/nvml_used_mb"] = self._sampler.last["nvml_used_mb"]
        rss_key = "vram/host_rss_peak_mb" if phase == "train" else prefix + "host_rss_peak_mb"
        metrics[rss_key] = held.get("host_rss_peak_mb")
        if self._health is not None:
            health = self._health.window_metrics if live else self._health.phase_metrics
            metrics.update(health(prefix, phase))
        if self._activity is not None:
            metrics.update(self._activity.window_metrics(phase))
        return metrics

    # -- device activity (callbacks/vram_monitor/activity.py) ----------------------------------------------------------
    def _start_activity(self) -> Optional[Callable[[Optional[str]], None]]:
        """The activity probe of this run (after the NVML reader is made); its ``tick`` for the sampler's thread, or
        None when ``activity=False``."""
        self._activity = None
        if not self.activity:
            return None
        self._activity = ActivityProbe(self._nvml_reader, self._nvml_reason())
        return self._activity.tick

    def _nvml_reason(self) -> str:
        return self._unavailable.get("nvml_peak_used_mb", "NVML was not started")

    def _sampler_error(self) -> Optional[str]:
        return self._sampler.error if self._sampler is not None else None

    def _activity_section(self, unavailable: Dict[str, str]) -> Optional[Dict[str, Any]]:
        """``vram.activity``; null, with ``unavailable.activity``, when switched off."""
        if self._activity is None:
            unavailable["activity"] = ("switched off (`activity=False`)" if not self.activity
                                       else "not started (no setup ran)")
            return None
        return self._activity.section(self.nvml_interval_s, self._sampler_error(), self._steps, self._nvml_reason())

    def activity_verdict(self) -> str:
        """One line for the console: per phase, GPU utilisation beside the CPU use of this process and the machine."""
        if self._activity is None:
            return "VRAMMonitor activity: not measured" + (" (`activity=False`)" if not self.activity else "")
        return self._activity.verdict()

    # -- Lightning hooks -----------------------------------------------------------------------------------------
    @guarded
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._in_training = True
        self._enter("train")

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        try:
            steps = self._steps = self._steps + 1
            leak, window = steps % self._leak_stride == 0, steps % self._log_every == 0
            if leak or window:
                start = now()
                if leak:  # one reading every few iterations: O(1) cost per step
                    self._leak_sample(self._train_leak, "train")
                if window:
                    metrics = self._phase_metrics("train", live=True)
                    log_scalars(trainer, metrics)
                    if self.show_in_progress_bar:
                        peak = metrics.get("vram/train_peak_allocated_mb") or metrics.get("vram/host_rss_peak_mb")
                        if peak is not None:
                            pl_module.log("vram_peak_mb", peak, prog_bar=True, logger=False)
                OWN_WORK.add(now() - start)  # lightning_perf's own work (IterationTimer may name its iteration for it)
            if WAITING.count:
                self._drain_scalars(trainer)
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_train_batch_end", err)

    def _leak_sample(self, detector: LeakDetector, phase: str) -> None:
        if self._allocator is not None:
            mb = self._allocator.allocated_mb()
        elif self._rss is not None:
            mb = self._rss()
        else:
            return
        if detector.add(mb):
            self._warn_once(f"leak:{phase}", leak_warning(detector.rate_mb_per_100, phase))

    @guarded
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._exit(trainer, "train")
        self._in_training = False
        self._leaks["train"] = self._train_leak.result()
        gather_floats_then(trainer, [self._peak_of("train"), self._peak_of("validation")], self._set_ranks, self)

    def _set_ranks(self, rows: Rows) -> None:
        self._ranks = {
            "train_peak_mb": spread_across_ranks([r[0] for r in rows]),
            "eval_peak_mb": spread_across_ranks([r[1] for r in rows]),
        }

    def _peak_of(self, phase: str) -> Optional[float]:
        held = self._phases.get(phase, {})
        key = "peak_allocated_mb" if self._allocator is not None else "host_rss_peak_mb"
        return held.get(key)

    def _eval_start(self, trainer: Trainer, phase: str) -> None:
        if trainer.sanity_checking:
            if self._sampler is not None:
                self._sampler.set_phase(None)
            return
        if self._in_training:
            self._exit(trainer, "train")
        self._eval_leak.reset()
        self._enter(phase)

    def _eval_end(self, trainer: Trainer, phase: str) -> None:
        if trainer.sanity_checking:
            self._give_back_heap()
            return
        self._exit(trainer, phase)
        self._give_back_heap()
        previous = self._leaks.get(phase)
        if previous is None or not previous["suspected"]:  # a suspected leak stays reported
            self._leaks[phase] = self._eval_leak.result()
        if self._in_training:
            self._enter("train")

    def _give_back_heap(self) -> None:
        """On host RSS, after an evaluation run (the sanity check's too): the memory it freed is not the next
        phase's (:func:`heap_trimmer`)."""
        if self._trim_heap is not None:
            try:
                self._trim_heap()
            except Exception as err:  # noqa: BLE001 - a measurement must never stop training
                self._trim_heap = None
                self._record_failure("malloc_trim", err)

    @guarded
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start(trainer, "validation")

    @guarded
    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if not trainer.sanity_checking:
            self._leak_sample(self._eval_leak, "validation")

    @guarded
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_end(trainer, "validation")

    @guarded
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start(trainer, "test")

    @guarded
    def on_test_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self._leak_sample(self._eval_leak, "test")

    @guarded
    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_end(trainer, "test")

    @guarded
    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_start(trainer, "predict")

    @guarded
    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_end(trainer, "predict")

    @guarded
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write_summary(trainer)
        if trainer.is_global_zero:
            rank_zero_info(self.verdict())
            rank_zero_info(self.activity_verdict())

    def verdict(self) -> str:
        """One line for the console: each phase's peak (allocator on CUDA, else host RSS), its usage, and leaks."""
        return memory_verdict(self._phases, self._leaks, self._allocator is not None, self._usage_pct)

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self._phase is not None:
            self._exit(trainer, self._phase)
        self._leaks.setdefault("train", self._train_leak.result())
        self._stop_probes()  # Lightning calls no teardown hook after an exception
        self._write_summary(trainer, exception)

    # -- results -------------------------------------------------------------------------------------------------
    @property
    def peaks(self) -> Dict[str, Dict[str, Optional[float]]]:
        """Per-phase peaks measured so far (MB), e.g. ``monitor.peaks["validation"]["host_rss_peak_mb"]``."""
        return {phase: dict(values) for phase, values in self._phases.items()}

    def _summary_section(self) -> Dict[str, Any]:
        fields = ("peak_allocated_mb", "peak_reserved_mb", "nvml_peak_used_mb", "nvml_process_peak_mb",
                  "host_rss_peak_mb")
        phases = {}
        for phase in PHASES:
            if phase in self._phases:
                held = self._phases[phase]
                phases[phase] = {f: held.get(f) for f in fields}
                phases[phase]["usage_pct"] = self._usage_pct(held)
                phases[phase].update(self._health.phases.get(phase, {}) if self._health is not None else {})
        unavailable = dict(self._unavailable)
        if self._sampler is not None and self._sampler.error and self._nvml_reader is not None:
            reason = f"sampling stopped: {self._sampler.error}"
            unavailable.setdefault("nvml_peak_used_mb", reason)
            unavailable.setdefault("nvml_process_peak_mb", reason)
        if self._nvml_reader is None and "nvml_peak_used_mb" not in unavailable and self._allocator is not None:
            unavailable["nvml_peak_used_mb"] = "NVML was not started"
        if self._nvml_reader is not None and self._nvml_reader.process_reason:
            unavailable["nvml_process_peak_mb"] = self._nvml_reader.process_reason
        return {
            "device": self._device_label,
            "source": "torch allocator" + (" + NVML" if self._nvml_reader else "") + " + host RSS"
            if self._allocator is not None else "host RSS",
            "device_total_mb": self._total_mb,
            "phases": phases,
            "lifetime_peak_allocated_mb": self._lifetime["peak_allocated_mb"],
            "lifetime_peak_reserved_mb": self._lifetime["peak_reserved_mb"],
            "resets_torch_peak_stats": self._allocator is not None,
            "host_rss_method": None if self._allocator is not None else (
                "sampled RSS per phase; the heap's free pages given back to the OS (malloc_trim) at each evaluation"
                " run's end (the sanity check's too), so a later phase does not hold memory an evaluation freed" if self._trim_heap is not None
                else "sampled RSS per phase (no malloc_trim in this C library: a phase after an evaluation may still"
                     " hold memory the evaluation freed)"),
            "warn_above_pct": self.warn_above_pct,
            "leak": dict(self._leaks),
            "leak_suspected": any(v.get("suspected") for v in self._leaks.values()),
            "leak_threshold_mb_per_100_iters": self._leak_threshold,
            "nvml_interval_s": self.nvml_interval_s,
            "sampler_samples": self._sampler.samples if self._sampler is not None else None,
            "ranks": self._ranks,
            "unavailable": unavailable,
            "activity": self._activity_section(unavailable),
        }

    def state_dict(self) -> Dict[str, Any]:
        """The peaks so far, the open phase's included: a checkpoint written mid-phase (every N training steps) keeps
        the peak its phase reached before it, which a resumed run could not see again."""
        phases = self.peaks
        if self._phase is not None:
            try:
                phases[self._phase] = self._peaks_so_far(self._phase)
            except Exception as err:  # noqa: BLE001 - a checkpoint is never lost to a memory read
                self._record_failure("state_dict", err)
        return {"phases": phases, "lifetime": dict(self._lifetime)}

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        s = StateReader(state_dict)
        phases = {}
        for phase, values in s.mapping("phases").data.items():
            if phase not in PHASES:
                raise StateError(f"phases has a phase {phase!r}, expected one of {', '.join(PHASES)}")
            held = StateReader(values, f"phases.{phase}")
            phases[phase] = {key: held.number(key, None, allow_none=True) for key in held.data}
        lifetime = s.mapping("lifetime")
        peaks = {key: lifetime.number(key, None, allow_none=True) for key in self._lifetime}
        for phase, values in phases.items():  # all read: nothing is assigned from a state that fails halfway
            _hold_max(self._phases.setdefault(phase, {}), values)
        _hold_max(self._lifetime, peaks)
