import os
import re
import time

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import DataLoader, Dataset

from helpers import (ClockedItems, HostEvent, ManualModel, SimulatedDevice, TinyModel, find_summary, fit, make_loader,
                     read_scalars, use_virtual_clock)
from lightning_perf import IterationTimer, SectionProfiler, profile_section
from lightning_perf.measure.sections import user_sections as sections_module

AUTO = ("data_loading", "forward", "backward", "optimizer_step", "checkpointing", "other")


def profiler(**kwargs):
    kwargs.setdefault("print_reports", False)
    kwargs.setdefault("warmup_steps", 2)
    return SectionProfiler(**kwargs)


class EmaModel(TinyModel):
    """20 ms in a user section ``ema``; ``pace`` spends them: ``time.sleep``, or a virtual clock's ``advance``."""

    pace = staticmethod(time.sleep)

    def training_step(self, batch, batch_idx):
        with profile_section("ema"):
            self.pace(0.02)
        return super().training_step(batch, batch_idx)


class EverySection(TinyModel):
    """A known cost on a virtual clock (helpers.VirtualClock) in every automatic section, ``COSTS`` seconds an
    iteration: 8 items of ClockedItems (data_loading), the training loop's transfer, training_step (forward),
    backward, the module's on_after_backward (other: callbacks' hooks run first) and zero_grad plus the module's
    on_before_optimizer_step (optimizer_step, entered twice an iteration); ``ema`` adds a user section of that many
    seconds in training_step (carved out of forward)."""

    # all different, and no one a sum of others: a boundary put at the wrong hook moves a cost visibly
    COSTS = {"data_loading": 0.008, "transfer": 0.0005, "forward": 0.003, "backward": 0.004, "other": 0.0013,
             "optimizer_step": 0.001 + 0.0017}

    def __init__(self, clock, ema=0.0):
        super().__init__()
        self.clock, self.ema = clock, ema

    def train_dataloader(self):
        return DataLoader(ClockedItems(self.clock, self.COSTS["data_loading"] / 8), batch_size=8)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if self.trainer.training:
            self.clock.advance(self.COSTS["transfer"])
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def training_step(self, batch, batch_idx):
        self.clock.advance(self.COSTS["forward"])
        if self.ema:
            with profile_section("ema"):
                self.clock.advance(self.ema)
        return super().training_step(batch, batch_idx)

    def backward(self, loss, *args, **kwargs):
        self.clock.advance(self.COSTS["backward"])
        return super().backward(loss, *args, **kwargs)

    def on_after_backward(self):
        self.clock.advance(self.COSTS["other"])

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        self.clock.advance(0.001)
        return super().optimizer_zero_grad(epoch, batch_idx, optimizer)

    def on_before_optimizer_step(self, optimizer):
        self.clock.advance(0.0017)


def test_sections_add_up_to_the_iteration_time_that_iteration_timer_measures(tmp_path, monkeypatch):
    """On the virtual clock (helpers.VirtualClock): with real time, on a loaded machine the two callbacks' means
    drifted apart by scheduling between their hooks (+2.9% against a 5% tolerance). Timed there, each section holds
    exactly the cost EverySection puts in it, and the sections add up to IterationTimer's iteration, which is the sum
    of the costs."""
    clock = use_virtual_clock(monkeypatch)
    fit(tmp_path, [IterationTimer(warmup_steps=2), profiler()], model=EverySection(clock, ema=0.02), max_epochs=1)
    s = find_summary(tmp_path)
    table = s["section_profiler"]["sections"]
    top = [r for r in table.values() if r["kind"] == "auto" or r["parent"] in AUTO]
    total_ms = 1000.0 * sum(r["total_s"] for r in top)
    per_iter = total_ms / s["section_profiler"]["iterations"]
    assert s["section_profiler"]["iterations"] == s["iteration_timer"]["measured_iterations"] == 6
    for name, cost in EverySection.COSTS.items():
        assert table[name]["mean_ms"] == pytest.approx(1000.0 * cost, rel=1e-6), name
    assert table["ema"]["mean_ms"] == pytest.approx(20.0, rel=1e-6)
    expected_ms = 1000.0 * (sum(EverySection.COSTS.values()) + 0.02)
    assert per_iter == pytest.approx(expected_ms, rel=1e-6)
    assert s["iteration_timer"]["ms_per_iter"]["mean"] == pytest.approx(expected_ms, rel=1e-6)
    assert sum(r["share_pct"] for r in top) == pytest.approx(100.0, abs=0.5)


def test_a_20ms_user_section_shows_its_time_parent_and_share(tmp_path, monkeypatch):
    """On the virtual clock (helpers.VirtualClock): on a loaded machine a TinyModel's backward took longer than the
    20 ms, and "ema" was not the slowest section. Timed there, the sections hold exactly what the model spends."""
    monkeypatch.setattr(EmaModel, "pace", staticmethod(use_virtual_clock(monkeypatch).advance))
    fit(tmp_path, [profiler()], model=EmaModel(), max_epochs=1)
    sp = find_summary(tmp_path)["section_profiler"]
    ema = sp["sections"]["ema"]
    assert ema["kind"] == "user" and ema["parent"] == "forward" and ema["count"] == 6
    assert ema["mean_ms"] == pytest.approx(20.0, rel=1e-6) and ema["p50_ms"] == pytest.approx(20.0, rel=0.01)
    iteration_total_ms = sp["iteration_ms"]["mean"] * sp["iterations"]
    assert ema["share_pct"] == pytest.approx(100.0 * ema["total_s"] * 1000.0 / iteration_total_ms, rel=1e-6)
    assert sp["slowest_section"] == "ema"
    # forward is the rest of training_step: the 20 ms were carved out of it
    assert sp["sections"]["forward"]["mean_ms"] < ema["mean_ms"]


