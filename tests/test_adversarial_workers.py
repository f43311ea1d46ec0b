"""SectionProfiler's DataLoader workers under adversarial review: whether they compute or wait (their CPU share,
timed inside them, against closed-form expectations) and the advice that follows; the ``workers`` block when a fit
stops on a worker's error; the synchronization reason of a single-device run."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from helpers import TinyModel, find_summary, fit
from lightning_perf import IterationTimer, SectionProfiler
from lightning_perf.measure.sections import loader as loader_module


class SleepingItems(Dataset):
    """Items that wait ``item_s`` each (``time.sleep``, as a read from a slow disk or the network does): no CPU."""

    def __init__(self, n, item_s):
        self.x = torch.randn(n, 16)
        self.item_s = item_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(self.item_s)
        return self.x[i], self.x[i].sum(dim=0, keepdim=True)


class SpinningItems(SleepingItems):
    """Items that compute ``item_s`` of the thread's own CPU time each (a spin on ``time.thread_time``): all CPU."""

    def __getitem__(self, i):
        end = time.thread_time() + self.item_s
        while time.thread_time() < end:
            pass
        return self.x[i], self.x[i].sum(dim=0, keepdim=True)


class FailingItems(SleepingItems):
    """Items from ``fail_at`` on raise, inside the worker that makes them."""

    def __init__(self, n, fail_at):
        super().__init__(n, 0.0)
        self.fail_at = fail_at

    def __getitem__(self, i):
        if i >= self.fail_at:
            raise ValueError(f"item {i} is broken")
        return self.x[i], self.x[i].sum(dim=0, keepdim=True)


class LoaderModel(TinyModel):
    loader = None  # (set on the instance: an argument would go into the hyperparameters, which are copied)

    def train_dataloader(self):
        return self.loader


def workers_fit(tmp_path, dataset, workers=2, batch_size=8):
    model = LoaderModel()
    model.loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers)
    fit(tmp_path, [SectionProfiler(warmup_steps=2, print_reports=False), IterationTimer(warmup_steps=2)],
        model=model, max_epochs=1, limit_val_batches=0, num_sanity_val_steps=0, enable_checkpointing=False)
    return find_summary(tmp_path)


def computing(row):
    """Closed form: of the fetch time not spent waiting for a core, the % on a core (the rest sleeps or waits on
    I/O); ~0 for items that sleep, ~100 for items that compute, however crowded the cores."""
    free = 100.0 - (row["core_wait_pct"] or 0.0)
    return 100.0 * row["cpu_pct"] / free if free > 0 else 100.0


def data_insight(section):
    return next(i for i in section["insights"] if i.startswith("Data loading"))


def test_workers_that_sleep_are_not_saturated_cores_and_more_workers_can_help(tmp_path):
    """Two workers whose items sleep 5 ms (40 ms a batch of 8, no CPU to speak of) beside a step of about a
    millisecond: the loop waits for them (input-bound) and they are busy the whole time, but a sleeping worker holds
    no core: their CPU share is near 0 (closed form: a few µs of Python per 5 ms item), and the advice is that more
    workers can help, whatever the cores (the finding: "2 workers are saturated (103%) ... more workers cannot help"
    on 2 cores, while 4 and 8 workers cut the wait from 14.7 to 6.1 and 1.9 ms)."""
    summary = workers_fit(tmp_path, SleepingItems(240, 0.005))
    section = summary["section_profiler"]
    row = section["workers"]
    assert row["num_workers"] == 2 and row["batches"] == 30, row
    assert row["busy_pct"] >= 80, row  # the loop goes at the workers' pace
    assert 0 <= row["cpu_pct"] < 25, row
    assert computing(row) < 30, row  # (on a crowded machine each wake-up may wait for a core: that is not computing)
    advice = loader_module.wait_advice(row)
    assert "more workers can help" in advice and "cannot help" not in advice, advice
    assert "more workers can help" in data_insight(section)
    diagnosis = summary["diagnosis"]
    assert diagnosis["verdict"] == "input-bound" and "more workers can help" in diagnosis["advice"], diagnosis


