"""ABTrial under adversarial use (issue 63). Real CPU fits; the virtual clock where figures are compared."""

import pytest
from helpers import PacedModel, find_summary, fit, make_loader, use_virtual_clock

from lightning_perf import ABTrial, IterationTimer


def nothing(trainer, module):
    pass


def test_with_gradient_accumulation_every_micro_batch_s_samples_are_counted(tmp_path, monkeypatch):
    """Each micro-batch of 8 samples costs 10 ms on the virtual clock: an iteration of 3 is 24 samples in 30 ms."""
    clock = use_virtual_clock(monkeypatch)
    model = PacedModel(clock, 0.01)
    model.train_dataloader = lambda: make_loader(n=4096, batch_size=8)
    trial = ABTrial("nothing", switch_on=nothing, switch_off=nothing, warmup=4, block=4, blocks=4, quality_batches=0)
    timer = IterationTimer()
    fit(tmp_path, [timer, trial], model=model, max_steps=trial.schedule.total + 2, accumulate_grad_batches=3,
        limit_val_batches=0, num_sanity_val_steps=0)
    summary = find_summary(tmp_path)
    section = summary["trial"]
    assert section["status"] == "done"
    for arm in ("off", "on"):
        assert section["arms"][arm]["ms_per_iter"] == pytest.approx(30.0)
        assert section["arms"][arm]["samples_per_s"] == pytest.approx(8 * 3 / 0.03)
    assert summary["iteration_timer"]["samples_per_s"] == pytest.approx(section["arms"]["off"]["samples_per_s"])
