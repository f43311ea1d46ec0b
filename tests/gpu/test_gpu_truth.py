"""Every CUDA figure of the suite against an independent measure of the same thing, on a real GPU (issue 12).

Each test records (ours, independent, bound) for the table of docs/gpu.md. Skipped without CUDA.
"""

import os
import subprocess
import sys
import time

import pytest
import torch
from lightning.pytorch import Callback, LightningModule
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from helpers import find_summary, fit
from lightning_perf import EvalNoGradGuard, IterationTimer, SectionProfiler, VRAMMonitor, profile_section

pytestmark = pytest.mark.gpu
MB = 1024.0 * 1024.0


class Same(Dataset):
    """One ready batch, ``n`` times (``batch_size=None``): no collation, no per-batch host work. On the device, the host
    queues the steps ahead of it as in well-fed GPU training; on the host, each step's only work is its copy."""

    def __init__(self, batch, n):
        self.batch, self.n = batch, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.batch


class MatmulModel(LightningModule):
    """A GPU-bound step: `reps` large matmuls forward and back, no host sync (unless `item_every_step`).

    With `resident=True` the batches already live on the device (no host-to-device copy, which from pageable memory
    makes the host wait every step): the host queues kernels ahead of the device, as in well-fed GPU training."""

    def __init__(self, n=4096, reps=6, item_every_step=False, resident=False, batches=210):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n) / n**0.5)
        self.n, self.reps, self.item_every_step = n, reps, item_every_step
        self.resident, self.batches = resident, batches

    def training_step(self, batch, batch_idx):
        (x,) = batch
        y = x
        for _ in range(self.reps):
            y = torch.tanh(y @ self.w)
        loss = y.float().pow(2).mean()
        if self.item_every_step:
            loss.item()  # the host waits for the device every step
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        # ready batches of (1024, n) (batch_size=None: no collation on the host), copied each step like data
        data = torch.randn(self.batches, 1024, self.n, device="cuda" if self.resident else "cpu")
        return DataLoader(TensorDataset(data), batch_size=None)


class HostLead(Callback):
    """How far the host runs ahead: at each batch start, the steps queued on the device that it has not finished
    (one event per step, queried without waiting)."""

    def __init__(self):
        self.events, self.max_lead = [], 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.events = [e for e in self.events if not e.query()]
        self.max_lead = max(self.max_lead, len(self.events))
        event = torch.cuda.Event()
        event.record()
        self.events.append(event)


def gpu_fit(tmp_path, callbacks, model, **kwargs):
    kwargs.setdefault("accelerator", "gpu")
    kwargs.setdefault("limit_val_batches", 0)
    kwargs.setdefault("num_sanity_val_steps", 0)
    kwargs.setdefault("max_epochs", 1)
    return fit(tmp_path, callbacks, model=model, **kwargs)


class SyncCounter(Callback):
    """Counts torch.cuda.synchronize calls made between the first training batch start and the last batch end."""

    def __init__(self):
        self.calls, self.in_steps, self._real = 0, 0, torch.cuda.synchronize
        self._stepping = False

    def setup(self, trainer, pl_module, stage):
        def counting(*args, **kwargs):
            self.calls += 1
            self.in_steps += self._stepping
            return self._real(*args, **kwargs)

        torch.cuda.synchronize = counting

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._stepping = True

    def on_train_end(self, trainer, pl_module):
        self._stepping = False

    def teardown(self, trainer, pl_module, stage):
        torch.cuda.synchronize = self._real


@pytest.mark.parametrize("loop", ["host ahead", "copy per step", ".item() per step"])
def test_host_round_trip_and_cuda_event_time_agree_with_no_sync_in_the_step_path(tmp_path, record, loop):
    counter, lead = SyncCounter(), HostLead()
    model = MatmulModel(item_every_step=loop == ".item() per step", resident=loop != "copy per step", batches=240)
    gpu_fit(tmp_path, [IterationTimer(warmup_steps=40), counter, lead], model)
    t = find_summary(tmp_path)["iteration_timer"]
    host, device = t["ms_per_iter"]["mean"], t["device_ms_per_iter"]["mean"]
    record(f"IterationTimer mean ms/iter, host vs CUDA events ({loop}; host up to {lead.max_lead} steps ahead)",
           host, device, "ms", "within 5%")
    if loop == "host ahead":
        assert lead.max_lead >= 2, "the host never ran ahead of the device: this loop does not test that case"
    assert t["measured_iterations"] >= 195
    assert host == pytest.approx(device, rel=0.05)
    assert counter.in_steps == 0, "the suite synchronized the device inside the step path"
    assert t["device_events_dropped"] == 0


