import os
import threading
from types import SimpleNamespace

import pynvml
import pytest
import torch

import lightning_perf.callbacks.vram_monitor.callback as vram_module
import lightning_perf.measure.memory.readers as memory_module
from helpers import TinyModel, find_summary, fit, hold_until_sampled, read_scalars
from lightning_perf import VRAMMonitor
from lightning_perf.measure.memory.readers import MB, LeakDetector

BIG = 100_000_000  # floats: 400 MB, touched so that it is resident


class BigInValidation(TinyModel):
    """BIG floats in every validation step, held until the monitor's sampler thread has read RSS with them in it (a
    fixed 0.1 s was slept through by a thread starved on a busy machine)."""

    def validation_step(self, batch, batch_idx):
        big = torch.ones(BIG)
        assert hold_until_sampled(self.trainer), "the memory sampler thread took no reading in 10 s"
        del big
        return super().validation_step(batch, batch_idx)


class BigInTraining(TinyModel):
    """BIG floats in the 4th training step, held likewise."""

    def training_step(self, batch, batch_idx):
        if batch_idx == 3:
            big = torch.ones(BIG)
            assert hold_until_sampled(self.trainer), "the memory sampler thread took no reading in 10 s"
            del big
        return super().training_step(batch, batch_idx)


def sampler_threads():
    return [t for t in threading.enumerate() if t.name == "lightning_perf-memory-sampler"]


def test_eval_peak_above_train_peak_when_validation_allocates(tmp_path):
    fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.01)], model=BigInValidation(), max_epochs=1, limit_val_batches=2)
    v = find_summary(tmp_path)["vram"]
    train = v["phases"]["train"]["host_rss_peak_mb"]
    val = v["phases"]["validation"]["host_rss_peak_mb"]
    assert val - train > 250, (train, val)
    assert v["source"] == "host RSS" and v["phases"]["train"]["peak_allocated_mb"] is None
    assert "no CUDA allocator" in v["unavailable"]["peak_allocated_mb"]
    assert "NVML applies to CUDA" in v["unavailable"]["nvml_peak_used_mb"]
    assert 0 < v["phases"]["validation"]["usage_pct"] < 100
    scalars = read_scalars(tmp_path)
    assert "vram/host_rss_peak_mb" in scalars and "vram/eval_host_rss_peak_mb" in scalars


def test_train_peak_above_eval_peak_in_the_reverse_case(tmp_path):
    fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.01)], model=BigInTraining(), max_epochs=1, limit_val_batches=2)
    phases = find_summary(tmp_path)["vram"]["phases"]
    assert phases["train"]["host_rss_peak_mb"] - phases["validation"]["host_rss_peak_mb"] > 250


HEAP_SCRIPT = """
import ctypes, json, sys
sys.path.insert(0, {tests!r})
ctypes.CDLL(None).mallopt(-3, 64 * 2**20)  # M_MMAP_THRESHOLD: blocks under 64 MB from the heap, which keeps its pages
import torch
from helpers import TinyModel, find_summary, fit, hold_until_sampled
from lightning_perf import VRAMMonitor


class HeapSpikeInValidation(TinyModel):
    def validation_step(self, batch, batch_idx):
        if batch_idx == 0:
            spike = [torch.ones(2**19) for _ in range(150)]  # 150 x 2 MB, on the heap
            assert hold_until_sampled(self.trainer), "the memory sampler thread took no reading in 10 s"
            del spike
        return super().validation_step(batch, batch_idx)


fit({root!r}, [VRAMMonitor(nvml_interval_s=0.01)], model=HeapSpikeInValidation(), max_epochs=3, limit_val_batches=2)
print(json.dumps(find_summary({root!r})["vram"]))
"""


def test_training_after_a_validation_does_not_hold_the_memory_the_validation_freed(tmp_path):
    """A validation that frees 300 MB of heap blocks (under malloc's mmap threshold, where the heap keeps the pages:
    set in a process of its own): the epochs of training after it keep their own peak, about 300 MB below the
    validation's, because the monitor gives the heap's free pages back at each evaluation run's end."""
    import json
    import subprocess
    import sys

    script = HEAP_SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)), root=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    vram = json.loads(proc.stdout.strip().splitlines()[-1])
    train = vram["phases"]["train"]["host_rss_peak_mb"]
    validation = vram["phases"]["validation"]["host_rss_peak_mb"]
    assert validation - train > 200, (train, validation)  # the spike: 300 MB
    assert "malloc_trim" in vram["host_rss_method"]