class SlowDataset(Dataset):
    def __init__(self):
        self.x = torch.randn(64, 16)

    def __len__(self):
        return 64

    #: How an item's 2 ms are spent: ``time.sleep``, or a virtual clock's ``advance``.
    pace = staticmethod(time.sleep)

    def __getitem__(self, i):
        SlowDataset.pace(0.002)
        return self.x[i], self.x[i].sum(dim=0, keepdim=True)


class SlowDataModel(TinyModel):
    def train_dataloader(self):
        return DataLoader(SlowDataset(), batch_size=8)


def test_a_sleeping_dataloader_is_the_top_section_with_advice(tmp_path, monkeypatch):
    """On the virtual clock, like the test above: the 16 ms of a batch are the only time there is."""
    monkeypatch.setattr(SlowDataset, "pace", staticmethod(use_virtual_clock(monkeypatch).advance))
    fit(tmp_path, [profiler()], model=SlowDataModel(), max_epochs=1)
    sp = find_summary(tmp_path)["section_profiler"]
    assert sp["slowest_section"] == "data_loading"
    assert sp["sections"]["data_loading"]["mean_ms"] == pytest.approx(16.0, rel=0.01)  # 8 samples x 2 ms
    assert sp["sections"]["data_loading"]["share_pct"] > 15.0
    assert any("Data loading takes" in i and "num_workers" in i for i in sp["insights"])


def test_gradient_accumulation_keeps_sections_per_batch(tmp_path):
    fit(tmp_path, [IterationTimer(warmup_steps=1), profiler(warmup_steps=1)], max_epochs=2,
        accumulate_grad_batches=2)
    s = find_summary(tmp_path)
    sp = s["section_profiler"]
    assert sp["iterations"] == 7  # 8 optimizer steps, 1 warm-up
    # automatic sections are per-iteration totals: the two micro-batches' forwards make one iteration's forward
    assert sp["sections"]["forward"]["count"] == sp["sections"]["backward"]["count"] == sp["iterations"]
    assert sp["iteration_ms"]["mean"] == pytest.approx(
        1000.0 * sum(r["total_s"] for r in sp["sections"].values()) / sp["iterations"], rel=1e-6)


def test_manual_optimization_reports_training_step_and_says_why(tmp_path):
    fit(tmp_path, [profiler()], model=ManualModel(), max_epochs=1)
    sp = find_summary(tmp_path)["section_profiler"]
    assert sp["manual_optimization"] is True
    assert sp["sections"]["training_step"]["count"] == 6
    assert "forward" not in sp["sections"] and "manual optimization" in sp["unavailable"]["forward"]


def test_checkpoint_saves_are_their_own_section(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    fit(tmp_path, [profiler(), ckpt], max_epochs=1)
    sp = find_summary(tmp_path)["section_profiler"]
    assert sp["sections"]["checkpointing"]["count"] >= 3
    assert sp["sections"]["checkpointing"]["total_s"] > 0


class SlowWriterIO(TorchCheckpointIO):
    """A user's CheckpointIO plugin with its own clock (``clock``, the suite's virtual one in the test): every write
    takes 30 ms on it."""

    def __init__(self, clock):
        self.writes, self.clock = [], clock

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        start = self.clock()
        self.clock.advance(0.03)
        super().save_checkpoint(checkpoint, path, storage_options)
        self.writes.append(self.clock() - start)


def test_checkpoint_writes_match_the_writers_own_clock_and_the_plugin_is_given_back(tmp_path, monkeypatch):
    """Timed around the strategy's CheckpointIO (a public plugin), the user's own plugin still does the writing. On
    the virtual clock (helpers.VirtualClock), which the writer advances and reads: with real time a preemption
    between its reads and the section's could take the total out of a 5% tolerance."""
    io = SlowWriterIO(use_virtual_clock(monkeypatch))
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    trainer = fit(tmp_path, [profiler(warmup_steps=0), ckpt], max_epochs=1, plugins=[io])
    sp = find_summary(tmp_path)["section_profiler"]
    # saves at steps 2, 4, 6, 8, each in the batch-end work of its iteration: the last one too
    assert len(io.writes) == 4 and len(list((tmp_path / "ckpt").glob("*.ckpt"))) == 4
    row = sp["sections"]["checkpointing"]
    assert io.writes == pytest.approx([0.03] * 4, rel=1e-9)
    assert row["count"] == 4 and row["total_s"] == pytest.approx(sum(io.writes), rel=1e-9)
    assert "checkpointing" not in sp["after_last_iteration"]["sections"]
    assert "checkpointing" not in sp["unavailable"]
    assert trainer.strategy.checkpoint_io is io


def test_a_strategy_that_writes_its_own_way_keeps_saves_in_place_and_says_why(tmp_path):
    from lightning.pytorch.strategies import SingleDeviceStrategy

    class OwnWriter(SingleDeviceStrategy):
        def save_checkpoint(self, checkpoint, filepath, storage_options=None):
            os.makedirs(os.path.dirname(filepath), exist_ok=True)
            torch.save(checkpoint, filepath)

    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2, save_top_k=-1)
    fit(tmp_path, [profiler(), ckpt], max_epochs=1, strategy=OwnWriter(device="cpu"))
    sp = find_summary(tmp_path)["section_profiler"]
    assert "OwnWriter writes checkpoints its own way" in sp["unavailable"]["checkpointing"]
    assert sp["sections"]["checkpointing"]["count"] == 0


