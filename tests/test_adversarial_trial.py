"""ABTrial under adversarial use (issue 63): a user change whose step raises, gradient accumulation's samples, a
resume from a checkpoint, a switch_off that raises. Real CPU fits; the virtual clock where figures are compared."""

import pytest
from helpers import (ManualModel, PacedModel, TinyModel, find_summary, fit, make_loader, trainer_kwargs,
                     use_virtual_clock)
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_perf import ABTrial, IterationTimer
from test_ab_trial import extra_off, extra_on

#: warmup 2, blocks of 2, 4 blocks, ABBA: iterations 0 off, 1 on, 2-3 off, 4-5 on, 6-7 on, 8-9 off.
SMALL = dict(warmup=2, block=2, blocks=4, order="abba", quality_batches=0)


def resume(tmp_path, callbacks, ckpt, model=None, **overrides):
    trainer = Trainer(callbacks=callbacks, **trainer_kwargs(tmp_path, **overrides))
    trainer.fit(model or TinyModel(), ckpt_path=str(ckpt))
    return trainer


def without_the_clock(ckpt):
    """The checkpoint without the test's clock among the paced model's hyperparameters, so that it loads with
    torch's default weights_only on every Lightning (2.2's fit takes no weights_only)."""
    import torch

    state = torch.load(ckpt, weights_only=False)
    state.get("hyper_parameters", {}).pop("clock", None)
    torch.save(state, ckpt)
    return ckpt


def trial_warnings(recwarn):
    return [str(w.message) for w in recwarn if str(w.message).startswith("ABTrial:")]


def flag_on(trainer, module):
    module.flag = True


def flag_off(trainer, module):
    module.flag = False


def nothing(trainer, module):
    pass


class FailsWhenFlagged(TinyModel):
    """Its step raises while the user's change (``flag``) is on; at ``own_error_at`` it raises whatever the flag."""

    def __init__(self, own_error_at=None):
        super().__init__()
        self.flag, self.own_error_at = False, own_error_at

    def training_step(self, batch, batch_idx):
        if self.global_step == self.own_error_at:
            raise RuntimeError("the step's own bug")
        if self.flag:
            raise RuntimeError("the new loss is broken")
        return super().training_step(batch, batch_idx)


def test_a_user_change_whose_step_raises_is_switched_off_and_training_goes_on(tmp_path, recwarn):
    model = FailsWhenFlagged()
    trial = ABTrial("new_loss", switch_on=flag_on, switch_off=flag_off, **SMALL)
    trainer = fit(tmp_path, [trial], model=model, max_steps=20, max_epochs=10, limit_val_batches=0,
                  num_sanity_val_steps=0)
    assert trainer.global_step == 20  # iteration 1 raised under the change and ran again without it
    section = find_summary(tmp_path)["trial"]
    assert section["status"] == "stopped" and "RuntimeError: the new loss is broken" in section["reason"]
    assert "ran again without the change" in section["reason"]
    assert model.flag is False and "training_step" not in model.__dict__
    (warning,) = trial_warnings(recwarn)
    assert "the new loss is broken" in warning and warning.endswith("Training goes on with the change off.")


@pytest.mark.parametrize("own_error_at, arm", [(5, "on"), (3, "off")])
def test_a_step_error_of_its_own_goes_to_the_fit_and_the_warning_does_not_promise_training_goes_on(
        tmp_path, recwarn, own_error_at, arm):
    """The step raises at ``own_error_at`` with the change on or off: that is the user's own error; the fit stops with
    it, the change is off, and the warning says so instead of "training goes on"."""
    model = FailsWhenFlagged(own_error_at=own_error_at)
    trial = ABTrial("no_op", switch_on=nothing, switch_off=nothing, **SMALL)
    assert trial.schedule.arm(own_error_at) == arm
    with pytest.raises(RuntimeError, match="the step's own bug"):
        fit(tmp_path, [trial], model=model, max_steps=20, max_epochs=10, limit_val_batches=0,
            num_sanity_val_steps=0)
    summary = find_summary(tmp_path)
    assert summary["status"] == "failed" and summary["trial"]["status"] == "stopped"
    if arm == "on":
        assert "again without it: the step's own error, not the change's" in summary["trial"]["reason"]
    assert "training_step" not in model.__dict__
    (warning,) = trial_warnings(recwarn)
    assert "Training goes on" not in warning and "the fit stops with that error" in warning


