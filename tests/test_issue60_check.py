"""Issue 60 checked as a new user would: a GAN-like program with two optimizers, BatchNorm in its generator and
Dropout in its discriminator, that samples at its epoch end, run unchanged. What its evaluation in a training hook is
reported with must be what ran: the modules named are those its forward ran, not every module of the
LightningModule in training mode."""

import json
import subprocess
import sys
import warnings

import pytest
import torch
from lightning.pytorch import Callback
from torch import nn

from helpers import TinyModel, find_summary, fit
from lightning_perf import EvalNoGradGuard


class Gan(TinyModel):
    """A GAN as such programs are written: ``forward`` is the generator (BatchNorm), the discriminator has Dropout;
    manual optimization with two optimizers. At each training epoch end it samples ``self(z)`` with grad on and the
    model in training mode (the generator alone runs); with ``judge`` it also scores the samples with the
    discriminator (which then runs, its Dropout active)."""

    def __init__(self, judge=False):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16))
        self.discriminator = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Dropout(0.3), nn.Linear(32, 1))
        self.judge = judge
        self.dropout_runs = 0  # the discriminator's Dropout's own count of forwards between steps
        self.between_steps = False
        self.discriminator[2].register_forward_pre_hook(self._count_dropout)

    def _count_dropout(self, module, args):
        self.dropout_runs += int(self.between_steps)

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(x.shape[0], 8)
        g_loss = nn.functional.softplus(-self.discriminator(self(z))).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        d_loss = (nn.functional.softplus(-self.discriminator(x)).mean()
                  + nn.functional.softplus(self.discriminator(self(z).detach())).mean())
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()

    def configure_optimizers(self):
        return (torch.optim.Adam(self.generator.parameters(), lr=1e-3),
                torch.optim.Adam(self.discriminator.parameters(), lr=1e-3))

    def on_train_epoch_end(self):
        self.between_steps = True
        samples = self(torch.randn(16, 8))
        if self.judge:
            self.discriminator(samples)
        self.between_steps = False


def _guarded_fit(tmp_path, model):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path, [EvalNoGradGuard()], model=model, max_epochs=2, limit_val_batches=0, num_sanity_val_steps=0)
    said = [str(w.message) for w in caught if "ran the LightningModule's modules between training steps" in
            str(w.message)]
    return find_summary(tmp_path)["eval_no_grad_guard"], said


def test_a_gans_sampling_names_the_generators_batchnorm_not_the_discriminators_dropout_that_did_not_run(tmp_path):
    model = Gan()
    guard, said = _guarded_fit(tmp_path, model)
    assert model.dropout_runs == 0
    (mode,) = guard["train_mode_findings"]
    assert mode["phase"] == "train_hooks" and mode["site"] == "Gan.on_train_epoch_end"
    assert mode["modules"] == ["generator.1"] and mode["module_types"] == ["BatchNorm1d"], mode
    assert mode["module_count"] == 1 and mode["running_stats_changed"] is True and mode["forwards"] == 2
    assert len(said) == 1 and "1 module in training mode (BatchNorm1d generator.1)" in said[0], said
    assert "dropout" not in said[0].lower(), said[0]


def test_a_gans_sampling_scored_by_its_discriminator_names_both(tmp_path):
    model = Gan(judge=True)
    guard, said = _guarded_fit(tmp_path, model)
    assert model.dropout_runs == 2
    (mode,) = guard["train_mode_findings"]
    assert mode["modules"] == ["generator.1", "discriminator.2"], mode
    assert mode["module_types"] == ["BatchNorm1d", "Dropout"] and mode["module_count"] == 1  # a forward's most
    assert mode["forwards"] == 4  # two top-level forwards an epoch end, two epochs
    assert len(said) == 1, said  # one warning a site: the summary holds what every forward there ran