def test_validation_is_timed_outside_the_table(tmp_path):
    fit(tmp_path, [profiler()], max_epochs=2, val_check_interval=4)
    sp = find_summary(tmp_path)["section_profiler"]
    assert sp["validation"]["runs"] == 4 and sp["validation"]["total_s"] > 0


class SectionInValidation(TinyModel):
    def validation_step(self, batch, batch_idx):
        with profile_section("val_sampling"):
            time.sleep(0.003)
        return super().validation_step(batch, batch_idx)


class TrainingWall(Callback):
    """Our own clock: the training's wall time less its validations' (the sanity check is before the start)."""

    def __init__(self):
        self.start = self.end = self.validation = 0.0
        self.val_start = None

    def on_train_start(self, trainer, pl_module):
        self.start = time.perf_counter()

    def on_validation_start(self, trainer, pl_module):
        self.val_start = time.perf_counter()

    def on_validation_end(self, trainer, pl_module):
        if self.start:
            self.validation += time.perf_counter() - self.val_start

    def on_train_end(self, trainer, pl_module):
        self.end = time.perf_counter()


def test_a_section_in_validation_or_the_sanity_check_is_the_validations_not_an_iterations(tmp_path):
    """A profile_section in validation_step (the sanity check's too, before the first iteration) ran in no training
    section: it is validation time, in no iteration, so the iterations add up to no more than the training's wall
    time less its validations (3 ms a validation batch, 4 batches a validation, 4 validations and the sanity check's
    one batch would be ~51 ms over)."""
    wall = TrainingWall()
    fit(tmp_path, [profiler(), wall], model=SectionInValidation(), max_epochs=2, val_check_interval=4)
    sp = find_summary(tmp_path)["section_profiler"]
    assert sp["validation"]["runs"] == 4 and sp["validation"]["total_s"] >= 4 * 4 * 0.003
    assert "val_sampling" not in sp["sections"] and "val_sampling" not in sp["after_last_iteration"]["sections"]
    assert not any("val_sampling" in it["sections_ms"] for it in sp["slowest_iterations"])
    iterations_s = sp["iterations"] * sp["iteration_ms"]["mean"] / 1000.0
    assert iterations_s <= wall.end - wall.start - wall.validation


def test_periodic_reports_are_logged_and_printed(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO):
        fit(tmp_path, [SectionProfiler(warmup_steps=0, report_every_n_steps=4)], model=EmaModel(), max_epochs=1)
    scalars = read_scalars(tmp_path)
    for key in ("time/forward_ms", "time_share/forward_pct", "time/data_loading_ms", "time_share/data_loading_pct",
                "time/ema_ms", "time_share/ema_pct", "time/iteration_ms"):
        assert len(scalars[key]) == 2, key
    assert "=== SectionProfiler report (iteration 4, last 4 iterations" in caplog.text
    assert "=== SectionProfiler:" in caplog.text and "Insights:" in caplog.text


def test_window_figures_add_up_to_the_run_totals_while_histograms_take_raw_times_later(tmp_path, monkeypatch):
    """A report's figures come from the raw times (sums, not the histogram), which reach the histograms only once
    HISTOGRAM_EVERY wait: the logged window means, times the iterations of each window, add up to the summary's
    totals (the histograms' exact sums), section by section and for whole iterations."""
    from lightning_perf.measure.sections import ledger as module

    monkeypatch.setattr(module, "FOLD_EVERY", 3)
    monkeypatch.setattr(sections_module, "HISTOGRAM_EVERY", 7)
    every = 4
    fit(tmp_path, [profiler(warmup_steps=0, report_every_n_steps=every)], model=EmaModel(), max_epochs=2)
    s = find_summary(tmp_path)["section_profiler"]
    scalars = read_scalars(tmp_path)
    windows = len(scalars["time/iteration_ms"])
    assert windows >= 3 and s["iterations"] == windows * every  # every iteration is in one logged window
    logged_s = sum(v for _, v in scalars["time/iteration_ms"]) * every / 1000.0
    assert logged_s == pytest.approx(s["iteration_ms"]["mean"] * s["iterations"] / 1000.0, rel=1e-5)
    for name in ("forward", "backward", "optimizer_step", "data_loading", "ema"):
        logged = sum(v for _, v in scalars[f"time/{name}_ms"]) * every / 1000.0
        assert logged == pytest.approx(s["sections"][name]["total_s"], rel=1e-5), name


def test_the_periodic_table_is_not_built_where_lightnings_info_logging_is_off(tmp_path, monkeypatch):
    import logging

    from lightning_utilities.core import rank_zero

    from lightning_perf.callbacks.core import printer as _printer
    from lightning_perf.callbacks.section_profiler import callback as section_profiler

    printed = []
    for module in (section_profiler, _printer):  # the final table; the periodic ones, on the printer's thread
        monkeypatch.setattr(module, "rank_zero_info", lambda text, *a, **k: printed.append(text))
    lightning_log = rank_zero.log  # the logger rank_zero_info writes to (Lightning's, under lightning.pytorch)
    level = lightning_log.level
    try:
        for info, reports in ((False, 0), (True, 2)):
            lightning_log.setLevel(logging.INFO if info else logging.ERROR)
            printed.clear()
            fit(tmp_path / str(info), [SectionProfiler(warmup_steps=0, report_every_n_steps=4)], model=EmaModel(),
                max_epochs=1)
            assert sum("SectionProfiler report" in text for text in printed) == reports
            assert len(read_scalars(tmp_path / str(info))["time/ema_ms"]) == 2  # logged either way
    finally:
        lightning_log.setLevel(level)


