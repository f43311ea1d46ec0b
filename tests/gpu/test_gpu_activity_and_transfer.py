"""The CUDA figures added since the first GPU run, each against an independent measure on the device (issue 50):
GPU utilisation, power and SM clock against ``nvidia-smi --query-gpu`` read in the same seconds; the ``transfer``
section for pinned and pageable, blocking and non-blocking copies against the same copy timed alone with CUDA events;
sections timed on the device in one iteration of 32 against the same fit timed in every iteration.

Each test records (ours, independent, bound) for the table of docs/gpu.md. Skipped without CUDA.
"""

import shutil
import statistics
import subprocess

import pytest
import torch
from lightning.pytorch import Callback, LightningModule
from torch import nn
from torch.utils.data import DataLoader

from helpers import find_summary
from lightning_perf import IterationTimer, SectionProfiler, VRAMMonitor

from test_gpu_truth import MatmulModel, Same, gpu_fit

pytestmark = pytest.mark.gpu
MB = 1024 * 1024


class BusyMatmuls(MatmulModel):
    """A steady device load for ~10 s (resident batches, the host queues ahead): NVML and nvidia-smi read the same
    steady state."""

    def __init__(self):
        super().__init__(n=4096, reps=8, resident=True, batches=400)


class NvidiaSmi(Callback):
    """``nvidia-smi --query-gpu`` every 100 ms in a process of its own, from train start to train end: the
    independent reading of utilisation, power and SM clock over the same seconds as VRAMMonitor's train phase."""

    FIELDS = "utilization.gpu,power.draw,clocks.sm"

    def on_train_start(self, trainer, pl_module):
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={self.FIELDS}", "--format=csv,noheader,nounits",
                                      "-i", str(torch.cuda.current_device()), "-lms", "100"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def on_train_end(self, trainer, pl_module):
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        rows = []
        for line in out.splitlines():
            try:
                rows.append([float(v) for v in line.split(",")])
            except ValueError:  # "[N/A]", a cut last line
                continue
        self.rows = rows


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="nvidia-smi is not on the PATH")
def test_nvml_utilisation_power_and_clock_match_nvidia_smi_in_the_same_seconds(tmp_path, record):
    smi = NvidiaSmi()
    gpu_fit(tmp_path, [smi, VRAMMonitor(nvml_interval_s=0.05)], BusyMatmuls(), enable_checkpointing=False)
    activity = find_summary(tmp_path)["vram"]["activity"]
    train = activity["phases"]["train"]
    assert len(smi.rows) >= 20, f"nvidia-smi gave {len(smi.rows)} rows"
    util, power, clock = (statistics.fmean(r[i] for r in smi.rows) for i in range(3))
    checked = 0
    if train.get("gpu_util_pct") is not None:
        record("VRAMMonitor GPU utilisation (train mean) vs nvidia-smi utilization.gpu", train["gpu_util_pct"]["mean"],
               util, "%", "within 10 points")
        assert train["gpu_util_pct"]["mean"] == pytest.approx(util, abs=10)
        checked += 1
    if train.get("power_w") is not None:
        record("VRAMMonitor power (train mean) vs nvidia-smi power.draw", train["power_w"]["mean"], power, "W",
               "within 10%")
        assert train["power_w"]["mean"] == pytest.approx(power, rel=0.10)
        checked += 1
    if train.get("sm_clock_mhz") is not None:
        record("VRAMMonitor SM clock (train mean) vs nvidia-smi clocks.sm", train["sm_clock_mhz"]["mean"], clock,
               "MHz", "within 5%")
        assert train["sm_clock_mhz"]["mean"] == pytest.approx(clock, rel=0.05)
        checked += 1
    assert checked == 3, f"NVML figures unavailable on this GPU: {activity['unavailable']}"