class Hoarder(TinyModel):
    """Keeps 1 MB per step alive: the classic list of tensors that grows until memory runs out."""

    def __init__(self):
        super().__init__()
        self.kept = []

    def training_step(self, batch, batch_idx):
        self.kept.append(torch.ones(int(MB) // 4))
        return super().training_step(batch, batch_idx)


def test_a_growing_list_is_flagged_as_a_leak_and_a_clean_loop_is_not(tmp_path):
    with pytest.warns(UserWarning, match="a leak is\\s+suspected"):
        fit(tmp_path / "leaky", [VRAMMonitor(leak_window=10)], model=Hoarder(), max_epochs=None, max_steps=200,
            limit_val_batches=0)
    leak = find_summary(tmp_path / "leaky")["vram"]
    assert leak["leak_suspected"] is True
    assert leak["leak"]["train"]["suspected"] is True
    assert 50 < leak["leak"]["train"]["rate_mb_per_100_iters"] < 200  # 1 MB per iteration
    fit(tmp_path / "clean", [VRAMMonitor(leak_window=10)], max_epochs=None, max_steps=120, limit_val_batches=0)
    clean = find_summary(tmp_path / "clean")["vram"]
    assert clean["leak_suspected"] is False and clean["leak"]["train"]["suspected"] is False


def test_leak_detector_ignores_a_step_up_then_flat():
    det = LeakDetector(window=5, windows=4, threshold_mb_per_100=1.0, warmup=0)
    values = [100.0] * 10 + [300.0] * 60  # a cache that fills once
    assert not any(det.add(v) for v in values)
    det = LeakDetector(window=5, windows=4, threshold_mb_per_100=1.0, warmup=0)
    assert any(det.add(100.0 + 0.5 * i) for i in range(60))  # 50 MB per 100 iterations


def _fed(values, **kwargs):
    """A detector given ``values`` one a reading: (whether it warned, its verdict)."""
    det = LeakDetector(**kwargs)
    warned = any([det.add(v) for v in values])
    return warned, det.result()


@pytest.mark.parametrize("iterations", [1_000, 100_000])
def test_the_leak_verdict_is_growth_that_continues_on_closed_form_allocations(iterations):
    """0.5 MB a reading is 50 MB per 100 iterations. Steady growth is a leak at exactly that rate; the same growth
    for the first 300 readings, then flat, and a sawtooth of the same slope cleared every 100 readings warn while they
    rise but are no leak; the detector keeps at most HISTORY window means whatever the length."""
    settings = dict(window=10, windows=4, threshold_mb_per_100=1.0, warmup=0)
    warned, steady = _fed([100.0 + 0.5 * i for i in range(iterations)], **settings)
    assert warned and steady["suspected"] is True and steady["growth_stopped"] is False
    assert steady["rate_mb_per_100_iters"] == pytest.approx(50.0)
    warned, plateau = _fed([100.0 + 0.5 * min(i, 300) for i in range(iterations)], **settings)
    assert warned and plateau["suspected"] is False and plateau["growth_stopped"] is True
    assert plateau["rate_mb_per_100_iters"] == pytest.approx(0.0, abs=1e-6)
    warned, saw = _fed([100.0 + 0.5 * (i % 100) for i in range(iterations)], **settings)
    assert warned and saw["suspected"] is False and saw["growth_stopped"] is True
    det = LeakDetector(**settings)
    for i in range(iterations):
        det.add(float(i))
    assert len(det._history) < LeakDetector.HISTORY


def test_a_leak_that_stops_rising_is_no_leak_and_a_short_steady_one_still_is():
    """Growth up to the last quarter of the phase, then flat for it: not a leak (it stopped); 6 windows of steady
    growth (the fewest the verdict reads, a short evaluation): a leak."""
    settings = dict(window=10, windows=4, threshold_mb_per_100=1.0, warmup=0)
    assert _fed([100.0 + 0.5 * min(i, 750) for i in range(1000)], **settings)[1]["suspected"] is False
    assert _fed([100.0 + 0.5 * i for i in range(60)], **settings)[1]["suspected"] is True
    assert _fed([100.0 + 0.5 * i for i in range(30)], **settings)[1]["suspected"] is False  # 3 windows: too few


def test_leak_detector_read_every_4th_iteration_keeps_its_windows_and_rate_in_iterations():
    """A reading every 4th iteration of memory growing 8 MB per iteration: the rate is 800 MB per 100 iterations
    (not per 100 readings), found after the same number of iterations as reading every iteration."""
    every = LeakDetector(window=25, windows=4, threshold_mb_per_100=2.0, warmup=50)
    found_every = next(i for i in range(1, 400) if every.add(8.0 * i))
    fourth = LeakDetector(window=25, windows=4, threshold_mb_per_100=2.0, warmup=50, stride=4)
    found_fourth = next(i for i in range(4, 400, 4) if fourth.add(8.0 * i))
    assert fourth.result()["rate_mb_per_100_iters"] == pytest.approx(800.0)
    assert every.result()["rate_mb_per_100_iters"] == pytest.approx(800.0)
    assert fourth.result()["iterations_per_sample"] == 4 and fourth.result()["samples"] == found_fourth // 4
    assert abs(found_fourth - found_every) <= 2 * 4 * 4  # within one reading per window of each other


def test_sampler_threads_stop_after_fits_and_after_a_crash(tmp_path):
    cb = VRAMMonitor(nvml_interval_s=0.01)
    fit(tmp_path / "a", [cb], max_epochs=1)
    fit(tmp_path / "b", [cb], max_epochs=1)
    assert sampler_threads() == []

    class Crash(TinyModel):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("crash")

    with pytest.raises(RuntimeError):
        fit(tmp_path / "c", [VRAMMonitor(nvml_interval_s=0.01)], model=Crash(), max_epochs=1)
    assert sampler_threads() == []


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"nvml_interval_s": 0}, r"VRAMMonitor\(nvml_interval_s=0\)"),
        ({"nvml_interval_s": 1e-5}, r"VRAMMonitor\(nvml_interval_s=1e-05\)"),
        ({"warn_above_pct": 0}, r"VRAMMonitor\(warn_above_pct=0\)"),
        ({"warn_above_pct": 120}, r"VRAMMonitor\(warn_above_pct=120\)"),
        ({"leak_window": 1}, r"VRAMMonitor\(leak_window=1\)"),
        ({"leak_threshold_mb_per_100": -1}, r"VRAMMonitor\(leak_threshold_mb_per_100=-1\)"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VRAMMonitor(**kwargs)


# -- the CUDA path, with only the hardware simulated ----------------------------------------------------------------
class FakeCuda:
    """torch.cuda's allocator counters for one device, driven by the test's model."""

    def __init__(self, total_mb=16 * 1024):
        self.allocated = 0.0
        self.peak = 0.0
        self.resets = 0
        self.total = total_mb * MB

    def alloc(self, mb):
        self.allocated += mb * MB
        self.peak = max(self.peak, self.allocated)

    def free(self, mb):
        self.allocated -= mb * MB

    def max_memory_allocated(self, device):
        self.flat_reads = getattr(self, "flat_reads", 0) + 1
        return self.peak

    def max_memory_reserved(self, device):
        self.flat_reads = getattr(self, "flat_reads", 0) + 1
        return self.peak * 1.25

    def memory_allocated(self, device):
        self.flat_reads = getattr(self, "flat_reads", 0) + 1  # torch flattens its whole stats dict here: slow
        return self.allocated

    def memory_stats_as_nested_dict(self, device):
        # the shape of torch.cuda.memory_stats_as_nested_dict: stat -> pool ("all", "large_pool", ...) -> figure
        return {"allocated_bytes": {"all": {"current": self.allocated, "peak": self.peak}},
                "reserved_bytes": {"all": {"current": self.allocated * 1.25, "peak": self.peak * 1.25}},
                "num_alloc_retries": 0}

    def reset_peak_memory_stats(self, device):
        self.resets += 1
        self.peak = self.allocated

    def get_device_properties(self, device):
        return SimpleNamespace(total_memory=self.total, pci_bus_id="00000000:01:00.0")


class FakeNvml:
    """pynvml's calls as a working driver answers them, with optional failures of the real NVMLError types."""

    def __init__(self, used_mb=2048, process_error=None, memory_error_after=None):
        self.used = used_mb * MB
        self.process_error = process_error
        self.memory_error_after = memory_error_after
        self.calls = 0
        self.shutdowns = 0

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        return "handle"

    def nvmlDeviceGetHandleByIndex(self, index):
        return "handle"

    def nvmlDeviceGetMemoryInfo(self, handle):
        self.calls += 1
        if self.memory_error_after is not None and self.calls > self.memory_error_after:
            raise pynvml.NVMLError_Unknown()
        return SimpleNamespace(used=self.used, total=16 * 1024 * MB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        if self.process_error is not None:
            raise self.process_error
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=1500 * MB)]


