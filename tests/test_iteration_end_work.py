"""SectionProfiler: work at the end of an iteration belongs to that iteration, and the fit's final work has its own
row (issue 23, seed 004). On the virtual clock (helpers.VirtualClock): every figure is the cost the test injects."""

import pytest
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import DataLoader

from helpers import ClockedItems, SimulatedDevice, TinyModel, find_summary, fit, read_scalars, use_virtual_clock
from lightning_perf import SectionProfiler, profile_section

STEP_S, SAMPLE_S, SAVE_S, FINAL_S, FETCH_S = 0.003, 0.005, 0.007, 0.011, 0.0005


class CostlySaves(TorchCheckpointIO):
    """Every checkpoint write costs SAVE_S on the virtual clock, and is written for real."""

    def __init__(self, clock):
        self.clock, self.saves = clock, 0

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.clock.advance(SAVE_S)
        self.saves += 1
        super().save_checkpoint(checkpoint, path, storage_options)


class Sampler(TinyModel):
    """STEP_S a training_step; every ``every`` steps a SAMPLE_S ``sampling`` section in the module's batch-end hook
    (which Lightning calls after every callback's), counted by the model itself."""

    def __init__(self, clock, every):
        super().__init__()
        self.clock, self.every, self.sampled = clock, every, 0

    def training_step(self, batch, batch_idx):
        self.clock.advance(STEP_S)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.trainer.global_step % self.every == 0:
            with profile_section("sampling"):
                self.clock.advance(SAMPLE_S)
            self.sampled += 1


def profiler(**kwargs):
    kwargs.setdefault("print_reports", False)
    kwargs.setdefault("warmup_steps", 0)
    return SectionProfiler(**kwargs)


@pytest.mark.parametrize("boundary", ["batch_gap", "fetch"])
def test_every_sampling_call_and_every_checkpoint_is_counted_the_last_ones_too(tmp_path, monkeypatch, boundary):
    """12 steps over two epochs (8 + 4, stopped by max_steps mid-epoch): sampling at 3, 6, 9, 12 and a checkpoint
    at 4, 8, 12. The model's own count, the files on disk and the plugin's count are the references."""
    clock = use_virtual_clock(monkeypatch)
    io, model = CostlySaves(clock), Sampler(clock, every=3)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    fit(tmp_path, [profiler(data_loading_boundary=boundary), ckpt], model=model, max_steps=12, max_epochs=None,
        plugins=[io])
    sp = find_summary(tmp_path)["section_profiler"]
    table = sp["sections"]
    files = len(list((tmp_path / "ckpt").glob("*.ckpt")))
    assert model.sampled == 4 and files == io.saves == 3
    assert sp["iterations"] == 12
    # the module's batch-end sampling runs between two batches: with the fetch as data loading that is the loop's own
    # section; with batch_gap it is carved out of the gap and named `other` (not part of the fetch)
    between = "other" if boundary == "batch_gap" else "between_batches"
    assert table["sampling"]["count"] == model.sampled and table["sampling"]["parent"] == between
    assert table["sampling"]["total_s"] == pytest.approx(model.sampled * SAMPLE_S)
    assert table["checkpointing"]["count"] == files and table["checkpointing"]["total_s"] == pytest.approx(
        files * SAVE_S)
    # the iterations hold all of it, nothing else was spent: the final row is empty
    assert sp["iteration_ms"]["mean"] * sp["iterations"] == pytest.approx(
        1000 * (12 * STEP_S + 4 * SAMPLE_S + 3 * SAVE_S))
    assert 1000 * sum(r["total_s"] for r in table.values()) == pytest.approx(
        sp["iteration_ms"]["mean"] * sp["iterations"])
    final = sp["after_last_iteration"]
    assert final["total_s"] == pytest.approx(0.0, abs=1e-9) and set(final["sections"]) == {"other"}
    assert "after_last_iteration" not in sp["unavailable"]


def test_the_report_at_step_n_holds_the_batch_end_work_of_iteration_n(tmp_path, monkeypatch):
    """A report every 4 steps, sampling and a checkpoint every 4 steps: each window holds exactly one of each, the
    one of its own last iteration (counted in the next iteration, the first window held none and the last was
    lost)."""
    clock = use_virtual_clock(monkeypatch)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    fit(tmp_path, [profiler(report_every_n_steps=4), ckpt], model=Sampler(clock, every=4), max_epochs=2,
        plugins=[CostlySaves(clock)])
    scalars = read_scalars(tmp_path)
    for key, cost in (("time/sampling_ms", SAMPLE_S), ("time/checkpointing_ms", SAVE_S)):
        assert [step for step, _ in scalars[key]] == [4, 8, 12, 16], key
        assert [v for _, v in scalars[key]] == pytest.approx([1000 * cost / 4] * 4), key
    assert [v for _, v in scalars["time/iteration_ms"]] == pytest.approx(
        [1000 * (4 * STEP_S + SAMPLE_S + SAVE_S) / 4] * 4)