def test_nested_sections_decorator_and_exceptions(tmp_path):
    @profile_section("sampling")
    def sample():
        with profile_section("decode"):
            time.sleep(0.001)

    class Sampler(TinyModel):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            sample()
            try:
                with profile_section("flaky"):
                    raise KeyError("x")
            except KeyError:
                pass

    fit(tmp_path, [profiler()], model=Sampler(), max_epochs=1)
    table = find_summary(tmp_path)["section_profiler"]["sections"]
    # a batch-end hook runs in the loop's work between two batches (the fetch alone is data loading)
    assert table["sampling"]["parent"] == "between_batches" and table["decode"]["parent"] == "sampling"
    assert table["decode"]["count"] == 6 and table["sampling"]["mean_ms"] >= table["decode"]["mean_ms"]
    assert table["flaky"]["closed_by_exception"] == 6
    assert sections_module._frames() == []  # nothing left open


def test_the_printed_table_lists_each_user_section_under_the_section_it_ran_in(tmp_path):
    """A user section's row follows its parent's row (the sections inside it by total, indented a step per level),
    whatever the totals: ``denoise`` runs in forward, whose total is below backward's, and its ``decode`` inside it."""

    class Nested(TinyModel):
        def training_step(self, batch, batch_idx):
            with profile_section("denoise"):
                with profile_section("decode"):
                    pass
            return super().training_step(batch, batch_idx)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            with profile_section("ema"):
                pass

    sp = profiler()
    fit(tmp_path, [sp], model=Nested(), max_epochs=1)
    table = sp.table()
    assert (table["denoise"]["parent"], table["decode"]["parent"], table["ema"]["parent"]) == (
        "forward", "denoise", "between_batches")
    rows = [re.match(r"^( *\S.*?)\s{2,}\d+\s", line) for line in sp.format_report().splitlines()[2:]]
    labels = [row.group(1) for row in rows if row]
    assert len(labels) == len([r for r in table.values() if r["count"]]), labels
    assert ("  denoise (in forward)" in labels and "    decode (in denoise)" in labels
            and "  ema (in between_batches)" in labels)
    for child, parent in (("  denoise (in forward)", "forward"), ("    decode (in denoise)", "  denoise (in forward)"),
                          ("  ema (in between_batches)", "between_batches")):
        assert labels.index(child) == labels.index(parent) + 1, labels
    top = [label for label in labels if not label.startswith(" ")]  # the top level, by total
    totals = [table[label]["total_s"] for label in top]
    assert totals == sorted(totals, reverse=True), labels


def test_the_printed_rows_keep_sections_whose_parents_are_missing_or_in_a_loop():
    """A hand-edited checkpoint may name a parent with no row, or two user sections each other's parent: every row
    is still printed once, those at the top level."""
    from lightning_perf.measure.sections.report import printed_rows

    def row(kind, parent, total):
        return {"kind": kind, "parent": parent, "count": 1, "total_s": total}

    table = {"forward": row("auto", None, 3.0), "a": row("user", "b", 2.0), "b": row("user", "a", 1.0),
             "orphan": row("user", "gone", 0.5), "kid": row("user", "forward", 0.2), "idle": dict(row("auto", None,
                                                                                                      0.0), count=0)}
    labels = [label for label, _ in printed_rows(table)]
    assert labels == ["forward", "  kid (in forward)", "orphan (in gone)", "a (in b)", "  b (in a)"], labels


def test_profile_section_without_a_profiler_does_nothing():
    assert sections_module.current_sink() is None
    with profile_section("idle"):
        pass


@pytest.mark.parametrize("bad", ["", "   ", None, 3])
def test_bad_section_names_fail_at_the_call(bad):
    with pytest.raises(ValueError, match="profile_section\\(name="):
        profile_section(bad)


@pytest.mark.parametrize("env, enabled, expected", [("0", True, False), ("1", False, True), (None, False, False)])
def test_environment_switch_overrides_enabled(tmp_path, monkeypatch, env, enabled, expected):
    if env is None:
        monkeypatch.delenv("LIGHTNING_PERF_PROFILE", raising=False)
    else:
        monkeypatch.setenv("LIGHTNING_PERF_PROFILE", env)
    fit(tmp_path, [profiler(enabled=enabled)], max_epochs=1)
    sp = find_summary(tmp_path)["section_profiler"]
    assert sp["enabled"] is expected
    assert (sp["iterations"] > 0) is expected


def test_trainer_methods_are_restored_after_fit(tmp_path):
    from helpers import trainer_kwargs
    from lightning.pytorch import Trainer

    trainer = Trainer(callbacks=[profiler()], **trainer_kwargs(tmp_path, max_epochs=1))
    trainer.fit(TinyModel())
    assert "save_checkpoint" not in trainer.__dict__ and "start" not in trainer.profiler.__dict__
    assert type(trainer.strategy.checkpoint_io).__name__ == "TorchCheckpointIO"
    assert sections_module.current_sink() is None


