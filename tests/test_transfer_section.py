"""SectionProfiler's ``transfer`` section: Lightning's batch_to_device, carved out of data loading, on the virtual
clock (helpers.VirtualClock) so each section holds exactly the cost the model injects."""

import pytest
from lightning.pytorch import Callback, Trainer
from torch.utils.data import DataLoader

from helpers import ClockedItems, SimulatedDevice, TinyModel, find_summary, fit, trainer_kwargs, use_virtual_clock
from lightning_perf import IterationTimer, PerfSuite, SectionProfiler
from lightning_perf.callbacks.section_profiler import batch_transfer

FETCH_S, TRANSFER_S, STEP_S = 0.002, 0.004, 0.003  # per item (8 a batch), per transfer, per training_step


class CostlyTransfer(TinyModel):
    """Every transfer costs TRANSFER_S (validation's too), every fetched item FETCH_S, every step STEP_S."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def train_dataloader(self):
        return DataLoader(ClockedItems(self.clock, FETCH_S), batch_size=8)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        self.clock.advance(TRANSFER_S)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def training_step(self, batch, batch_idx):
        self.clock.advance(STEP_S)
        return super().training_step(batch, batch_idx)


def profiler(**kwargs):
    kwargs.setdefault("print_reports", False)
    kwargs.setdefault("warmup_steps", 2)
    return SectionProfiler(**kwargs)


class SeesTheWrapper(Callback):
    """Records, at every batch, whether the strategy's batch_to_device is an instance attribute (ours) then."""

    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append("batch_to_device" in trainer.strategy.__dict__)


@pytest.mark.parametrize("boundary", ["batch_gap", "fetch"])
def test_an_injected_transfer_cost_is_the_transfer_section_and_leaves_data_loading(tmp_path, monkeypatch, boundary):
    clock = use_virtual_clock(monkeypatch)
    seen = SeesTheWrapper()
    trainer = fit(tmp_path, [IterationTimer(warmup_steps=2), profiler(data_loading_boundary=boundary), seen],
                  model=CostlyTransfer(clock), max_epochs=2, enable_checkpointing=False)
    s = find_summary(tmp_path)
    sp, timer = s["section_profiler"], s["iteration_timer"]
    table = sp["sections"]
    assert sp["data_loading_boundary"] == boundary and sp["iterations"] == 14  # 16 batches, 2 warm-up
    assert table["transfer"]["count"] == 14 and table["transfer"]["mean_ms"] == pytest.approx(1000 * TRANSFER_S)
    # data loading is the wait for the batch only: the 8 items' fetch, no transfer in it
    assert table["data_loading"]["mean_ms"] == pytest.approx(8 * 1000 * FETCH_S)
    assert table["forward"]["mean_ms"] == pytest.approx(1000 * STEP_S)
    iteration_ms = 1000 * (8 * FETCH_S + TRANSFER_S + STEP_S)
    assert sp["iteration_ms"]["mean"] == pytest.approx(iteration_ms)
    assert timer["ms_per_iter"]["mean"] == pytest.approx(iteration_ms)  # the timer's own clock agrees
    assert 1000 * sum(r["total_s"] for r in table.values()) / sp["iterations"] == pytest.approx(iteration_ms)
    assert table["transfer"]["share_pct"] == pytest.approx(100 * TRANSFER_S * 1000 / iteration_ms)
    # validation's transfers are evaluation: 2 runs of 4 batches, each batch's only cost its transfer
    assert sp["validation"]["runs"] == 2 and sp["validation"]["total_s"] == pytest.approx(2 * 4 * TRANSFER_S)
    assert seen.seen and all(seen.seen)
    assert "batch_to_device" not in trainer.strategy.__dict__


def test_the_transfer_section_under_gradient_accumulation_and_manual_optimization(tmp_path, monkeypatch):
    clock = use_virtual_clock(monkeypatch)
    fit(tmp_path / "acc", [profiler(warmup_steps=1)], model=CostlyTransfer(clock), max_epochs=1,
        accumulate_grad_batches=2, enable_checkpointing=False)
    table = find_summary(tmp_path / "acc")["section_profiler"]["sections"]
    assert table["transfer"]["count"] == 3 and table["transfer"]["mean_ms"] == pytest.approx(2000 * TRANSFER_S)

    class Manual(CostlyTransfer):
        def __init__(self, clock):
            super().__init__(clock)
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()
            loss = super().training_step(batch, batch_idx)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    fit(tmp_path / "manual", [profiler()], model=Manual(clock), max_epochs=1, enable_checkpointing=False)
    table = find_summary(tmp_path / "manual")["section_profiler"]["sections"]
    assert table["transfer"]["mean_ms"] == pytest.approx(1000 * TRANSFER_S)
    assert table["data_loading"]["mean_ms"] == pytest.approx(8000 * FETCH_S)
    assert table["training_step"]["mean_ms"] == pytest.approx(1000 * STEP_S)