class FinalWork(TinyModel):
    """STEP_S a step; at the end of training a FINAL_S ``final_sampling`` section and a checkpoint of its own."""

    def __init__(self, clock, path):
        super().__init__()
        self.clock, self.path = clock, path

    def training_step(self, batch, batch_idx):
        self.clock.advance(STEP_S)
        return super().training_step(batch, batch_idx)

    def on_train_end(self):
        with profile_section("final_sampling"):
            self.clock.advance(FINAL_S)
        self.trainer.save_checkpoint(self.path)


def test_the_fits_final_work_is_its_own_row(tmp_path, monkeypatch, caplog):
    """ModelCheckpoint saves at each epoch end: the first epoch's save is work of the next iteration, the last
    one falls after the last iteration; the module's on_train_end (after every callback's) samples and saves once
    more. Checkpoints in the table plus the final row are the files on disk."""
    clock = use_virtual_clock(monkeypatch)
    io = CostlySaves(clock)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    with caplog.at_level("INFO"):
        fit(tmp_path, [profiler(print_reports=True), ckpt], model=FinalWork(clock, tmp_path / "ckpt" / "end.ckpt"),
            max_epochs=2, limit_val_batches=0, plugins=[io])
    sp = find_summary(tmp_path)["section_profiler"]
    files = len(list((tmp_path / "ckpt").glob("*.ckpt")))
    assert files == io.saves == 3
    final, table = sp["after_last_iteration"], sp["sections"]
    assert table["checkpointing"]["count"] == 1 and table["checkpointing"]["total_s"] == pytest.approx(SAVE_S)
    assert final["sections"]["checkpointing"]["count"] == 2
    assert table["checkpointing"]["count"] + final["sections"]["checkpointing"]["count"] == files
    assert final["sections"]["checkpointing"]["total_s"] == pytest.approx(2 * SAVE_S)
    row = final["sections"]["final_sampling"]
    assert row == {"kind": "user", "parent": "other", "count": 1, "total_s": pytest.approx(FINAL_S),
                   "closed_by_exception": 0}
    assert "final_sampling" not in table  # it ran in no iteration
    assert final["total_s"] == pytest.approx(2 * SAVE_S + FINAL_S)
    assert final["sections"]["other"]["total_s"] == pytest.approx(0.0, abs=1e-9)
    # the iterations keep their own time: 16 steps and the first epoch's save
    assert sp["iteration_ms"]["mean"] * sp["iterations"] == pytest.approx(1000 * (16 * STEP_S + SAVE_S))
    assert "after the last iteration: 0.025 s" in caplog.text


def test_a_fit_that_fails_says_why_it_has_no_final_row(tmp_path, monkeypatch):
    class Fails(TinyModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path, [profiler()], model=Fails(), max_epochs=1)
    sp = find_summary(tmp_path)["section_profiler"]
    assert sp["after_last_iteration"] is None
    assert "did not reach its end" in sp["unavailable"]["after_last_iteration"]


class BatchEndHeavy(TinyModel):
    """A fetch of FETCH_S an item, STEP_S a step, and 2 ms of batch-end work in no section."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def train_dataloader(self):
        return DataLoader(ClockedItems(self.clock, FETCH_S), batch_size=8)

    def training_step(self, batch, batch_idx):
        self.clock.advance(STEP_S)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.clock.advance(0.002)






@pytest.mark.parametrize("boundary", ["batch_gap", "fetch"])
def test_device_time_labels_follow_the_host_pieces_across_the_iteration_close(tmp_path, monkeypatch, boundary):
    """Batch-end work outside any section is the next iteration's data_loading (batch_gap) or this iteration's
    `between_batches` (fetch), on the host: the device intervals are labelled the same way, section by section."""
    clock = use_virtual_clock(monkeypatch)
    sp = profiler(warmup_steps=2, device_timing_every_n_iterations=1, data_loading_boundary=boundary)
    fit(tmp_path, [sp, SimulatedDevice(sp)], model=BatchEndHeavy(clock), max_epochs=2, enable_checkpointing=False)
    s = find_summary(tmp_path)["section_profiler"]
    table = s["sections"]
    assert s["iterations"] == 14 and table["forward"]["device_mean_ms"] is not None
    for name, row in table.items():
        if row["count"]:
            assert row["device_mean_ms"] == pytest.approx(row["mean_ms"], abs=1e-6), (name, row)
    where = "data_loading" if boundary == "batch_gap" else "between_batches"
    fetch_ms = 8 * 1000 * FETCH_S
    if boundary == "batch_gap":
        assert table["data_loading"]["mean_ms"] == pytest.approx(fetch_ms + 2.0)
    else:
        assert table["data_loading"]["mean_ms"] == pytest.approx(fetch_ms)
        assert table["between_batches"]["mean_ms"] == pytest.approx(2.0)
    assert table[where]["count"] == 14