@pytest.mark.parametrize(
    "kwargs, match",
    [({"report_every_n_steps": 0}, r"SectionProfiler\(report_every_n_steps=0\)"),
     ({"warmup_steps": -2}, r"SectionProfiler\(warmup_steps=-2\)"),
     ({"data_loading_boundary": "gap"},
      r"SectionProfiler\(data_loading_boundary='gap'\)`. Expected one of 'fetch', 'batch_gap'")],
)
def test_bad_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SectionProfiler(**kwargs)


@pytest.mark.gpu
def test_cuda_sections_have_device_time(tmp_path):
    fit(tmp_path, [profiler()], model=EmaModel(), accelerator="gpu", max_epochs=1)
    table = find_summary(tmp_path)["section_profiler"]["sections"]
    assert table["forward"]["device_mean_ms"] is not None and table["forward"]["device_mean_ms"] > 0
    assert table["ema"]["device_mean_ms"] is not None


def _row(mean_ms, count=10, share=None, device_ms=None, kind="auto", parent=None):
    return {"kind": kind, "parent": parent, "count": count, "total_s": mean_ms * count / 1000.0, "mean_ms": mean_ms,
            "min_ms": mean_ms, "max_ms": mean_ms, "p50_ms": mean_ms, "p95_ms": mean_ms, "share_pct": share,
            "device_mean_ms": device_ms, "closed_by_exception": 0, "inclusive_total_s": mean_ms * count / 1000.0,
            "inclusive_mean_ms": mean_ms, "inclusive_share_pct": share}


@pytest.mark.parametrize("device_ms, fires", [(2.0, True), (9.0, False)])
def test_host_bound_insight_fires_when_the_gpu_waits_for_python(device_ms, fires):
    """Host time of forward+backward+optimizer 3x their CUDA-event time: the GPU waits for Python."""
    table = {"forward": _row(10.0, share=40.0, device_ms=device_ms), "backward": _row(12.0, share=45.0,
             device_ms=device_ms), "optimizer_step": _row(3.0, share=10.0, device_ms=device_ms / 2),
             "data_loading": _row(1.0, share=5.0)}
    insights = SectionProfiler().insights(table)
    assert any(i.startswith("Host time is") for i in insights) is fires, insights


@pytest.mark.parametrize("rule, table, prefix", [
    ("data", {"data_loading": _row(5.0, share=30.0), "forward": _row(5.0, share=30.0)}, "Data loading takes"),
    ("optimizer", {"optimizer_step": _row(5.0, share=25.0), "forward": _row(5.0, share=30.0)}, "The optimizer step"),
    ("checkpoint", {"checkpointing": _row(5.0, share=12.0), "forward": _row(5.0, share=30.0)}, "Checkpointing takes"),
    ("forward", {"forward": _row(5.0, share=70.0)}, "The forward pass takes"),
])
def test_every_share_rule_fires_above_its_threshold_and_not_below(rule, table, prefix):
    assert any(i.startswith(prefix) for i in SectionProfiler().insights(table))
    calm = {name: _row(r["mean_ms"], share=5.0) for name, r in table.items()}
    assert not any(i.startswith(prefix) for i in SectionProfiler().insights(calm))


def test_periodic_report_is_a_table_with_min_and_max_since_the_last_report(tmp_path, caplog):
    with caplog.at_level("INFO"):
        fit(tmp_path, [SectionProfiler(report_every_n_steps=4, warmup_steps=0)], model=EmaModel(), max_epochs=1)
    reports = [r.getMessage() for r in caplog.records if "SectionProfiler report" in r.getMessage()]
    assert len(reports) == 2  # 8 iterations, a report every 4
    lines = reports[0].splitlines()
    assert lines[1].split() == ["section", "count", "total", "s", "mean", "ms", "min", "ms", "max", "ms", "share"]
    ema = next(line.split()[-6:] for line in lines if line.lstrip().startswith("ema "))  # nested: "  ema (in ...)"
    count, total, mean, low, high = int(ema[0]), *map(float, ema[1:5])
    assert count == 4 and low >= 20.0 and low <= mean <= high and total == pytest.approx(count * mean / 1000, rel=0.01)
    final = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("=== SectionProfiler:"))
    assert "min ms" in final and "max ms" in final
    s = find_summary(tmp_path)["section_profiler"]
    assert "single device" in s["unavailable"]["synchronization"]  # (one CPU device: no DDP to speak of)






def test_device_time_per_section_is_per_iteration_like_host_time(tmp_path, monkeypatch):
    """Every section timed on the device, over two epochs with a validation after each: its device mean is its host
    mean, the cost EverySection put in. On the virtual clock (helpers.VirtualClock), where HostEvent reads the
    same clock, so device time equals host time exactly: with real time, on a loaded machine the two reads of a
    boundary were far enough apart to take a section out of a 15% tolerance."""
    clock = use_virtual_clock(monkeypatch)
    sp = profiler(warmup_steps=2, device_timing_every_n_iterations=1)
    # no checkpoint saves: a device interval spans a whole piece, carved-out host time (a save) included
    fit(tmp_path, [sp, SimulatedDevice(sp)], model=EverySection(clock), max_epochs=2, enable_checkpointing=False)
    table = find_summary(tmp_path)["section_profiler"]["sections"]
    for name, cost in EverySection.COSTS.items():
        host, device = table[name]["mean_ms"], table[name]["device_mean_ms"]
        # optimizer_step (zero_grad, then the step) is entered twice per iteration: per piece it would come out at
        # 1.0 and 1.7 ms, not 2.7
        assert host == pytest.approx(1000.0 * cost, rel=1e-6) and device == pytest.approx(host, rel=1e-6), (
            name, host, device)
        assert sp._ledger.sections[name].device.count == sp._ledger.sections[name].host.count == 14, name


