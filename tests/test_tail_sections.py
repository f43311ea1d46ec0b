"""The tail's sections against known stalls where the join is easy to get wrong: a SectionProfiler added at a
resume, a nested section in a batch-end hook, a cause whose slow iterations grew elsewhere (virtual clock)."""

import glob
import os

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from helpers import TinyModel, find_summary, trainer_kwargs, use_virtual_clock
from lightning_perf import IterationTimer, SectionProfiler, profile_section
from lightning_perf.measure.stats.streaming import LogHistogram
from lightning_perf.measure.timing.tail import median_per_iteration
from lightning_perf.measure.timing.tail_advice import tail_insights

CLOCK = {}


@pytest.fixture
def clock(monkeypatch):
    CLOCK["c"] = use_virtual_clock(monkeypatch)
    yield CLOCK["c"]
    CLOCK.clear()


class Staged(TinyModel):
    """10 ms a step; ``forward``: {iteration: extra seconds}; ``sample``: {global step: seconds} of a
    ``profile_section("sampling")`` in the module's batch-end hook (with ``nested``, 20 ms of it and the rest in a
    nested ``inner``)."""

    def __init__(self, forward=None, sample=None, nested=False):
        super().__init__()
        self.forward_stalls, self.sample, self.nested = forward or {}, sample or {}, nested

    def training_step(self, batch, batch_idx):
        CLOCK["c"].advance(0.010 + self.forward_stalls.get(self.global_step + 1, 0.0))
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        seconds = self.sample.get(self.global_step)
        if seconds:
            with profile_section("sampling"):
                CLOCK["c"].advance(0.020 if self.nested else seconds)
                if self.nested:
                    with profile_section("inner"):
                        CLOCK["c"].advance(seconds - 0.020)

    def train_dataloader(self):
        x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def kwargs(tmp_path, **overrides):
    base = dict(max_epochs=None, limit_val_batches=0, num_sanity_val_steps=0, enable_checkpointing=False)
    base.update(overrides)
    return trainer_kwargs(tmp_path, **base)


def latest_summary(root):
    paths = sorted(glob.glob(os.path.join(str(root), "**", "perf_summary.json"), recursive=True),
                   key=os.path.getmtime)
    return find_summary(os.path.dirname(paths[-1]))


def test_a_section_profiler_added_at_a_resume_is_joined_by_global_step(tmp_path, clock):
    """Fit 1 has no SectionProfiler (a 40 ms forward stall at iteration 10); fit 2 resumes from step 20 with one,
    which counts its iterations from 0: an 80 ms sampling after step 29 is run iteration 30, its 10th."""
    saves = ModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_train_steps=20, save_top_k=-1)
    Trainer(callbacks=[IterationTimer(warmup_steps=2), saves],
            **kwargs(tmp_path, max_steps=30, enable_checkpointing=True)).fit(Staged(forward={10: 0.040}))
    path = glob.glob(str(tmp_path / "ck" / "*step=20*.ckpt"))[0]
    Trainer(callbacks=[IterationTimer(warmup_steps=2), SectionProfiler(warmup_steps=2, print_reports=False)],
            **kwargs(tmp_path, max_steps=60)).fit(Staged(forward={10: 0.040}, sample={29: 0.080}), ckpt_path=path)
    slow = {s["iteration"]: s for s in latest_summary(tmp_path)["iteration_timer"]["tail"]["slowest"]}
    assert slow[10]["ms"] == pytest.approx(50.0) and slow[10]["section"] is None  # no record from fit 1
    assert slow[30]["section"]["section"] == "sampling" and slow[30]["section"]["ms"] == pytest.approx(80.0)


def test_a_nested_section_in_a_batch_end_hook_moves_with_its_parent(tmp_path, clock):
    Trainer(callbacks=[IterationTimer(warmup_steps=2), SectionProfiler(warmup_steps=2, print_reports=False)],
            **kwargs(tmp_path, max_steps=40)).fit(Staged(sample={25: 0.080}, nested=True))
    s = latest_summary(tmp_path)
    records = {r["iteration"]: r for r in s["section_profiler"]["slowest_iterations"]}
    assert records[26]["sections_ms"]["sampling"] == pytest.approx(80.0)
    assert records[26]["sections_ms"]["inner"] == pytest.approx(60.0)
    assert records[26]["ms"] == pytest.approx(90.0)
    assert "inner" not in records.get(25, {"sections_ms": {}})["sections_ms"]