def test_a_step_that_raises_under_a_change_that_cannot_be_switched_off_is_not_run_again(tmp_path, recwarn):
    def off(trainer, module):
        raise ValueError("cannot undo the change")

    model = FailsWhenFlagged()
    trial = ABTrial("new_loss", switch_on=flag_on, switch_off=off, **SMALL)
    with pytest.raises(RuntimeError, match="the new loss is broken"):
        fit(tmp_path, [trial], model=model, max_steps=20, max_epochs=10, limit_val_batches=0,
            num_sanity_val_steps=0)
    assert model.flag is True
    (warning,) = trial_warnings(recwarn)
    assert warning.count("cannot undo the change") == 1 and "the change stays on" in warning
    assert warning.endswith("The change is on; the fit stops with that error.")


class ManualFailsWhenFlagged(ManualModel):
    def __init__(self):
        super().__init__()
        self.flag, self.stepped = False, 0

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)  # backward and the optimizer step happen here
        self.stepped += 1
        if self.flag:
            raise RuntimeError("the new loss is broken after the optimizer step")
        return loss


def test_under_manual_optimization_a_step_that_raised_under_the_change_is_not_run_again(tmp_path, recwarn):
    """Its optimizer may have stepped before the error: a second run would step it twice. The error goes to the fit,
    with the change off."""
    model = ManualFailsWhenFlagged()
    trial = ABTrial("new_loss", switch_on=flag_on, switch_off=flag_off, **SMALL)
    with pytest.raises(RuntimeError, match="after the optimizer step"):
        fit(tmp_path, [trial], model=model, max_steps=20, max_epochs=10, limit_val_batches=0,
            num_sanity_val_steps=0)
    assert model.stepped == 2 and model.flag is False  # iteration 1 ran once, under the change
    section = find_summary(tmp_path)["trial"]
    assert section["status"] == "stopped" and "manual optimization" in section["reason"]
    (warning,) = trial_warnings(recwarn)
    assert "Training goes on" not in warning and "the fit stops with that error" in warning


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


class PacedExtra(PacedModel):
    """Each step costs 10 ms on the virtual clock, 5% more with ``extra`` on."""

    def __init__(self, clock):
        super().__init__(clock, 0.01)
        self.extra = False

    def training_step(self, batch, batch_idx):
        self.step_s = 0.01 * (1.05 if self.extra else 1.0)
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return make_loader(n=4096)




def test_a_resume_mid_trial_continues_the_trial_from_the_checkpoint(tmp_path, monkeypatch, recwarn):
    clock = use_virtual_clock(monkeypatch)
    kwargs = dict(switch_on=extra_on, switch_off=extra_off, warmup=10, block=10, blocks=8, quality_batches=0)
    common = dict(limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=50)
    saver = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=35, save_top_k=-1)
    first = ABTrial("extra_step", **kwargs)
    assert first.schedule.arm(35) == "on"  # the resumed process must switch the change on for the rest of its block
    fit(tmp_path / "a", [first, saver], model=PacedExtra(clock), max_steps=35, **common)
    (ckpt,) = (tmp_path / "ckpt").iterdir()
    model = PacedExtra(clock)
    recwarn.clear()
    trial = ABTrial("extra_step", **kwargs)
    trainer = resume(tmp_path / "b", [trial], without_the_clock(ckpt), model=model,
                     max_steps=trial.schedule.total + 5, **common)
    assert trainer.global_step == 95
    assert not [w for w in trial_warnings(recwarn) if "state" in w]
    section = find_summary(tmp_path / "b")["trial"]
    assert section["status"] == "done" and section["pairs"] == 4 and section["blocks"] == 4 * 2
    assert section["time_ratio"] == pytest.approx(1.05, rel=1e-9)  # the resumed block ran under its own arm
    # 8 blocks of 9 counted iterations, less the first after the resume (it holds the resume's start-up)
    assert section["arms"]["off"]["iterations"] + section["arms"]["on"]["iterations"] == 8 * 9 - 1
    assert "checkpoint_state" not in (section.get("unavailable") or {})
    assert model.extra is False


