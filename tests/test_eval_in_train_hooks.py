"""EvalNoGradGuard finds evaluation a training hook runs without a phase mark: a forward of the LightningModule or of
one of its submodules between training steps, with autograd on (whatever the modules' modes: seed 001's
``self.net.eval(); self(x)``) or with BatchNorm/Dropout in training mode (a GAN sampling at its epoch end). Checked
against the model's own counts: its forwards, BatchNorm's ``num_batches_tracked``, the activations' closed-form
bytes."""

import pytest
import torch
import torchmetrics
from torch import nn

from helpers import TinyModel, find_summary, fit
from lightning_perf import EvalNoGradGuard, phase

MB = 1024.0 * 1024.0


class GanLike(TinyModel):
    """Manual optimization with two optimizers; a generator with BatchNorm samples ``samples`` times at each
    training epoch end with grad on and the generator in training mode, as a GAN's image logging often does."""

    def __init__(self, samples=3, no_grad_eval=False):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 16))
        self.samples, self.no_grad_eval = samples, no_grad_eval
        self.tracked_moves = 0  # the generator BatchNorm's own count of training-mode forwards at epoch ends
        self.sampled = 0

    def training_step(self, batch, batch_idx):
        opt_net, opt_gen = self.optimizers()
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        opt_net.zero_grad()
        self.manual_backward(loss)
        opt_net.step()
        fake = self.generator(torch.randn(x.shape[0], 8))
        gen_loss = fake.pow(2).mean()
        opt_gen.zero_grad()
        self.manual_backward(gen_loss)
        opt_gen.step()

    def configure_optimizers(self):
        return (torch.optim.SGD(self.net.parameters(), lr=0.01),
                torch.optim.SGD(self.generator.parameters(), lr=0.01))

    def on_train_epoch_end(self):
        before = int(self.generator[1].num_batches_tracked)
        if self.no_grad_eval:
            self.generator.eval()
            with torch.no_grad():
                for _ in range(self.samples):
                    self.generator(torch.randn(32, 8))
            self.generator.train()
        else:
            for _ in range(self.samples):
                self.generator(torch.randn(32, 8))  # grad on, BatchNorm in training mode
        self.sampled += self.samples
        self.tracked_moves += int(self.generator[1].num_batches_tracked) - before


def test_a_gans_unmarked_sampling_at_epoch_end_is_found_with_grad_and_batchnorm_in_training_mode(tmp_path):
    model = GanLike()
    with pytest.warns(UserWarning, match="GanLike.on_train_epoch_end ran Sequential.forward with autograd on between"):
        fit(tmp_path, [EvalNoGradGuard()], model=model, max_epochs=2)
    g = find_summary(tmp_path)["eval_no_grad_guard"]
    assert g["clean"] is False
    (grad,) = g["findings"]
    assert grad["site"] == "GanLike.on_train_epoch_end" and grad["module"] == "Sequential"
    assert grad["training_mode"] is True and grad["count"] == model.sampled == 6
    # each forward saves at least its 32x8 input and the 32x64 BatchNorm input: 9 kB
    assert grad["saved_for_backward_mb"] * MB >= 6 * 32 * (8 + 64) * 4
    (mode,) = g["train_mode_findings"]
    assert mode["phase"] == "train_hooks" and mode["site"] == "GanLike.on_train_epoch_end"
    assert mode["modules"] == ["generator.1"] and mode["module_types"] == ["BatchNorm1d"]
    assert mode["running_stats_changed"] is True and mode["runs"] == 0
    assert mode["forwards"] == model.tracked_moves == 6  # BatchNorm's own counter at the epoch ends
    assert g["train_mode_eval_forwards"] == 6


def test_the_same_sampling_in_eval_mode_under_no_grad_is_clean(tmp_path):
    model = GanLike(no_grad_eval=True)
    fit(tmp_path, [EvalNoGradGuard()], model=model, max_epochs=2)
    g = find_summary(tmp_path)["eval_no_grad_guard"]
    assert model.tracked_moves == 0 and model.sampled == 6
    assert g["clean"] is True and g["findings"] == [] and g["train_mode_findings"] == []