class SimulatedGpuModel(TinyModel):
    """Drives the fake allocator: 100 MB held in training steps, a 3 GB spike in validation."""

    cuda: FakeCuda  # set by the fixture; not an init argument, so checkpoints stay plain

    def training_step(self, batch, batch_idx):
        self.cuda.alloc(100)
        self.cuda.free(100)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.cuda.alloc(3000)
        self.cuda.free(3000)
        return super().validation_step(batch, batch_idx)


@pytest.fixture
def simulated_gpu(monkeypatch):
    cuda = FakeCuda()
    cuda.alloc(500)  # weights already on the device
    cuda.alloc(7000)
    cuda.free(7000)  # a lifetime peak from before the fit
    monkeypatch.setattr(vram_module, "cuda_backend", lambda: cuda)
    monkeypatch.setattr(VRAMMonitor, "_device", lambda self, trainer: torch.device("cuda", 0))
    monkeypatch.setattr(SimulatedGpuModel, "cuda", cuda, raising=False)
    return cuda


class SimulatedLeak(SimulatedGpuModel):
    def training_step(self, batch, batch_idx):
        self.cuda.alloc(8)  # 8 MB kept every iteration
        return super().training_step(batch, batch_idx)


def test_simulated_allocator_leak_is_read_from_the_nested_stats_every_16th_iteration(tmp_path, simulated_gpu):
    fit(tmp_path, [VRAMMonitor(nvml=False)], model=SimulatedLeak(), max_epochs=None, max_steps=200,
        limit_val_batches=0)
    leak = find_summary(tmp_path)["vram"]["leak"]["train"]
    assert leak["suspected"] is True and leak["rate_mb_per_100_iters"] == pytest.approx(800.0)
    assert leak["iterations_per_sample"] == 16 and leak["samples"] == 200 // 16
    assert getattr(simulated_gpu, "flat_reads", 0) == 0  # never the slow torch.cuda.memory_allocated