@pytest.mark.parametrize("boundary", ["fetch", "batch_gap"])
def test_a_slow_report_lands_in_no_section_on_the_host_or_the_device(tmp_path, monkeypatch, boundary):
    """Every third iteration the window report costs 50 ms (a slow logger or terminal). It is lightning_perf's own
    work: it may lie between batches, never in transfer, forward or any other timed section, on the host or on the
    device, where it would stand between the transfer's start event and the copy (the copy then reads its cost plus
    the report's, as a CUDA event pair times it). On the virtual clock with HostEvent: each section's host and device
    mean is still the cost EverySection put in."""
    clock = use_virtual_clock(monkeypatch)
    original = SectionProfiler._report_window

    def slow_report(self, trainer):
        clock.advance(0.05)
        original(self, trainer)

    monkeypatch.setattr(SectionProfiler, "_report_window", slow_report)
    sp = profiler(warmup_steps=2, device_timing_every_n_iterations=1, report_every_n_steps=3,
                  data_loading_boundary=boundary)
    fit(tmp_path, [sp, SimulatedDevice(sp)], model=EverySection(clock), max_epochs=2, enable_checkpointing=False)
    table = find_summary(tmp_path)["section_profiler"]["sections"]
    for name in ("transfer", "forward", "backward", "optimizer_step"):
        host, device = table[name]["mean_ms"], table[name]["device_mean_ms"]
        assert host == pytest.approx(1000.0 * EverySection.COSTS[name], rel=1e-6), (name, host)
        assert device == pytest.approx(host, rel=1e-6), (name, host, device)


class _RecordCounter:
    records = 0


class _CountedHostEvent(HostEvent):
    def record(self, *args):
        _RecordCounter.records += 1
        return super().record(*args)


class _SimulatedCountingDevice(SimulatedDevice):
    event = _CountedHostEvent


def test_device_time_taken_in_one_iteration_of_four_matches_host_time_with_fewer_events(tmp_path, monkeypatch):
    """Sampled device timing over 32 iterations (4 epochs of 8) after a warm-up of 2: the first 4 counted
    iterations (2-5), then one in 4 (6, 10, ..., 30) are timed on the device; the device means of a 3 ms forward and
    a 2 ms user section equal their host means (the other sections, a fraction of a ms each, are compared iteration
    by iteration in the test above), with about a third of the event records of timing every iteration. On the
    virtual clock (helpers.VirtualClock): on a loaded machine the 11 sampled iterations and all 30 differ by more
    than scheduling noise allows (a 14.2 against an 11.1 ms mean)."""
    clock = use_virtual_clock(monkeypatch)

    class Steady(TinyModel):
        def training_step(self, batch, batch_idx):
            clock.advance(0.003)
            with profile_section("ema"):
                clock.advance(0.002)
            return super().training_step(batch, batch_idx)

    _RecordCounter.records = 0
    every = profiler(warmup_steps=2, device_timing_every_n_iterations=1)
    fit(tmp_path / "every", [every, _SimulatedCountingDevice(every)], model=Steady(), max_epochs=4,
        enable_checkpointing=False)
    records_every, _RecordCounter.records = _RecordCounter.records, 0
    sp = profiler(warmup_steps=2, device_timing_every_n_iterations=4)
    fit(tmp_path / "fourth", [sp, _SimulatedCountingDevice(sp)], model=Steady(), max_epochs=4,
        enable_checkpointing=False)
    s = find_summary(tmp_path / "fourth")["section_profiler"]
    assert s["device_timing_every_n_iterations"] == 4
    assert sp._ledger.sections["forward"].device.count == 4 + 7 and every._ledger.sections["forward"].device.count == 30
    assert sp._ledger.sections["forward"].host.count == 30
    # forward's device interval holds the user section it ran (the host side carves it out): add it back
    forward, ema = s["sections"]["forward"], s["sections"]["ema"]
    assert forward["device_mean_ms"] == pytest.approx(forward["inclusive_mean_ms"], rel=0.2)
    assert ema["device_mean_ms"] == pytest.approx(ema["mean_ms"], rel=0.2)
    assert _RecordCounter.records < 0.5 * records_every, (_RecordCounter.records, records_every)


def test_a_short_run_still_gets_device_times(tmp_path):
    """8 iterations, warm-up 2, one in 32 timed later on: the first 6 counted iterations are all timed."""
    sp = profiler(warmup_steps=2)
    fit(tmp_path, [sp, _SimulatedCountingDevice(sp)], max_epochs=1, enable_checkpointing=False)
    assert sp._ledger.sections["forward"].device.count == 6
    assert find_summary(tmp_path)["section_profiler"]["sections"]["forward"]["device_mean_ms"] > 0


def test_device_timing_every_n_iterations_is_checked():
    with pytest.raises(ValueError, match="device_timing_every_n_iterations"):
        SectionProfiler(device_timing_every_n_iterations=0)


@pytest.mark.parametrize("warmup", [0, 3])
def test_profiler_and_timer_leave_out_the_same_iterations(tmp_path, warmup):
    """Over epoch boundaries and validations: only the warm-up is left out by both, and warmup_steps=0 is none."""
    fit(tmp_path, [IterationTimer(warmup_steps=warmup), profiler(warmup_steps=warmup)], max_epochs=2,
        val_check_interval=4)
    s = find_summary(tmp_path)
    assert s["section_profiler"]["iterations"] == s["iteration_timer"]["measured_iterations"] == 16 - warmup