def test_workers_that_compute_are_saturated_and_the_advice_follows_the_cores(tmp_path):
    """Two workers whose items compute 1 ms of CPU each (8 ms a batch) beside a step of about a millisecond: their
    fetch is all CPU, on a core or waiting for one (closed form: CPU share + core wait = 100%), and the advice is
    the saturated one: add workers where there are more cores than workers, else make loading cheaper; never "more
    workers can help" for waiting workers."""
    # 40 batches: the workers idle only at the end, while the loop takes the batches they made ahead, and on a busy
    # machine (a slower loop) that tail of 20 batches came to a fifth of the fetch time (busy 78.9%)
    summary = workers_fit(tmp_path, SpinningItems(320, 0.001))
    section = summary["section_profiler"]
    row = section["workers"]
    assert row["num_workers"] == 2 and row["batches"] == 40, row
    assert row["busy_pct"] >= 80, row
    assert row["cpu_pct"] > 0, row
    assert 70 <= row["cpu_pct"] + (row["core_wait_pct"] or 0.0) <= 105, row
    assert computing(row) > 70, row
    advice = loader_module.wait_advice(row)
    assert "saturated" in advice and "can help" not in advice, advice
    assert ("add workers" in advice) == (row["cpu_count"] > 2), advice
    assert ("cannot help" in advice) == (row["cpu_count"] <= 2), advice


@pytest.mark.parametrize("cpu_pct, core_wait_pct, cores, words", [
    (2.0, 1.0, 2, "more workers can help"),  # sleeping workers on every core: more still help
    (2.0, None, 8, "more workers can help"),  # (no core-wait figure off Linux: the CPU share alone)
    (3.0, 32.0, 2, "more workers can help"),  # sleeping on a crowded machine: each wake-up waits for a core
    (40.0, 55.0, 2, "cannot help"),  # computing, half of it waiting for a core: the cores are the limit
    (22.0, 77.0, 2, "cannot help"),  # computing on a crowded machine: a small CPU share, all of it wanted
    (97.0, 1.0, 8, "add workers"),
    (None, None, 2, "cannot help"),  # no CPU figure (an older summary): the cores alone, as before
])
def test_the_saturated_advice_tells_computing_from_waiting(cpu_pct, core_wait_pct, cores, words):
    """The rules on the workers' figures alone (two workers, saturated): workers that mostly wait (sleep, I/O) get
    "more workers can help" even where the cores are all taken (a wake-up's wait for a core is not computing);
    workers that compute, on a core or waiting for one, get the saturated advice, by the cores."""
    row = {"num_workers": 2, "batches": 100, "busy_ms_per_batch": 40.0, "busy_pct": 103.0, "cpu_count": cores,
           "cpu_pct": cpu_pct, "core_wait_pct": core_wait_pct}
    advice = loader_module.wait_advice(row)
    assert words in advice, advice
    if cpu_pct is not None:
        assert f"{cpu_pct:.0f}%" in advice, advice


@pytest.mark.parametrize("fail_at", [0, 120])
def test_a_worker_error_leaves_the_workers_block_or_its_reason(tmp_path, fail_at):
    """A dataset that raises in a worker (on its first item, or after some iterations) stops the fit; the summary
    written at the failure has the workers' figures up to it, and a reason for every one that is null (before: the
    block was null and nothing said why)."""
    with pytest.raises(ValueError, match="is broken"):
        workers_fit(tmp_path, FailingItems(160, fail_at))
    summary = find_summary(tmp_path)
    assert summary["status"] != "ok"
    section = summary["section_profiler"]
    row = section["workers"]
    assert row is not None and row["num_workers"] == 2, section
    nulls = [k for k, v in row.items() if v is None]
    assert not nulls or "workers" in section["unavailable"], (row, section["unavailable"])
    if fail_at:
        assert row["batches"] >= 10 and row["busy_ms_per_batch"] > 0 and row["cpu_pct"] is not None, row


def test_the_synchronization_reason_of_a_single_device_run_does_not_speak_of_ddp(tmp_path):
    """One CPU device: no gradients are synchronized between devices, and the reason says that, not DDP's."""
    fit(tmp_path, [SectionProfiler(warmup_steps=1, print_reports=False)], max_epochs=1, limit_val_batches=0,
        num_sanity_val_steps=0, enable_checkpointing=False)
    reason = find_summary(tmp_path)["section_profiler"]["unavailable"]["synchronization"]
    assert "DDP" not in reason and "single device" in reason, reason