class EvalsItsNetOnly(TinyModel):
    """Seed 001's bug in its common form: ``self.net.eval(); out = self(x)`` in a training hook, grad on; with
    ``marked`` inside ``phase("eval_in_train_hooks")``. ``self`` stays in training mode around the eval-mode net."""

    def __init__(self, marked=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 4096), nn.ReLU(), nn.Linear(4096, 1))
        self.marked = marked
        self.evaluated = 0

    def forward(self, x):
        return self.net(x)

    def on_train_epoch_end(self):
        self.net.eval()
        x = torch.randn(256, 16)
        if self.marked:
            with phase("eval_in_train_hooks"):
                out = self(x)
        else:
            out = self(x)
        self.evaluated += 1
        del out
        self.net.train()


@pytest.mark.parametrize("marked", [False, True])
def test_self_net_eval_then_self_of_x_in_a_training_hook_is_found_with_and_without_the_phase_mark(tmp_path, marked):
    model = EvalsItsNetOnly(marked=marked)
    with pytest.warns(UserWarning, match="EvalsItsNetOnly.on_train_epoch_end ran EvalsItsNetOnly.forward with autograd"
                                         " on between training steps, in training mode"):
        fit(tmp_path, [EvalNoGradGuard()], model=model, max_epochs=2)
    g = find_summary(tmp_path)["eval_no_grad_guard"]
    (grad,) = g["findings"]
    assert grad["site"] == "EvalsItsNetOnly.on_train_epoch_end" and grad["module"] == "EvalsItsNetOnly"
    assert grad["training_mode"] is True and grad["count"] == model.evaluated == 2
    # each forward keeps the 256x4096 ReLU output (or its input) for backward: 4 MB at least
    assert grad["saved_for_backward_mb"] >= 2 * 256 * 4096 * 4 / MB
    assert g["train_mode_findings"] == []  # no BatchNorm or Dropout: the modes change nothing else


class MetricAtBatchEnd(TinyModel):
    """A torchmetrics metric updated in a batch-end hook (a module of the LightningModule without parameters)."""

    def __init__(self):
        super().__init__()
        self.mse = torchmetrics.MeanSquaredError()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        x, y = batch
        with torch.no_grad():
            preds = self.net(x)
        self.mse(preds, y)


def test_a_metric_update_between_steps_and_an_lbfgs_closure_are_no_evaluation(tmp_path):
    """A metric's forward builds no graph (no parameters); LBFGS runs the training step again inside its step
    (after the backward hook): neither is evaluation in a training hook."""
    fit(tmp_path / "metric", [EvalNoGradGuard()], model=MetricAtBatchEnd(), max_epochs=1)
    assert find_summary(tmp_path / "metric")["eval_no_grad_guard"]["clean"] is True

    class Lbfgs(TinyModel):
        def configure_optimizers(self):
            return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=3)

    fit(tmp_path / "lbfgs", [EvalNoGradGuard()], model=Lbfgs(), max_epochs=1)
    assert find_summary(tmp_path / "lbfgs")["eval_no_grad_guard"]["clean"] is True


class TrainsAtEpochEnd(TinyModel):
    """An extra gradient pass in a training hook, on purpose (a Fisher estimate, an extra update): grad is needed."""

    def on_train_epoch_end(self):
        x, y = next(iter(self.train_dataloader()))
        nn.functional.mse_loss(self(x), y).backward()  # raises if the forward ran without grad
        self.zero_grad()


def test_fix_mode_reports_but_never_strips_grad_from_a_training_mode_forward_between_steps(tmp_path):
    with pytest.warns(UserWarning, match="TrainsAtEpochEnd.on_train_epoch_end ran TrainsAtEpochEnd.forward with"
                                         " autograd on between training steps"):
        fit(tmp_path, [EvalNoGradGuard(mode="fix")], model=TrainsAtEpochEnd(), max_epochs=2)
    g = find_summary(tmp_path)["eval_no_grad_guard"]
    (grad,) = g["findings"]
    assert grad["training_mode"] is True and grad["fixed"] is False and grad["count"] == 2