def test_a_trial_done_before_the_checkpoint_is_kept_not_run_again(tmp_path, recwarn):
    saver = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=12, save_top_k=-1)
    first = ABTrial("nothing", switch_on=nothing, switch_off=nothing, **SMALL)
    fit(tmp_path / "a", [first, saver], max_steps=12, max_epochs=10, limit_val_batches=0, num_sanity_val_steps=0)
    before = find_summary(tmp_path / "a")["trial"]
    (ckpt,) = (tmp_path / "ckpt").iterdir()
    recwarn.clear()
    calls = []
    trial = ABTrial("nothing", switch_on=lambda t, m: calls.append("on"), switch_off=nothing, **SMALL)
    resume(tmp_path / "b", [trial], ckpt, max_steps=16, max_epochs=10, limit_val_batches=0, num_sanity_val_steps=0)
    after = find_summary(tmp_path / "b")["trial"]
    assert not calls and not trial_warnings(recwarn)
    assert after["status"] == "done"
    for key in ("pairs", "pair_off_ms", "pair_on_ms", "time_ratio", "switches", "arms"):
        assert after[key] == before[key]


def test_a_switch_off_that_raises_is_reported_once_saying_the_change_stays_on(tmp_path, recwarn):
    def off(trainer, module):
        raise ValueError("cannot undo the change")

    trial = ABTrial("sticky", switch_on=nothing, switch_off=off, **SMALL)
    trainer = fit(tmp_path, [trial], max_steps=12, max_epochs=10, limit_val_batches=0, num_sanity_val_steps=0)
    assert trainer.global_step == 12
    section = find_summary(tmp_path)["trial"]
    assert section["status"] == "stopped"
    assert section["reason"].count("cannot undo the change") == 1 and "stays on" in section["reason"]
    (warning,) = trial_warnings(recwarn)
    assert warning.count("cannot undo the change") == 1 and "stays on" in warning
    assert "with the change off" not in warning


def test_a_switch_off_that_raises_at_the_trial_s_end_skips_the_quality_pass(tmp_path, recwarn):
    """Six ABBA blocks end on the change's arm: the switch off at the end raises; the arms' quality cannot be
    compared with a change that stays on."""
    end = SMALL["warmup"] + SMALL["block"] * 6  # the trial's last iteration ends at this step

    def off(trainer, module):
        if trainer.global_step >= end:
            raise ValueError("cannot undo the change")
        module.flag = False

    trial = ABTrial("sticky", switch_on=flag_on, switch_off=off, **{**SMALL, "blocks": 6, "quality_batches": 2})
    assert trial.schedule.arm(end - 1) == "on"
    model = TinyModel()
    trainer = fit(tmp_path, [trial], model=model, max_steps=end + 2, max_epochs=10, num_sanity_val_steps=0)
    assert trainer.global_step == end + 2 and model.flag is True
    section = find_summary(tmp_path)["trial"]
    assert section["status"] == "stopped" and section["pairs"] == 3 and section["quality"] is None
    assert section["reason"].count("cannot undo the change") == 1 and "stays on" in section["reason"]
    assert "could not be switched off" in section["unavailable"]["quality"]
    (warning,) = trial_warnings(recwarn)
    assert warning.endswith("Training goes on with the change on.")


def test_a_resume_with_another_trial_says_it_starts_afresh(tmp_path, recwarn):
    saver = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), every_n_train_steps=5, save_top_k=-1)
    first = ABTrial("nothing", switch_on=nothing, switch_off=nothing, **SMALL)
    fit(tmp_path / "a", [first, saver], max_steps=5, max_epochs=10, limit_val_batches=0, num_sanity_val_steps=0)
    (ckpt,) = (tmp_path / "ckpt").iterdir()
    recwarn.clear()
    trial = ABTrial("nothing", switch_on=nothing, switch_off=nothing, **{**SMALL, "blocks": 6})
    resume(tmp_path / "b", [trial], ckpt, max_steps=5 + 14, max_epochs=10, limit_val_batches=0,
           num_sanity_val_steps=0)
    (warning,) = trial_warnings(recwarn)
    assert "on the schedule [2, 2, 4, 'abba', 1, 0]" in warning and "It starts fresh" in warning
    section = find_summary(tmp_path / "b")["trial"]
    assert section["status"] == "done" and section["pairs"] == 3  # the whole trial, after the resume
    assert "could not be read" in section["unavailable"]["checkpoint_state"]