class EvalSpikeModel(LightningModule):
    """Seed 001 on a GPU: validation with grad on keeps every batch's graph alive, so eval peaks above training."""

    def __init__(self, keep_graphs=True):
        super().__init__()
        self.net = nn.Sequential(*[nn.Sequential(nn.Linear(2048, 2048), nn.ReLU()) for _ in range(4)])
        self.keep_graphs, self.kept = keep_graphs, []

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        (x,) = batch
        with torch.enable_grad():
            out = self.net(x)
        if self.keep_graphs:
            self.kept.append(out)  # graphs and activations stay on the device
        return out.mean()

    def on_validation_epoch_end(self):
        self.kept.clear()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(64 * 16, 2048)), batch_size=64)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(1024 * 8, 2048)), batch_size=1024)


class PeakProbe(Callback):
    """The allocator's own peak, read at every batch end of each phase: an independent record of the phase peak."""

    def __init__(self):
        self.peaks = {"train": 0.0, "validation": 0.0}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.peaks["train"] = max(self.peaks["train"], torch.cuda.max_memory_allocated() / MB)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.peaks["validation"] = max(self.peaks["validation"], torch.cuda.max_memory_allocated() / MB)


def test_eval_spike_peaks_match_the_allocator_and_nvml_covers_reserved(tmp_path, record):
    left = torch.cuda.memory_allocated() / MB  # after clean_device: what earlier fits hold for good
    assert left < 64, f"{left:.0f} MB of CUDA tensors outlived the earlier tests' fits and a garbage collection"
    probe = PeakProbe()
    gpu_fit(tmp_path, [VRAMMonitor(), probe], EvalSpikeModel(), limit_val_batches=8, inference_mode=False)
    v = find_summary(tmp_path)["vram"]
    train, val = v["phases"]["train"], v["phases"]["validation"]
    for phase, reported in (("train", train), ("validation", val)):
        record(f"VRAMMonitor {phase} peak allocated", reported["peak_allocated_mb"], probe.peaks[phase], "MB",
               "within 1 MB")
        assert reported["peak_allocated_mb"] == pytest.approx(probe.peaks[phase], abs=1.0)
    assert val["peak_allocated_mb"] > train["peak_allocated_mb"] + 200  # the spike of seed 001
    assert "nvml_process_peak_mb" not in v["unavailable"], v["unavailable"]
    record("VRAMMonitor NVML process peak vs allocator reserved peak (validation)", val["nvml_process_peak_mb"],
           val["peak_reserved_mb"], "MB", "NVML >= reserved")
    assert val["nvml_process_peak_mb"] >= val["peak_reserved_mb"]


class LeakyModel(EvalSpikeModel):
    def __init__(self, leak):
        super().__init__(keep_graphs=False)
        self.leak, self.hoard = leak, []

    def training_step(self, batch, batch_idx):
        if self.leak:
            self.hoard.append(torch.empty(8 * 1024 * 1024, dtype=torch.uint8, device=self.device))  # 8 MB a step
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(64 * 160, 2048)), batch_size=64)


@pytest.mark.parametrize("leak", [True, False])
def test_leak_check_flags_8_mb_per_step_and_not_a_clean_loop(tmp_path, record, leak):
    gpu_fit(tmp_path, [VRAMMonitor()], LeakyModel(leak))
    v = find_summary(tmp_path)["vram"]
    rate = v["leak"]["train"]["rate_mb_per_100_iters"]
    record(f"VRAMMonitor leak rate ({'8 MB/step list' if leak else 'clean loop'})", rate, 800.0 if leak else 0.0,
           "MB/100 it", "flagged only when leaking")
    assert v["leak_suspected"] is leak
    if leak:
        assert rate == pytest.approx(800.0, rel=0.1)


class ConvModel(LightningModule):
    def __init__(self, channels_last):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 3, 3, padding=1))
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
        self.channels_last = channels_last

    def training_step(self, batch, batch_idx):
        (x,) = batch
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return (self.net(x) - x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(32 * 16, 3, 128, 128)), batch_size=32)