def test_without_lightnings_fetch_announcement_data_loading_falls_back_loudly(tmp_path, monkeypatch):
    """The fetch is found through the marks Lightning's training loop makes for its profiler (private names); if a
    release renames them, the profiler says so and times data loading as the gap between batches instead of silently
    putting it in `between_batches`. On the virtual
    clock (helpers.VirtualClock), where the 8 items of a batch cost 2 ms each and nothing else costs anything: with
    real time, on a loaded machine, the sections and IterationTimer's mean drifted apart by scheduling alone; here
    the counted iterations (after the fallback) hold exactly the 16 ms of their fetch, all of it in data_loading."""
    from lightning_perf.callbacks.section_profiler import callback as module

    monkeypatch.setattr(SlowDataset, "pace", staticmethod(use_virtual_clock(monkeypatch).advance))
    monkeypatch.setattr(module, "_FETCH_MARKS", ("_on_before_fetch_renamed", "_on_after_fetch_renamed"))
    with pytest.warns(UserWarning, match="announced no dataloader fetch"):
        fit(tmp_path, [IterationTimer(warmup_steps=3), profiler(warmup_steps=3, data_loading_boundary="fetch")],
            model=SlowDataModel(), max_epochs=1)
    s = find_summary(tmp_path)
    sp = s["section_profiler"]
    assert sp["data_loading_boundary"] == "batch_gap" and "data_loading_fetch" in sp["unavailable"]
    assert sp["sections"]["data_loading"]["mean_ms"] == pytest.approx(16.0, rel=1e-6)  # 8 samples x 2 ms
    assert sp["sections"]["other"]["total_s"] == pytest.approx(0.0, abs=1e-9)
    top = [r for r in sp["sections"].values() if r["kind"] == "auto" or r["parent"] in AUTO]
    per_iter = 1000.0 * sum(r["total_s"] for r in top) / sp["iterations"]
    assert per_iter == pytest.approx(16.0, rel=1e-6)
    assert s["iteration_timer"]["ms_per_iter"]["mean"] == pytest.approx(16.0, rel=1e-6)


def test_with_the_announcement_the_boundary_is_the_fetch(tmp_path):
    fit(tmp_path, [profiler(data_loading_boundary="fetch")], max_epochs=1)
    sp = find_summary(tmp_path)["section_profiler"]
    assert sp["data_loading_boundary"] == "fetch" and "data_loading_fetch" not in sp["unavailable"]


def test_the_fetch_marks_see_every_fetch_and_nothing_else_and_the_loop_gets_its_own_back(tmp_path):
    """The profiler puts its marks in front of those Lightning's training loop makes for its profiler where a fetch
    starts and returns: over two epochs with a validation between, they see every training fetch the trainer's
    profiler was told of (and so that profiler still is), no other action, and the loop and the profiler are given
    back as they were."""
    from lightning.pytorch.profilers import PassThroughProfiler

    from lightning_perf.callbacks.section_profiler import callback as module

    seen, started = [], []
    real = module.SectionProfiler._fetch_started

    def counting(self):
        seen.append(self._fetches.started)
        return real(self)

    class Counting(PassThroughProfiler):
        def start(self, action_name):
            started.append(action_name)

    sp = profiler(warmup_steps=1)
    module.SectionProfiler._fetch_started = counting
    try:
        trainer = fit(tmp_path, [sp], max_epochs=2, val_check_interval=4, profiler=Counting())
    finally:
        module.SectionProfiler._fetch_started = real
    fetches = [a for a in started if a.endswith("].train_dataloader_next")]
    assert len(fetches) == 16 and len(seen) == sp._fetches.started == sp._fetches.returned == 16  # (8 batches an epoch)
    assert not {"_on_before_fetch", "_on_after_fetch"} & set(vars(trainer.fit_loop.epoch_loop))
    assert not {"start", "stop"} & set(vars(trainer.profiler))


class TimedFetchDataset(SlowDataset):
    """Its own clock (``clock``) around every item: the time the dataloader really spends fetching."""

    spent = []
    clock = staticmethod(time.perf_counter)

    def __getitem__(self, i):
        start = self.clock()
        try:
            return super().__getitem__(i)
        finally:
            self.spent.append(self.clock() - start)


class TimedFetchModel(TinyModel):
    def train_dataloader(self):
        return DataLoader(TimedFetchDataset(), batch_size=8)


class NoPrivateNames(Callback):
    """Fails the fit if the profiler replaced anything of the trainer or its profiler during the fit."""

    seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(("start" in trainer.profiler.__dict__, "save_checkpoint" in trainer.__dict__))


