"""The evidence callbacks on a real GPU: an OOM provoked on purpose gives a snapshot that names the tensors that
caused it; a trace of a CUDA step holds its kernels; what recording the allocator's history costs. Skipped without
CUDA."""

import json
import os
import time

import pytest
import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers import find_summary, fit
from snapshot_checks import check_oom_snapshot
from lightning_perf import MemorySnapshot, StepTrace, VRAMMonitor

pytestmark = pytest.mark.gpu
HERE = os.path.abspath(__file__)


class OutOfMemoryAtStep(LightningModule):
    """At step 3: keeps a tensor of ~60% of the free memory, then asks for ~80% of it: that request fails."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(64, 1)
        self.sizes = {}

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step + 1 == 3:
            free, _ = torch.cuda.mem_get_info()
            self.sizes["hog"] = hog_n = int(free * 0.6) // 4
            self.hog = torch.empty(hog_n, dtype=torch.float32, device="cuda")  # HOG
            self.sizes["too_big"] = big_n = int(free * 0.8) // 4
            self.too_big = torch.empty(big_n, dtype=torch.float32, device="cuda")  # TOO_BIG
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(64, 64)), batch_size=8)


def test_an_oom_snapshot_names_the_failed_request_and_the_largest_tensor_with_their_lines(tmp_path, record):
    model = OutOfMemoryAtStep()
    with pytest.raises(torch.cuda.OutOfMemoryError):
        fit(tmp_path, [MemorySnapshot()], model=model, accelerator="cuda", max_epochs=1, num_sanity_val_steps=0,
            limit_val_batches=0)
    model.hog = None
    torch.cuda.empty_cache()
    summary = find_summary(tmp_path)
    (dump,) = summary["memory_snapshot"]["snapshots"]
    assert dump["trigger"] == "oom" and dump["step"] == 3 and os.path.getsize(dump["path"]) > 0
    assert summary["memory_snapshot"]["stacks"] == "python"  # the default: Python frames, a quick dump
    record("MemorySnapshot OOM dump (stacks='python'): what the dump cost", dump["dump_ms"], None, "ms",
           "a figure, said in the summary")
    check_oom_snapshot(record, "OOM snapshot", dump, (model.sizes["hog"] * 4, HERE, "# HOG", "training_step"),
                       (model.sizes["too_big"] * 4, HERE, "# TOO_BIG", "training_step"))


class CudaSteps(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(256, 1024)), batch_size=32)


def test_a_trace_of_cuda_steps_holds_their_kernels(tmp_path, record):
    fit(tmp_path, [StepTrace(steps=[3, 4])], model=CudaSteps(), accelerator="cuda", max_epochs=1,
        num_sanity_val_steps=0, limit_val_batches=0)
    (capture,) = find_summary(tmp_path)["step_trace"]["captures"]
    with open(capture["path"]) as fh:
        events = json.load(fh)["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    # on CUDA each record_function range is also mirrored on the device's timeline (cat gpu_user_annotation)
    steps = [e for e in events if str(e.get("name", "")).startswith("Optimizer.step#SGD.step")
             and e.get("cat") != "gpu_user_annotation"]
    record("trace of 2 CUDA steps: optimizer steps in it", len(steps), 2, "count", "equal")
    assert len(steps) == 2 and kernels, "no CUDA kernel in the trace"
    assert capture["top_ops"][0]["self_device_ms"] is not None


def test_what_recording_the_allocator_history_costs(record):
    """Host time of 20,000 allocate-and-free pairs with and without the history on (a figure for docs/evidence.md;
    nothing asserted on time)."""

    def pairs(n=20000):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(n):
            t = torch.empty(1024, device="cuda")
            del t
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / n * 1e6

    pairs(2000)
    off = min(pairs() for _ in range(3))
    torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=100_000)
    try:
        on = min(pairs() for _ in range(3))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    record("allocator history: allocate+free pair, off -> on (stacks=python)", on, off, "µs", "a figure, not checked")
    assert on > 0 and off > 0


class FragmentingSteps(CudaSteps):
    """Steps 2, 3 and 4 fill the card with 1 GiB blocks, free every other one (the cache keeps them) and ask for
    3 GiB: no cached block holds it and the device has less than that left, so the allocator frees its cache and
    tries again: one retry a step (torch's allocator with its default max_split_size)."""

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step + 1 in (2, 3, 4):
            gib = 1 << 30
            torch.cuda.empty_cache()  # the last step's blocks back to the device: `free` is what can be had
            free, _ = torch.cuda.mem_get_info()
            chunks = [torch.empty(gib, dtype=torch.uint8, device="cuda") for _ in range(int(free // gib) - 1)]
            del chunks[::2]
            big = torch.empty(3 * gib, dtype=torch.uint8, device="cuda")
            del big, chunks
        return super().training_step(batch, batch_idx)


def test_allocator_retries_forced_by_a_fragmenting_pattern_are_counted(tmp_path, record):
    torch.cuda.empty_cache()
    before = torch.cuda.memory_stats()["num_alloc_retries"]
    fit(tmp_path, [VRAMMonitor(nvml=False, activity=False)], model=FragmentingSteps(), accelerator="cuda",
        max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0)
    counted = torch.cuda.memory_stats()["num_alloc_retries"] - before
    torch.cuda.empty_cache()
    summary = find_summary(tmp_path)
    train = summary["vram"]["phases"]["train"]
    record("allocator retries in training (3 forced)", train["alloc_retries"], counted, "count", "equal, and >= 3")
    assert train["alloc_retries"] == counted and counted >= 3
    assert train["fragmentation_mb"] is not None and train["largest_free_block_mb"] is not None
    assert any(line.startswith(f"allocator under pressure: {counted} retries") for line in
               summary["diagnosis"]["evidence"])