class SampleLogger(Callback):
    """Samples the generator every 4th batch in its ``on_train_batch_end``, as image-logging callbacks do: listed
    before the guard (a user's callbacks come before those ``lightning-perf run`` adds)."""

    def __init__(self):
        self.sampled = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx % 4 == 0:
            pl_module(torch.randn(16, 8))
            self.sampled += 1


class GanNoEpochEnd(Gan):
    def on_train_epoch_end(self):
        pass


def test_a_callback_before_the_guard_sampling_at_batch_end_under_manual_optimization_is_found(tmp_path):
    logger = SampleLogger()
    trainer = fit(tmp_path, [logger, EvalNoGradGuard()], model=GanNoEpochEnd(), max_epochs=2, limit_val_batches=0,
                  num_sanity_val_steps=0)
    assert "post_training_step" not in vars(trainer.strategy)  # the strategy's own method given back
    guard = find_summary(tmp_path)["eval_no_grad_guard"]
    assert logger.sampled == 4 and guard["clean"] is False
    (grad,) = guard["findings"]
    assert grad["site"] == "SampleLogger.on_train_batch_end" and grad["module"] == "GanNoEpochEnd"
    assert grad["training_mode"] is True and grad["count"] == logger.sampled
    (mode,) = guard["train_mode_findings"]
    assert mode["site"] == "SampleLogger.on_train_batch_end" and mode["modules"] == ["generator.1"], mode
    assert mode["forwards"] == logger.sampled


GAN_SCRIPT = '''
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
import lightning.pytorch as L


class GAN(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16))
        self.discriminator = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2), nn.Dropout(0.3), nn.Linear(32, 1))

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        z = torch.randn(real.shape[0], 8)
        g_loss = nn.functional.softplus(-self.discriminator(self(z))).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        d_loss = (nn.functional.softplus(-self.discriminator(real)).mean()
                  + nn.functional.softplus(self.discriminator(self(z).detach())).mean())
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()

    def configure_optimizers(self):
        return (torch.optim.Adam(self.generator.parameters(), lr=1e-3),
                torch.optim.Adam(self.discriminator.parameters(), lr=1e-3))


class SampleLogger(L.Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx % 4 == 0:
            pl_module.last_samples = pl_module(torch.randn(16, 8))


if __name__ == "__main__":
    trainer = L.Trainer(max_epochs=1, callbacks=[SampleLogger()], accelerator="cpu", devices=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(GAN(), DataLoader(TensorDataset(torch.randn(96, 16)), batch_size=8))
'''


def test_lightning_perf_run_of_an_unchanged_gan_names_its_callbacks_sampling_and_its_two_optimizers(tmp_path):
    script = tmp_path / "gan.py"
    script.write_text(GAN_SCRIPT)
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "run", "--out", str(out), "--name", "gan", "--",
                           sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "gan" / "perf_summary.json").read_text())
    assert "SampleLogger.on_train_batch_end ran GAN.forward with autograd on" in proc.stderr, proc.stderr
    guard = summary["eval_no_grad_guard"]
    (grad,) = guard["findings"]
    assert grad["site"] == "SampleLogger.on_train_batch_end" and grad["count"] == 3  # batches 0, 4 and 8 of 12
    (mode,) = guard["train_mode_findings"]
    assert mode["modules"] == ["generator.1"] and mode["forwards"] == 3
    sections = summary["section_profiler"]["sections"]
    measured = summary["section_profiler"]["iterations"]  # the 12 batches less the warm-up
    assert summary["iteration_timer"]["iterations"] == 12 and summary["run"]["global_step"] == 24
    assert sections["optimizer_step[0]"]["count"] == sections["optimizer_step[1]"]["count"] == measured
    assert sections["backward"]["count"] == measured