class LeakThenStop(SimulatedGpuModel):
    def training_step(self, batch, batch_idx):
        if self.global_step < 150:
            self.cuda.alloc(8)  # 8 MB kept in each of the first 150 iterations (a cache filling), then nothing
        return super().training_step(batch, batch_idx)


class Sawtooth(SimulatedGpuModel):
    def training_step(self, batch, batch_idx):
        self.cuda.alloc(8)
        if self.global_step % 20 == 19:
            self.cuda.free(8 * 20)  # 8 MB kept an iteration, all let go every 20
        return super().training_step(batch, batch_idx)


def test_allocations_that_rise_then_stop_or_rise_and_fall_are_no_leak(tmp_path, simulated_gpu, caplog):
    """The allocator's exact count: 8 MB an iteration for 150 of 800 iterations warns while it rises (800 MB per
    100), then is flat: no leak, its growth stopped, a floor slope of 0; a sawtooth of 20 iterations: no leak."""
    with caplog.at_level("INFO"), pytest.warns(UserWarning, match="a leak is suspected if it goes on"):
        fit(tmp_path / "stop", [VRAMMonitor(nvml=False)], model=LeakThenStop(), max_epochs=None, max_steps=800,
            limit_val_batches=0)
    v = find_summary(tmp_path / "stop")["vram"]
    assert v["leak_suspected"] is False and v["leak"]["train"]["suspected"] is False
    assert v["leak"]["train"]["growth_stopped"] is True and v["leak"]["train"]["rate_mb_per_100_iters"] == 0.0
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("VRAMMonitor ("))
    assert line.endswith("; no leak (memory rose in train, then stopped)"), line
    fit(tmp_path / "saw", [VRAMMonitor(nvml=False)], model=Sawtooth(), max_epochs=None, max_steps=800,
        limit_val_batches=0)
    leak = find_summary(tmp_path / "saw")["vram"]["leak"]["train"]
    assert leak["suspected"] is False, leak