def test_batch_gap_times_the_gap_between_batches_through_public_hooks(tmp_path, monkeypatch):
    """``data_loading_boundary="batch_gap"`` (the default until the fetch became it): no Lightning action name, no
    method of the trainer or its profiler replaced; the gap matches the dataset's own
    clock (the fetch of 8 items of 2 ms each). On the virtual clock (helpers.VirtualClock), which the dataset
    advances and reads (the loader has no workers: it fetches in this process): with real time a 12% allowance for
    the loop's bookkeeping was not enough on a loaded machine. Here the gap is exactly what the fetches spent: one
    fetch left out of data_loading (an epoch's first) would be 16 ms short; the training step's 1 ms and the epoch
    end's 5 ms, also on the clock, stay out of it (forward and other)."""
    clock = use_virtual_clock(monkeypatch)
    monkeypatch.setattr(SlowDataset, "pace", staticmethod(clock.advance))
    monkeypatch.setattr(TimedFetchDataset, "clock", staticmethod(clock))
    TimedFetchDataset.spent, NoPrivateNames.seen = [], []

    class Paced(TimedFetchModel):
        def training_step(self, batch, batch_idx):
            clock.advance(0.001)
            return super().training_step(batch, batch_idx)

        def on_train_epoch_end(self):
            clock.advance(0.005)

    fit(tmp_path, [profiler(warmup_steps=0, data_loading_boundary="batch_gap"), NoPrivateNames()], model=Paced(),
        max_epochs=2)
    sp = find_summary(tmp_path)["section_profiler"]
    assert sp["sections"]["forward"]["total_s"] == pytest.approx(16 * 0.001, rel=1e-6)
    assert sp["data_loading_boundary"] == "batch_gap" and "data_loading_fetch" not in sp["unavailable"]
    assert NoPrivateNames.seen and not any(a or b for a, b in NoPrivateNames.seen)
    # every fetch of both epochs is inside data_loading (with collation, the loop's bookkeeping, iterator starts)
    fetched = sum(TimedFetchDataset.spent)
    data = sp["sections"]["data_loading"]
    assert len(TimedFetchDataset.spent) == 128 and data["count"] == 16
    assert fetched == pytest.approx(128 * 0.002, rel=1e-6) and data["total_s"] == pytest.approx(fetched, rel=1e-6)


def test_a_sink_that_fails_to_start_a_section_never_reaches_the_users_code():
    """profile_section's start and end both swallow a measurement failure (a CUDA event that cannot be made)."""
    from lightning_perf.measure.sections import user_sections as sections

    class Failing:
        ended = []

        def section_started(self, name):
            raise RuntimeError("no CUDA event today")

        def section_ended(self, name, parent, seconds, token, failed):
            self.ended.append((name, token))

    previous = sections.set_sink(Failing())
    try:
        with profile_section("ema"):
            ran = True
    finally:
        sections.set_sink(previous)
    assert ran and Failing.ended == [("ema", None)]


def test_the_step_path_keeps_bounded_memory_between_reports(tmp_path, monkeypatch):
    """Per-iteration pieces wait for at most FOLD_EVERY iterations and each section's raw times for fewer than its
    limit (HISTOGRAM_EVERY plus an eighth of it per phase), however far apart the reports are; the sections' batches
    into their histograms fall on different folds (all at one fold made one slow iteration); the figures are those
    of one value each. On the virtual clock (helpers.VirtualClock), where EverySection puts a known cost in each
    section: the memory needs no real time, and with real time the profiler's and IterationTimer's means came within
    a hair of a 5% tolerance on a loaded machine (+2.9%); here both are exactly the costs put in."""
    from lightning_perf.measure.sections import ledger as module

    clock = use_virtual_clock(monkeypatch)
    monkeypatch.setattr(module, "FOLD_EVERY", 4)
    monkeypatch.setattr(sections_module, "HISTOGRAM_EVERY", 8)
    sp = profiler(warmup_steps=0, report_every_n_steps=10**6)
    unfolded, raw, counts = [], [], []

    class Watch(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            unfolded.append(len(sp._ledger.unfolded))
            raw.append(max(len(s.raw) for s in [sp._ledger.iteration, *sp._ledger.sections.values()]))
            counts.append({name: s.host.count for name, s in [("iteration", sp._ledger.iteration),
                                                              *sp._ledger.sections.items()]})

    # no checkpoint: its state_dict puts every raw time into the histograms
    fit(tmp_path, [sp, Watch(), IterationTimer(warmup_steps=0)], model=EverySection(clock), max_epochs=3,
        enable_checkpointing=False)
    assert max(unfolded) == 3  # folded into raw times at every 4th
    # limits 8 (whole iterations) to 14 (the sixth section): raw times go in at the first fold (every 4th
    # iteration) where they reach it, so at most 12 wait. Eight phases: the ninth made (checkpointing, last of the
    # automatic sections and not run here) shares the iterations' limit; every section that ran has its own
    limits = {name: s.limit for name, s in [("iteration", sp._ledger.iteration), *sp._ledger.sections.items()]}
    assert sorted(limits.values()) == sorted(8 + phase % 8 for phase in range(len(counts[-1])))
    ran = [limit for name, limit in limits.items() if name != "checkpointing"]
    assert len(set(ran)) == len(ran) and limits["checkpointing"] == limits["iteration"] == 8
    assert max(raw) == 12
    batches = {}  # the iteration at whose start a histogram had taken a batch: which ones did
    for i in range(1, len(counts)):
        for name, count in counts[i].items():
            if count != counts[i - 1].get(name, 0):
                batches.setdefault(i, set()).add(name)
    assert len(batches) >= 3 and max(len(names) for names in batches.values()) < len(counts[-1]), batches
    s = find_summary(tmp_path)
    assert s["section_profiler"]["iterations"] == 24
    # the figures, after all those folds and batches, are still the costs put in (the virtual clock's)
    for name, cost in EverySection.COSTS.items():
        assert s["section_profiler"]["sections"][name]["mean_ms"] == pytest.approx(1000.0 * cost, rel=1e-6), name
    expected_ms = 1000.0 * sum(EverySection.COSTS.values())
    assert s["section_profiler"]["iteration_ms"]["mean"] == pytest.approx(expected_ms, rel=1e-6)
    assert s["iteration_timer"]["ms_per_iter"]["mean"] == pytest.approx(expected_ms, rel=1e-6)