class BatchNormRegressor(TinyModel):
    """Automatic optimization, BatchNorm in its net; ``lbfgs``: its optimizer runs the training step again inside
    its ``step()`` (forwards that are training, not evaluation)."""

    def __init__(self, lbfgs=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
        self.lbfgs = lbfgs

    def configure_optimizers(self):
        if self.lbfgs:
            return torch.optim.LBFGS(self.parameters(), lr=0.1, max_iter=3)
        return super().configure_optimizers()


class EverySecondBatch(Callback):
    """Runs the LightningModule in training mode, grad on, in its ``on_train_batch_end`` every second batch."""

    def __init__(self):
        self.sampled = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx % 2 == 1:
            pl_module(torch.randn(16, 16))
            self.sampled += 1


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_callback_before_the_guard_running_the_module_at_batch_end_under_automatic_optimization_is_found(
        tmp_path, accumulate):
    sampler = EverySecondBatch()
    trainer = fit(tmp_path, [sampler, EvalNoGradGuard()], model=BatchNormRegressor(), max_epochs=2,
                  limit_val_batches=0, num_sanity_val_steps=0, accumulate_grad_batches=accumulate)
    assert "optimizer_step" not in vars(trainer.strategy)  # the strategy's own method given back
    guard = find_summary(tmp_path)["eval_no_grad_guard"]
    assert sampler.sampled == 8
    (grad,) = guard["findings"]
    assert grad["site"] == "EverySecondBatch.on_train_batch_end" and grad["training_mode"] is True
    assert grad["count"] == sampler.sampled
    (mode,) = guard["train_mode_findings"]
    assert mode["modules"] == ["net.1"] and mode["forwards"] == sampler.sampled


def test_an_lbfgs_step_running_the_training_step_again_is_no_evaluation_with_a_callback_before_the_guard(tmp_path):
    fit(tmp_path, [Callback(), EvalNoGradGuard()], model=BatchNormRegressor(lbfgs=True), max_epochs=1,
        limit_val_batches=0, num_sanity_val_steps=0)
    guard = find_summary(tmp_path)["eval_no_grad_guard"]
    assert guard["clean"] is True and guard["findings"] == [] and guard["train_mode_findings"] == []


class NetEvalThenSelf(Gan):
    """Seed 001's form: ``self.generator.eval(); self(z)`` at the epoch end, grad on."""

    def on_train_epoch_end(self):
        self.generator.eval()
        self(torch.randn(16, 8))
        self.generator.train()


@pytest.mark.parametrize("model, says_net_eval", [(Gan(), False), (NetEvalThenSelf(), True)])
def test_the_grad_warning_blames_self_net_eval_only_where_a_module_inside_was_in_eval_mode(tmp_path, model,
                                                                                         says_net_eval):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(tmp_path, [EvalNoGradGuard()], model=model, max_epochs=1, limit_val_batches=0, num_sanity_val_steps=0)
    name = type(model).__name__
    said = [str(w.message) for w in caught if f"ran {name}.forward with autograd on" in str(w.message)]
    assert len(said) == 1 and "in training mode (evaluation in a training hook" in said[0], said
    assert ("`self.net.eval()` leaves the module around it in training mode" in said[0]) is says_net_eval, said[0]


@pytest.mark.parametrize("phases, words", [
    (["train_hooks"], "what the training hooks evaluated (samples, images) is not the model's in eval mode"),
    (["train_hooks", "validation"], "its quality figures are not the model's in eval mode"),
    (["validation"], "its quality figures are not the model's in eval mode")])
def test_the_reports_note_on_a_training_hooks_own_evaluation_speaks_of_its_samples_not_quality(phases, words):
    from types import SimpleNamespace

    from lightning_perf.summary.report import train_mode_note

    findings = [SimpleNamespace(phase=phase, modules=["gen.1"], running_stats_changed=True) for phase in phases]
    note = train_mode_note(SimpleNamespace(eval_no_grad_guard=SimpleNamespace(train_mode_findings=findings)))
    assert note.endswith(f"; BatchNorm's running statistics changed: {words} (EvalNoGradGuard)"), note