def test_simulated_allocator_gives_phase_peaks_and_keeps_the_lifetime_peak(tmp_path, simulated_gpu, monkeypatch):
    nvml = FakeNvml()
    monkeypatch.setattr(memory_module, "load_pynvml", lambda: nvml)
    fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.01)], model=SimulatedGpuModel(), max_epochs=2,
        limit_val_batches=2)
    v = find_summary(tmp_path)["vram"]
    assert v["phases"]["train"]["peak_allocated_mb"] == pytest.approx(600)
    assert v["phases"]["train"]["peak_reserved_mb"] == pytest.approx(750)
    assert v["phases"]["validation"]["peak_allocated_mb"] == pytest.approx(3500)
    assert v["lifetime_peak_allocated_mb"] == pytest.approx(7500)  # not lost to the resets
    assert v["resets_torch_peak_stats"] is True and simulated_gpu.resets >= 4
    assert v["phases"]["train"]["nvml_peak_used_mb"] == pytest.approx(2048)
    assert v["phases"]["train"]["nvml_process_peak_mb"] == pytest.approx(1500)
    assert v["device_total_mb"] == pytest.approx(16 * 1024)
    assert v["phases"]["validation"]["usage_pct"] == pytest.approx(100 * 3500 * 1.25 / (16 * 1024))
    assert v["source"] == "torch allocator + NVML + host RSS"
    assert nvml.shutdowns == 1
    scalars = read_scalars(tmp_path)
    for key in ("vram/train_peak_allocated_mb", "vram/train_peak_reserved_mb", "vram/eval_peak_allocated_mb",
                "vram/eval_peak_reserved_mb", "vram/nvml_used_mb"):
        assert key in scalars, key
    assert max(v for _, v in scalars["vram/eval_peak_allocated_mb"]) == pytest.approx(3500)


def test_real_nvml_missing_gives_null_fields_a_reason_and_one_warning(tmp_path, simulated_gpu, recwarn):
    # This machine has the pynvml package but no NVML library: the real LibraryNotFound path.
    fit(tmp_path, [VRAMMonitor()], model=SimulatedGpuModel(), max_epochs=1)
    v = find_summary(tmp_path)["vram"]
    assert v["phases"]["train"]["nvml_peak_used_mb"] is None
    assert "NVML" in v["unavailable"]["nvml_peak_used_mb"]
    assert v["phases"]["train"]["peak_allocated_mb"] == pytest.approx(600)  # the allocator goes on
    assert len([w for w in recwarn if "NVML figures are unavailable" in str(w.message)]) == 1


@pytest.mark.parametrize("error", [pynvml.NVMLError_NotSupported(), pynvml.NVMLError_Unknown()])
def test_process_query_not_supported_as_in_wsl_and_containers(tmp_path, simulated_gpu, monkeypatch, error):
    monkeypatch.setattr(memory_module, "load_pynvml", lambda: FakeNvml(process_error=error))
    fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.01)], model=SimulatedGpuModel(), max_epochs=1)
    v = find_summary(tmp_path)["vram"]
    assert v["phases"]["train"]["nvml_process_peak_mb"] is None
    assert type(error).__name__ in v["unavailable"]["nvml_process_peak_mb"]
    assert v["phases"]["train"]["nvml_peak_used_mb"] == pytest.approx(2048)