@pytest.mark.parametrize("precision, channels_last", [("bf16-mixed", False), ("32-true", True)])
def test_bf16_and_channels_last_runs_are_measured(tmp_path, precision, channels_last):
    gpu_fit(tmp_path, [IterationTimer(warmup_steps=2), SectionProfiler(warmup_steps=2, print_reports=False),
                       VRAMMonitor()], ConvModel(channels_last), precision=precision)
    s = find_summary(tmp_path)
    assert s["status"] == "completed" and s["run"]["precision"] == precision
    assert s["iteration_timer"]["device_ms_per_iter"]["mean"] > 0
    assert s["vram"]["phases"]["train"]["peak_allocated_mb"] > 0
    assert s["section_profiler"]["sections"]["forward"]["device_mean_ms"] > 0


def test_section_device_times_add_up_to_the_iteration_device_time(tmp_path, record):
    profiler = SectionProfiler(warmup_steps=10, print_reports=False)
    gpu_fit(tmp_path, [IterationTimer(warmup_steps=10), profiler], MatmulModel())
    s = find_summary(tmp_path)
    sections = s["section_profiler"]["sections"]
    total = sum(r["device_mean_ms"] or 0.0 for r in sections.values() if r["kind"] == "auto")
    device = s["iteration_timer"]["device_ms_per_iter"]["mean"]
    record("SectionProfiler sum of section device time vs iteration device time", total, device, "ms", "within 10%")
    assert total == pytest.approx(device, rel=0.10)
    # the same iterations timed on the device (the first 32 counted, then one in 32): 32 + 6 of 200 counted
    timed = sum(1 for f in range(1, 211) if f > 10 and (f - 11 < 32 or (f - 11) % 32 == 0))
    assert s["iteration_timer"]["device_timed_iterations"] == timed == 38
    assert profiler._ledger.sections["forward"].device.count == timed


class KernelSection(MatmulModel):
    def training_step(self, batch, batch_idx):
        (x,) = batch
        x = torch.tanh(x @ self.w)  # queued first: the section's start event waits behind it, so the section's
        with profile_section("matmul"):  # device time is the kernel's, not the idle gap before its launch
            y = x @ self.w
        return torch.tanh(y).float().pow(2).mean()


def test_a_user_section_around_a_kernel_reports_its_device_time(tmp_path, record):
    model = KernelSection()
    gpu_fit(tmp_path, [SectionProfiler(warmup_steps=5, print_reports=False)], model)
    reported = find_summary(tmp_path)["section_profiler"]["sections"]["matmul"]["device_mean_ms"]
    # the same kernel timed on its own, synchronized around 50 runs
    x = torch.randn(1024, model.n, device="cuda")
    w = model.w.detach().cuda()
    for _ in range(5):
        x @ w
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(50):
        x @ w
    torch.cuda.synchronize()
    alone = 1000.0 * (time.perf_counter() - start) / 50
    record("profile_section device time of one matmul vs the same matmul timed alone", reported, alone, "ms",
           "within 10%")
    assert reported == pytest.approx(alone, rel=0.10)


class EvalWithGradCallback(Callback):
    """Seed 001's bug from a callback: an eval-mode forward with grad on; allocated-memory growth measured around it
    while its output (and so its graph) is alive. The graph also holds the input, allocated before: added back."""

    def __init__(self):
        self.growth, self.calls = 0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.eval()
        x = torch.randn(256, 2048, device=pl_module.device)
        before = torch.cuda.memory_allocated()
        out = pl_module.net(x)
        after = torch.cuda.memory_allocated()
        self.growth += after - before + x.numel() * x.element_size()
        self.calls += 1
        del out
        pl_module.train()


def test_saved_for_backward_bytes_match_allocated_growth(tmp_path, record):
    probe = EvalWithGradCallback()
    gpu_fit(tmp_path, [probe, EvalNoGradGuard()], EvalSpikeModel(keep_graphs=False), max_steps=8)
    guard = find_summary(tmp_path)["eval_no_grad_guard"]
    saved = guard["saved_for_backward_mb"] * MB / max(1, guard["grad_enabled_eval_forwards"])
    growth = probe.growth / probe.calls
    record("EvalNoGradGuard bytes saved for backward per forward vs torch.cuda.memory_allocated growth", saved / MB,
           growth / MB, "MB", "within 10%")
    assert saved == pytest.approx(growth, rel=0.10)