def test_a_cause_whose_iterations_grew_elsewhere_names_where(tmp_path, clock):
    """A checkpoint every 10 steps costs ~nothing; an 80 ms sampling after the same steps lands in the same
    iterations (11, 21, 31). The checkpoint is not what to fix, in the insight and in the diagnosis."""
    saves = ModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_train_steps=10, save_top_k=-1)
    Trainer(callbacks=[IterationTimer(warmup_steps=2), SectionProfiler(warmup_steps=2, print_reports=False), saves],
            **kwargs(tmp_path, max_steps=40, enable_checkpointing=True)).fit(
        Staged(sample={10: 0.080, 20: 0.080, 30: 0.080}))
    s = latest_summary(tmp_path)
    cause = s["iteration_timer"]["tail"]["by_cause"]["checkpoint"]
    assert cause["iterations"] == 3 and cause["section"]["name"] == "sampling"
    insight = next(i for i in s["iteration_timer"]["tail"]["insights"] if "checkpoint" in i)
    assert "not where their time went: sampling took 80 ms in 3 of the 3 slowest" in insight
    assert "it runs in 3 of 38 iterations" in insight and "would save" not in insight
    diagnosis = s["diagnosis"]
    assert diagnosis["verdict"] == "tail-heavy" and "sampling" in diagnosis["advice"]
    assert "checkpoints less often" not in diagnosis["advice"]


def test_a_checkpoint_that_took_the_time_keeps_its_advice(tmp_path, clock):
    from lightning.pytorch.plugins.io import TorchCheckpointIO

    class SlowWriter(TorchCheckpointIO):
        def save_checkpoint(self, *args, **kwargs):
            CLOCK["c"].advance(0.060)
            return super().save_checkpoint(*args, **kwargs)

    saves = ModelCheckpoint(dirpath=str(tmp_path / "ck"), every_n_train_steps=10, save_top_k=-1)
    Trainer(callbacks=[IterationTimer(warmup_steps=2), SectionProfiler(warmup_steps=2, print_reports=False), saves],
            plugins=[SlowWriter()], **kwargs(tmp_path, max_steps=40, enable_checkpointing=True)).fit(Staged())
    s = latest_summary(tmp_path)
    cause = s["iteration_timer"]["tail"]["by_cause"]["checkpoint"]
    assert cause["section"]["name"] == "checkpointing"
    insight = next(i for i in s["iteration_timer"]["tail"]["insights"] if "checkpoint" in i)
    assert "saving less often" in insight and "would save up to 0.2 s" in insight


def test_the_gc_rule_promises_no_more_than_the_pauses_and_counts_in_words():
    block = {"factor": 2.0, "median_ms": 10.0, "share_pct": 10.0, "slowest": [], "alloc_retries": None,
             "dataloader": None,
             "by_cause": {"gc": {"iterations": 1, "time_s": 0.06, "excess_s": 0.05, "mean_ms": 60.0,
                                 "share_pct": 10.0, "flagged_iterations": 1, "gc_pause_s": 0.002}}}
    text = next(i for i in tail_insights(block) if "garbage collection" in i)
    assert "in 1 iteration with a full Python garbage collection" in text
    assert "would save up to 0.0 s (the pauses, at most)" in text


def test_the_median_per_iteration_of_a_section_called_often_in_few_iterations_is_zero():
    hist = LogHistogram()
    hist.add_many([2.0] * 100)  # 10 calls in each of 10 of 50 iterations
    assert median_per_iteration(hist, 50, runs=10) == 0.0
    assert median_per_iteration(hist, 8, runs=8) == pytest.approx(25.0, rel=0.01)  # 12.5 calls of 2 ms each
    once = LogHistogram()
    once.add_many([float(v) for v in range(1, 31)])  # ran once in each of 30 of 40 iterations: 10 zeros first
    assert median_per_iteration(once, 40) == pytest.approx(once.quantile((30 - 20) / 30), rel=1e-9)


def test_the_console_tail_line_counts_in_words():
    from lightning_perf.measure.timing.tail_advice import tail_line

    one = {"share_pct": 0.9, "iterations": 1, "factor": 2.0, "median_ms": 500.0, "by_cause": {}}
    assert "in 1 iteration over 2x the median" in tail_line(one)
    assert "in 3 iterations over" in tail_line({**one, "iterations": 3})