def test_nvml_failing_midway_stops_sampling_with_a_reason(tmp_path, simulated_gpu, monkeypatch):
    monkeypatch.setattr(memory_module, "load_pynvml", lambda: FakeNvml(memory_error_after=3))
    with pytest.warns(UserWarning, match="NVML figures are unavailable"):
        fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.01)], model=SimulatedGpuModel(), max_epochs=1)
    v = find_summary(tmp_path)["vram"]
    assert "NVMLError_Unknown" in v["unavailable"]["nvml_peak_used_mb"]
    assert v["phases"]["train"]["peak_allocated_mb"] == pytest.approx(600)
    assert sampler_threads() == []


def test_headroom_warning_above_threshold(tmp_path, simulated_gpu, monkeypatch):
    monkeypatch.setattr(memory_module, "load_pynvml", lambda: FakeNvml())
    with pytest.warns(UserWarning, match=r"validation peak memory reached .*% of device memory"):
        fit(tmp_path, [VRAMMonitor(warn_above_pct=20)], model=SimulatedGpuModel(), max_epochs=1)


def test_resume_keeps_earlier_peaks(tmp_path, simulated_gpu, monkeypatch):
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from helpers import trainer_kwargs

    monkeypatch.setattr(memory_module, "load_pynvml", lambda: FakeNvml())
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit(tmp_path / "a", [VRAMMonitor(), ckpt], model=SimulatedGpuModel(), max_epochs=1)

    class QuietValidation(SimulatedGpuModel):
        def validation_step(self, batch, batch_idx):
            return TinyModel.validation_step(self, batch, batch_idx)

    trainer = Trainer(callbacks=[VRAMMonitor()], **trainer_kwargs(tmp_path / "b", max_epochs=2))
    trainer.fit(QuietValidation(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    v = find_summary(tmp_path / "b")["vram"]
    assert v["phases"]["validation"]["peak_allocated_mb"] == pytest.approx(3500)  # from before the resume


class TrainSpike(SimulatedGpuModel):
    """A 1098 MB spike in the 3rd training step (seed 001's worry: a peak a resumed run would not see again)."""

    def training_step(self, batch, batch_idx):
        if self.global_step == 2:
            self.cuda.alloc(1098)
            self.cuda.free(1098)
        return super().training_step(batch, batch_idx)


def test_a_checkpoint_written_mid_phase_keeps_the_open_phases_peak_for_the_resumed_run(tmp_path, simulated_gpu):
    """The uninterrupted run's train peak (weights 500 + the spike 1098 MB, the allocator's exact count) equals the
    peak of a run stopped after a checkpoint written at step 5 inside training and resumed without the spike."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from helpers import trainer_kwargs

    fit(tmp_path / "whole", [VRAMMonitor(nvml=False)], model=TrainSpike(), max_epochs=None, max_steps=8,
        limit_val_batches=0)
    whole = find_summary(tmp_path / "whole")["vram"]["phases"]["train"]["peak_allocated_mb"]
    assert whole == pytest.approx(500 + 1098)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=5, save_top_k=-1)
    fit(tmp_path / "first", [VRAMMonitor(nvml=False), ckpt], model=TrainSpike(), max_epochs=None, max_steps=5,
        limit_val_batches=0)
    (path,) = (tmp_path / "ckpt").glob("*step=5*.ckpt")
    assert torch.load(path, weights_only=False)["callbacks"]  # the monitor's state is in it
    trainer = Trainer(callbacks=[VRAMMonitor(nvml=False)],
                      **trainer_kwargs(tmp_path / "resumed", max_epochs=None, max_steps=8, limit_val_batches=0))
    trainer.fit(SimulatedGpuModel(), ckpt_path=str(path))
    resumed = find_summary(tmp_path / "resumed")["vram"]["phases"]["train"]["peak_allocated_mb"]
    assert resumed == pytest.approx(whole)


@pytest.mark.gpu
def test_real_gpu_eval_spike_is_seen(tmp_path):
    class GpuBigVal(TinyModel):
        def validation_step(self, batch, batch_idx):
            big = torch.ones(BIG, device=self.device)
            del big
            return super().validation_step(batch, batch_idx)

    fit(tmp_path, [VRAMMonitor()], model=GpuBigVal(), accelerator="gpu", max_epochs=1, limit_val_batches=2)
    v = find_summary(tmp_path)["vram"]
    phases = v["phases"]
    assert phases["validation"]["peak_allocated_mb"] - phases["train"]["peak_allocated_mb"] > 350
    assert v["device_total_mb"] > 0 and v["lifetime_peak_allocated_mb"] >= phases["validation"]["peak_allocated_mb"]
    if "nvml_peak_used_mb" not in v["unavailable"]:
        assert phases["validation"]["nvml_peak_used_mb"] > 0


def test_fit_end_prints_peaks_and_the_leak_verdict(tmp_path, caplog):
    from helpers import TinyModel, find_summary, fit
    from lightning_perf import VRAMMonitor

    with caplog.at_level("INFO"):
        fit(tmp_path, [VRAMMonitor(nvml_interval_s=0.01)], model=TinyModel(), max_epochs=1)
    v = find_summary(tmp_path)["vram"]
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("VRAMMonitor"))
    train = v["phases"]["train"]
    assert f"train peak {train['host_rss_peak_mb']:.0f} MiB ({train['usage_pct']:.0f}% used)" in line, line
    assert line.endswith("; no leak") and v["leak_suspected"] is False


# -- allocator health: retries, OOMs, fragmentation, the largest free block (the allocator simulated) -----------------
class PressuredCuda(FakeCuda):
    """An allocator that retries every 4th training step, with 1 GB reserved beyond what is allocated and a 600 MB
    free block in its cache; counts the snapshot walks (phase ends only, never per step)."""

    def __init__(self):
        super().__init__()
        self.retries, self.snapshots = 3, 0  # 3 retries from before the fit: not this run's

    def memory_stats_as_nested_dict(self, device):
        stats = super().memory_stats_as_nested_dict(device)
        stats["reserved_bytes"]["all"]["current"] = self.allocated + 1024 * MB
        stats["num_alloc_retries"], stats["num_ooms"] = self.retries, 1
        return stats

    def memory_snapshot(self):
        self.snapshots += 1
        return [{"device": 0, "blocks": [{"size": 600 * MB, "state": "inactive"},
                                         {"size": 2000 * MB, "state": "active_allocated"}]},
                {"device": 1, "blocks": [{"size": 5000 * MB, "state": "inactive"}]}]  # another device's


class RetriesEvery4th(SimulatedGpuModel):
    def training_step(self, batch, batch_idx):
        if (self.trainer.global_step + 1) % 4 == 0:
            self.cuda.retries += 1
        return super().training_step(batch, batch_idx)


def test_allocator_retries_fragmentation_and_the_largest_free_block_per_phase(tmp_path, monkeypatch):
    cuda = PressuredCuda()
    cuda.alloc(500)
    monkeypatch.setattr(vram_module, "cuda_backend", lambda: cuda)
    monkeypatch.setattr(VRAMMonitor, "_device", lambda self, trainer: torch.device("cuda", 0))
    monkeypatch.setattr(SimulatedGpuModel, "cuda", cuda, raising=False)
    fit(tmp_path, [VRAMMonitor(nvml=False, activity=False)], model=RetriesEvery4th(), max_epochs=2)  # 16 steps
    summary = find_summary(tmp_path)
    train, validation = summary["vram"]["phases"]["train"], summary["vram"]["phases"]["validation"]
    assert train["alloc_retries"] == 16 // 4 and validation["alloc_retries"] == 0  # the 3 before the fit are not
    assert train["ooms"] == 0
    assert train["fragmentation_mb"] == pytest.approx(1024.0) and validation["largest_free_block_mb"] == 600.0
    reserved_mb = cuda.allocated / MB + 1024
    assert train["fragmentation_pct"] == pytest.approx(100.0 * 1024 / reserved_mb)
    # walked at phase ends only: train left at each of the 2 validations and at its end, validation left twice
    assert cuda.snapshots == 5
    logged = read_scalars(tmp_path)
    assert max(v for _, v in logged["vram/train_alloc_retries"]) == 4
    assert "allocator under pressure: 4 retries in training" in summary["diagnosis"]["evidence"][0]