def test_bench_on_cuda_fills_the_memory_columns_and_survives_an_oom(tmp_path, record):
    out_csv = tmp_path / "bench.csv"
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "bench", "--model", "bench_models:small_conv",
                           "--input-sizes", "64", "32768", "128", "--batch-sizes", "1", "64", "--device", "cuda",
                           "--csv", str(out_csv), "--warmup", "1", "--iters", "3", "--no-progress"],
                          capture_output=True, text=True, timeout=600, cwd=tests)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import csv

    with open(out_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    ok = [r for r in rows if not r["error"]]
    assert any(r["error"] == "OOM" for r in rows), [r["error"] for r in rows]
    first_oom = next(i for i, r in enumerate(rows) if r["error"] == "OOM")
    assert rows[first_oom]["tile_size"] == "32768"
    assert any(not r["error"] for r in rows[first_oom + 1:]), "the sweep stopped at the OOM row"
    for r in ok:
        assert float(r["memory_allocated_mb"]) > 0 and float(r["memory_reserved_mb"]) >= float(r["memory_allocated_mb"])
        assert float(r["memory_peak_mb"]) >= float(r["memory_allocated_mb"])
    record("bench --device cuda: OOM rows / rows", sum(r["error"] == "OOM" for r in rows), len(rows), "rows",
           "OOM recorded, sweep goes on")


#: Dense bf16 peaks (FLOP/s, datasheets) of boards Lightning's get_available_flops may not know.
DENSE_BF16_PEAK = {"H200": 989.4e12, "H100": 989.4e12}


class StepEvents(Callback):
    """The independent clock of the MFU check: a CUDA event recorded at each batch end (no sync in the step),
    read once at train end: device time from the end of the warm-up to the last batch."""

    def __init__(self, skip):
        self.skip, self.events = skip, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events.append(event)

    def on_train_end(self, trainer, pl_module):
        torch.cuda.synchronize()
        self.measured_s = self.events[self.skip - 1].elapsed_time(self.events[-1]) / 1000.0
        self.measured_iterations = len(self.events) - self.skip


def test_mfu_of_a_matmul_loop_matches_closed_form_flops_and_event_time(tmp_path, record):
    from lightning.fabric.utilities.throughput import get_available_flops

    n, reps, rows, warmup = 4096, 6, 1024, 10
    peak, source = get_available_flops(torch.device("cuda"), torch.bfloat16), "get_available_flops"
    if not peak:  # Lightning's table lacks this board (the H200 in Lightning 2.6): its datasheet's dense bf16 peak
        name = torch.cuda.get_device_name()
        peak = next((flops for board, flops in DENSE_BF16_PEAK.items() if board in name), None)
        assert peak, f"neither Lightning's get_available_flops nor this test knows the peak of {name}"
        source = "argument"
    events = StepEvents(skip=warmup)
    timer = IterationTimer(warmup_steps=warmup, flops_per_batch="auto",
                           available_flops=peak if source == "argument" else None)
    gpu_fit(tmp_path, [timer, events], MatmulModel(n=n, reps=reps, resident=True, batches=120),
            precision="bf16-mixed")
    t = find_summary(tmp_path)["iteration_timer"]
    # forward: reps products of (rows x n) @ (n x n); backward: the weight's gradient for each, the input's for all
    # but the first (the batch needs no gradient)
    closed = 2 * rows * n * n * (reps + reps + (reps - 1))
    record("FLOPs of one batch (auto) vs closed form", t["flops_per_batch"], closed, "FLOP", "within 1%")
    assert t["flops_per_batch"] == pytest.approx(closed, rel=0.01)
    independent = 100.0 * closed * events.measured_iterations / events.measured_s / peak
    record(f"MFU (bf16) vs closed-form FLOPs / CUDA-event time / the peak ({source})", t["mfu_pct"], independent, "%",
           "within 5%")
    assert t["available_flops"] == pytest.approx(peak) and t["available_flops_source"] == source
    assert t["mfu_pct"] == pytest.approx(independent, rel=0.05)


def test_allocator_retries_read_as_torch_reports_them(tmp_path, record):
    """IterationTimer reads the allocator's retries from the nested statistics: the same count torch's flat
    ``memory_stats`` gives, and no sync."""
    timer = IterationTimer(warmup_steps=2)
    gpu_fit(tmp_path, [timer], MatmulModel(n=1024, reps=2, resident=True, batches=20))
    t = find_summary(tmp_path)["iteration_timer"]
    trainer_like = type("T", (), {"strategy": type("S", (), {"root_device": torch.device("cuda", 0)})()})()
    ours = timer._read_alloc_retries(trainer_like)
    record("allocator retries read by IterationTimer vs torch.cuda.memory_stats", ours,
           torch.cuda.memory_stats(0)["num_alloc_retries"], "retries", "equal")
    assert ours == torch.cuda.memory_stats(0)["num_alloc_retries"]
    assert t["tail"]["alloc_retries"] is not None and "tail.alloc_retries" not in t["unavailable"]