def test_inside_a_perf_suite_the_transfer_is_timed_and_given_back(tmp_path, monkeypatch):
    clock = use_virtual_clock(monkeypatch)
    trainer = fit(tmp_path, [PerfSuite([IterationTimer(warmup_steps=2), profiler()])], model=CostlyTransfer(clock),
                  max_epochs=1, enable_checkpointing=False)
    table = find_summary(tmp_path)["section_profiler"]["sections"]
    assert table["transfer"]["count"] == 6 and table["transfer"]["mean_ms"] == pytest.approx(1000 * TRANSFER_S)
    assert table["data_loading"]["mean_ms"] == pytest.approx(8000 * FETCH_S)
    assert "batch_to_device" not in trainer.strategy.__dict__


def test_the_strategys_method_is_given_back_after_a_crash_in_training(tmp_path, monkeypatch):
    clock = use_virtual_clock(monkeypatch)

    class Crashes(CostlyTransfer):
        def training_step(self, batch, batch_idx):
            if batch_idx == 5:
                raise RuntimeError("boom at batch 5")
            return super().training_step(batch, batch_idx)

    seen = SeesTheWrapper()
    trainer = Trainer(callbacks=[profiler(), seen], **trainer_kwargs(tmp_path, max_epochs=1))
    with pytest.raises(RuntimeError, match="boom at batch 5"):
        trainer.fit(Crashes(clock))
    assert seen.seen and all(seen.seen)
    assert "batch_to_device" not in trainer.strategy.__dict__
    strategy_cls = type(trainer.strategy)
    assert trainer.strategy.batch_to_device.__func__ is strategy_cls.batch_to_device
    s = find_summary(tmp_path)
    assert s["status"] == "failed"
    assert s["section_profiler"]["sections"]["transfer"]["count"] == 3  # batches 2, 3, 4 after the warm-up


def test_a_transfer_that_raises_reaches_the_user_and_the_method_comes_back(tmp_path):
    class BadTransfer(TinyModel):
        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            if self.trainer.global_step == 3:
                raise ValueError("cannot move this batch")
            return super().transfer_batch_to_device(batch, device, dataloader_idx)

    trainer = Trainer(callbacks=[profiler()], **trainer_kwargs(tmp_path, max_epochs=1))
    with pytest.raises(ValueError, match="cannot move this batch"):
        trainer.fit(BadTransfer())
    assert "batch_to_device" not in trainer.strategy.__dict__


def test_a_wrapper_already_on_the_instance_is_put_back_as_it_was(tmp_path):
    calls = []
    trainer = Trainer(callbacks=[profiler()], **trainer_kwargs(tmp_path, max_epochs=1))
    original = trainer.strategy.batch_to_device

    def theirs(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    trainer.strategy.batch_to_device = theirs
    trainer.fit(TinyModel())
    assert trainer.strategy.__dict__["batch_to_device"] is theirs
    assert len(calls) == 8 + 4 + 1  # their wrapper still ran inside ours: 8 train, 4 validation, 1 sanity batch
    assert find_summary(tmp_path)["section_profiler"]["sections"]["transfer"]["count"] == 6


class _Strategy:
    """Stands in for a Strategy: only its batch_to_device is used."""

    def batch_to_device(self, batch, device=None, dataloader_idx=0):
        return ("moved", batch)


def test_a_failing_mark_never_reaches_the_transfer_and_a_wrapper_on_top_stays_working():
    strategy, marks = _Strategy(), []

    def failing():
        marks.append("start")
        raise RuntimeError("no clock today")

    handle = batch_transfer.install(strategy, failing)
    assert strategy.batch_to_device(1) == ("moved", 1) and marks == ["start"]
    batch_transfer.uninstall(handle)
    assert "batch_to_device" not in strategy.__dict__ and strategy.batch_to_device(2) == ("moved", 2)

    handle = batch_transfer.install(strategy, lambda: marks.append("start"))
    ours = strategy.batch_to_device
    strategy.batch_to_device = lambda *a, **k: ours(*a, **k)  # another tool wraps ours after the fit started
    batch_transfer.uninstall(handle)  # ours cannot come off: it only delegates from now on
    marks.clear()
    assert strategy.batch_to_device(3) == ("moved", 3) and marks == []






def test_the_transfer_has_device_time_from_the_events_the_profiler_records(tmp_path, monkeypatch):
    """Only the hardware is simulated: the events read the suite's clock, so the transfer's device time must be the
    injected cost, and data loading's the fetch alone."""
    clock = use_virtual_clock(monkeypatch)
    sp = profiler(device_timing_every_n_iterations=1)
    fit(tmp_path, [sp, SimulatedDevice(sp)], model=CostlyTransfer(clock), max_epochs=1, enable_checkpointing=False)
    table = find_summary(tmp_path)["section_profiler"]["sections"]
    assert table["transfer"]["device_mean_ms"] == pytest.approx(1000 * TRANSFER_S)
    assert table["data_loading"]["device_mean_ms"] == pytest.approx(8000 * FETCH_S)