class CopyModel(LightningModule):
    """A step that is all host-to-device copy: a 64 MB batch, pinned or pageable, copied blocking or not (our own
    ``transfer_batch_to_device``; Lightning's default copies non-blocking), then one tiny kernel."""

    def __init__(self, pinned, blocking, mb=64, batches=80):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(1))
        buf = torch.randn(mb * MB // 4)
        self.buf = buf.pin_memory() if pinned else buf
        self.blocking, self.batches, self.copies = blocking, batches, []

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = batch.to(device, non_blocking=not self.blocking)
        end.record()
        self.copies.append((start, end))  # the module's own clock of each copy, read at the end
        return out

    def copies_ms(self, skip):
        """Mean device time of the copies after the first ``skip``, by the module's own CUDA events."""
        torch.cuda.synchronize()
        return statistics.fmean(a.elapsed_time(b) for a, b in self.copies[skip:])

    def training_step(self, batch, batch_idx):
        return (self.w * batch[:1024]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(Same(self.buf, self.batches), batch_size=None)


def copy_alone_ms(buf, blocking, reps=20):
    """The same copy on its own: CUDA events around it, the device idle before, median of `reps`."""
    times = []
    for _ in range(reps + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        y = buf.to("cuda", non_blocking=not blocking)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
        del y
    return statistics.median(times[3:])


@pytest.mark.parametrize("pinned, blocking", [(True, False), (True, True), (False, True), (False, False)],
                         ids=["pinned non-blocking", "pinned blocking", "pageable blocking", "pageable non-blocking"])
def test_transfer_section_is_the_copy_on_the_device(tmp_path, record, pinned, blocking):
    """The section's device time against the module's own CUDA events around the same copies in the same fit (every
    iteration timed on the device); the same copy timed alone after the fit is a figure beside it: a pageable copy is
    staged by the host, and its speed in a fit is not its speed alone (the H200 run: 7.8 ms in the fit, 5.8 alone)."""
    model = CopyModel(pinned, blocking)
    warmup = 5
    gpu_fit(tmp_path, [SectionProfiler(warmup_steps=warmup, print_reports=False, device_timing_every_n_iterations=1)],
            model)
    transfer = find_summary(tmp_path)["section_profiler"]["sections"]["transfer"]
    own = model.copies_ms(skip=warmup)
    alone = copy_alone_ms(model.buf, blocking)
    label = f"{'pinned' if pinned else 'pageable'}, {'blocking' if blocking else 'non-blocking'}"
    record(f"SectionProfiler transfer device time vs the module's CUDA events around the same 64 MB copies ({label})",
           transfer["device_mean_ms"], own, "ms", "within 10%")
    record(f"the same 64 MB copy timed alone after the fit ({label})", alone, own, "ms", "a figure")
    assert transfer["device_mean_ms"] == pytest.approx(own, rel=0.10)
    if pinned and not blocking:
        # the host only queues the copy: its time in the section is a small part of the copy's
        record(f"SectionProfiler transfer host time vs the copy's device time ({label})", transfer["mean_ms"],
               own, "ms", "host < half the copy")
        assert transfer["mean_ms"] < 0.5 * own
    else:
        # pageable memory (staged through a pinned buffer) or a blocking copy: the host waits for the copy
        record(f"SectionProfiler transfer host time vs the copy's device time ({label})", transfer["mean_ms"],
               own, "ms", "host >= 85% of the copy")
        assert transfer["mean_ms"] >= 0.85 * own


def test_sections_timed_one_iteration_in_32_match_timing_every_iteration(tmp_path, record):
    """The default device timing (the first 32 counted iterations, then one in 32) against the same fit with every
    iteration timed on the device: the same device means per section, within 5% (the optimizer step, ~0.1 ms: 10%)."""
    means = {}
    for every in (32, 1):
        root = tmp_path / f"every_{every}"
        profiler = SectionProfiler(warmup_steps=10, print_reports=False, device_timing_every_n_iterations=every)
        gpu_fit(root, [IterationTimer(warmup_steps=10), profiler], MatmulModel(resident=True, batches=330))
        sections = find_summary(root)["section_profiler"]["sections"]
        means[every] = {name: row["device_mean_ms"] for name, row in sections.items()
                        if row["kind"] == "auto" and row["device_mean_ms"]}
        assert profiler._ledger.sections["forward"].device.count == (320 if every == 1 else 32 + 9)
    assert {"forward", "backward", "optimizer_step"} <= set(means[32]) and set(means[32]) == set(means[1])
    for name, bound in (("forward", 0.05), ("backward", 0.05), ("optimizer_step", 0.10)):  # the step: ~0.1 ms
        record(f"SectionProfiler {name} device time, one iteration in 32 vs every iteration", means[32][name],
               means[1][name], "ms", f"within {bound:.0%}")
        assert means[32][name] == pytest.approx(means[1][name], rel=bound)
