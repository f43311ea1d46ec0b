"""ABTrial on real CPU fits: a known extra cost found, a no-op near 1, the built-in changes really switched, refusals
at set-up, quality per arm, a change that breaks."""

import random

import pytest
import torch
from helpers import PacedModel, TinyModel, find_summary, fit, make_loader, use_virtual_clock
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import ABTrial, PerfConfigError, QualityGate


class Paced(PacedModel):
    """Each step costs ``step_s`` on the virtual clock, times a seeded noise of ``noise``; with ``extra`` on, ``extra``
    times that more (what a change adds, known exactly)."""

    def __init__(self, clock, step_s=0.01, noise=0.0, extra=0.05):
        super().__init__(clock, step_s)
        self.base, self.noise, self.extra_share, self.extra = step_s, noise, extra, False
        self.rng = random.Random(0)

    def training_step(self, batch, batch_idx):
        self.step_s = self.base * (1 + self.noise * self.rng.gauss(0, 1)) * (1 + self.extra_share * self.extra)
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        return make_loader(n=4096)


def extra_on(trainer, module):
    module.extra = True


def extra_off(trainer, module):
    module.extra = False


def nothing(trainer, module):
    pass


def test_a_change_adding_five_percent_to_the_step_is_found_at_five_percent(tmp_path, monkeypatch):
    """On the virtual clock only the step moves time: the arms' ratio is the change's, exactly; checkpoints and
    validations that cost both arms the same (every 37 steps) and the switches stay out of it."""
    clock = use_virtual_clock(monkeypatch)

    def slow_switch_on(trainer, module):
        clock.advance(1.0)  # a switch that costs a second: left out of both arms
        extra_on(trainer, module)

    trial = ABTrial("extra_step", switch_on=slow_switch_on, switch_off=extra_off, warmup=10, block=10, blocks=24)
    fit(tmp_path, [trial], model=Paced(clock), max_steps=trial.schedule.total + 5, limit_val_batches=2,
        val_check_interval=37, num_sanity_val_steps=0, log_every_n_steps=50)
    section = find_summary(tmp_path)["trial"]
    assert section["status"] == "done" and section["pairs"] == 12 and section["blocks"] == 24
    assert section["time_ratio"] == pytest.approx(1.05, rel=1e-9)
    assert section["speedup_low"] == pytest.approx(1 / 1.05) and section["verdict"] == "slower"
    assert section["arms"]["off"]["ms_per_iter"] == pytest.approx(10.0)
    assert section["pair_off_ms"] == pytest.approx([10.0] * 12) and section["pair_on_ms"] == pytest.approx([10.5] * 12)
    assert "1.05x slower (95% CI 1.05–1.05x slower, paired over 24 blocks)" in section["line"]  # not 0.95–0.95
    assert section["arms"]["off"]["samples_per_s"] == pytest.approx(800.0)
    assert section["switch_ms_mean"] > 400  # half the switches are the slow ones
    counted = section["arms"]["on"]["iterations"] + section["arms"]["off"]["iterations"]
    assert counted == 24 * 9 - sum(1 for k in range(1, 10) if k * 37 < trial.schedule.total and
                                   trial.schedule.where(k * 37)[1])  # an iteration spanning a validation is out


def test_a_no_op_reads_as_no_difference(tmp_path, monkeypatch):
    clock = use_virtual_clock(monkeypatch)
    trial = ABTrial("nothing", switch_on=nothing, switch_off=nothing, warmup=10, block=10, blocks=24)
    fit(tmp_path, [trial], model=Paced(clock, noise=0.05, extra=0.0), max_steps=trial.schedule.total + 5,
        limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=50)
    section = find_summary(tmp_path)["trial"]
    assert abs(section["time_ratio"] - 1) < 0.02
    assert section["speedup_low"] < 1 < section["speedup_high"] and section["verdict"] == "within-noise"
    assert "within noise" in section["line"]


class Conv(TinyModel):
    """A small conv net that records, each step, the layout of its weight and its input and the autocast state."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.seen = []

    def training_step(self, batch, batch_idx):
        (x,) = batch
        cl = torch.channels_last
        self.seen.append((self.conv.weight.is_contiguous(memory_format=cl) and not self.conv.weight.is_contiguous(),
                          x.is_contiguous(memory_format=cl) and not x.is_contiguous(),
                          torch.is_autocast_enabled("cpu"), torch.get_float32_matmul_precision()))
        return self.conv(x).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.rand(64, 3, 8, 8)), batch_size=4)

    def val_dataloader(self):
        return None


def run_conv(tmp_path, change, **kwargs):
    model = Conv()
    trial = ABTrial(change, warmup=4, block=4, blocks=4, order="abba", quality_batches=0, **kwargs)
    fit(tmp_path, [trial], model=model, max_steps=trial.schedule.total, limit_val_batches=0, num_sanity_val_steps=0)
    arms = [trial.schedule.arm(i) for i in range(trial.schedule.total)]
    return model, arms, find_summary(tmp_path)["trial"]


def test_channels_last_switches_weights_and_inputs(tmp_path):
    model, arms, section = run_conv(tmp_path, "channels_last")
    assert [w for w, *_ in model.seen] == [a == "on" for a in arms]
    assert [x for _, x, *_ in model.seen] == [a == "on" for a in arms]
    assert section["status"] == "done" and section["speedup"] is not None
    assert model.conv.weight.is_contiguous()  # off after the trial
    assert "training_step" not in model.__dict__


def test_matmul_precision_switches_and_is_put_back(tmp_path):
    before = torch.get_float32_matmul_precision()
    assert before == "highest"
    model, arms, section = run_conv(tmp_path, "matmul_precision", value="medium")
    assert [p for *_, p in model.seen] == ["medium" if a == "on" else "highest" for a in arms]
    assert torch.get_float32_matmul_precision() == before


def test_autocast_bf16_on_cpu_runs_the_on_arm_under_autocast(tmp_path):
    model, arms, section = run_conv(tmp_path, "autocast_bf16")
    assert [a for _, _, a, _ in model.seen] == [a == "on" for a in arms]
    assert section["status"] == "done"


@pytest.mark.parametrize("change, overrides, match", [
    ("autocast_bf16", dict(precision="bf16-mixed"), "precision is 'bf16-mixed'"),
    ("cudnn_benchmark", {}, "CUDA kernels only"),
    ("tf32", {}, "CUDA kernels only"),
    ("autocast_fp16", {}, "CUDA only"),
])
def test_changes_that_cannot_be_tried_are_refused_at_setup(tmp_path, change, overrides, match):
    with pytest.raises(PerfConfigError, match=rf"ABTrial\(change='{change}'\) cannot be tried.*{match}"):
        fit(tmp_path, [ABTrial(change)], model=Conv(), max_steps=2, **overrides)


def test_channels_last_refused_without_convolutions(tmp_path):
    with pytest.raises(PerfConfigError, match="no 4-d weights"):
        fit(tmp_path, [ABTrial("channels_last")], max_steps=2)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(change="fast_mode"), PerfConfigError, "Possible choices are: cudnn_benchmark"),
    (dict(change="mine", switch_on=nothing), PerfConfigError, "both `switch_on` and `switch_off`"),
    (dict(change="tf32", value="high"), PerfConfigError, "for change='matmul_precision' only"),
    (dict(change="matmul_precision", value="low"), PerfConfigError, "highest, high, medium"),
    (dict(change="tf32", blocks=5), ValueError, r"ABTrial\(blocks=5\)"),
    (dict(change="tf32", order="abab"), ValueError, r"ABTrial\(order='abab'\)"),
    (dict(change="tf32", settle=10), ValueError, r"ABTrial\(settle=10\)"),
])
def test_bad_arguments_are_refused_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        ABTrial(**kwargs)


class FailsUnderChannelsLast(Conv):
    def training_step(self, batch, batch_idx):
        if batch[0].is_contiguous(memory_format=torch.channels_last) and not batch[0].is_contiguous():
            raise RuntimeError("this op has no channels_last kernel")
        return super().training_step(batch, batch_idx)


def test_a_step_that_raises_under_the_change_runs_again_without_it_and_training_goes_on(tmp_path):
    model = FailsUnderChannelsLast()
    trial = ABTrial("channels_last", warmup=4, block=4, blocks=4)
    trainer = fit(tmp_path, [trial], model=model, max_steps=20, max_epochs=10, limit_val_batches=0,
                  num_sanity_val_steps=0)
    assert trainer.global_step == 20
    section = find_summary(tmp_path)["trial"]
    assert section["status"] == "stopped" and "no channels_last kernel" in section["reason"]
    assert "again without it" not in section["reason"]
    assert model.conv.weight.is_contiguous() and "training_step" not in model.__dict__


def test_a_change_that_raises_stops_the_trial_not_training(tmp_path):
    def broken(trainer, module):
        raise RuntimeError("cannot switch")

    trial = ABTrial("broken", switch_on=broken, switch_off=nothing, warmup=4, block=4, blocks=4)
    trainer = fit(tmp_path, [trial], max_steps=30, max_epochs=10)
    assert trainer.global_step == 30
    section = find_summary(tmp_path)["trial"]
    assert section["status"] == "stopped" and "cannot switch" in section["reason"]


class Images(TinyModel):
    """Validation outputs images whose noise grows with the change on: PSNR under it ``psnr_drop`` lower."""

    def __init__(self, noise_factor=1.0):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.noise_factor, self.degrade = noise_factor, False

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return nn.functional.mse_loss(self.conv(x), x)

    def validation_step(self, batch, batch_idx):
        preds, target, noise = batch
        preds = (target + noise * (self.noise_factor if self.degrade else 1.0)).clamp(0, 1)
        return {"preds": preds, "target": target}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.rand(16, 3, 16, 16)), batch_size=4)

    def val_dataloader(self):
        g = torch.Generator().manual_seed(1)
        target = torch.rand(16, 3, 16, 16, generator=g) * 0.8 + 0.1
        noise = 0.02 * torch.randn(target.shape, generator=g)
        return DataLoader(TensorDataset(target, target, noise), batch_size=4)


def degrade_on(trainer, module):
    module.degrade = True


def degrade_off(trainer, module):
    module.degrade = False


@pytest.mark.parametrize("factor, flagged", [(10 ** (0.02 * 34 / 20), True), (1.0, False)])
def test_quality_per_arm_flags_a_two_percent_psnr_loss_with_the_arm_named(tmp_path, factor, flagged):
    """Noise x 10^(0.02 * PSNR/20) lowers a ~34 dB PSNR by about 2%; the gate's tolerance is 0.5%."""
    gate = QualityGate(metrics=["psnr"])
    trial = ABTrial("noisier", switch_on=degrade_on, switch_off=degrade_off, warmup=2, block=2, blocks=4,
                    quality_batches=4)
    fit(tmp_path, [gate, trial], model=Images(factor), max_steps=trial.schedule.total + 2,
        max_epochs=10)
    section = find_summary(tmp_path)["trial"]
    psnr = section["quality"]["metrics"]["psnr"]
    assert section["quality"]["source"] == "quality_gate" and section["quality"]["batches"] == 4
    assert psnr["tolerance_pct"] == pytest.approx(0.5)
    assert psnr["degraded"] is flagged
    assert section["quality_degraded_on"] == (["psnr"] if flagged else [])
    if flagged:
        assert psnr["change_pct"] == pytest.approx(-2.0, abs=0.3)
        assert "psnr -2.0% (OUTSIDE 0.5%)" in section["line"] and section["line"].startswith("ABTrial: with noisier")
    else:
        assert psnr["change_pct"] == pytest.approx(0.0, abs=1e-6)


class Crashing(Conv):
    def training_step(self, batch, batch_idx):
        if self.global_step == 14:
            raise RuntimeError("boom at step 14")
        return super().training_step(batch, batch_idx)


def test_a_crash_mid_trial_leaves_the_change_off_and_a_failed_summary_with_the_trial(tmp_path):
    model = Crashing()
    with pytest.raises(RuntimeError, match="boom at step 14"):
        fit(tmp_path, [ABTrial("channels_last", warmup=4, block=4, blocks=8, order="abba")], model=model,
            max_steps=100, max_epochs=10, limit_val_batches=0, num_sanity_val_steps=0)
    summary = find_summary(tmp_path)
    assert summary["status"] == "failed" and summary["trial"]["status"] == "stopped"
    assert "again without it: the step's own error, not the change's" in summary["trial"]["reason"]
    assert model.conv.weight.is_contiguous() and "training_step" not in model.__dict__  # iteration 14 ran it on


def test_one_instance_two_fits_in_a_row_each_run_a_whole_trial(tmp_path):
    trial = ABTrial("nothing", switch_on=nothing, switch_off=nothing, warmup=2, block=2, blocks=4)
    for folder in ("one", "two"):
        fit(tmp_path / folder, [trial], max_steps=trial.schedule.total + 1, max_epochs=10)
        section = find_summary(tmp_path / folder)["trial"]
        assert section["status"] == "done" and section["pairs"] == 2 and "measurement_failures" not in section


def test_quality_per_arm_reads_an_absolute_tolerance_against_the_off_arm(tmp_path):
    gate = QualityGate(metrics=["psnr"], tolerance=1.0, tolerance_mode="absolute")  # 1 dB
    trial = ABTrial("noisier", switch_on=degrade_on, switch_off=degrade_off, warmup=2, block=2, blocks=4)
    fit(tmp_path, [gate, trial], model=Images(10 ** (0.02 * 34 / 20)), max_steps=trial.schedule.total + 2,
        max_epochs=10)
    psnr = find_summary(tmp_path)["trial"]["quality"]["metrics"]["psnr"]
    assert psnr["tolerance_pct"] == pytest.approx(100.0 / psnr["off"])  # 1 dB of ~34: ~2.9%
    assert psnr["degraded"] is False  # a 2% (0.7 dB) loss is within 1 dB


def test_from_lightning_cli_yaml(tmp_path):
    import yaml
    from helpers import TinyModel as Tiny
    from lightning.pytorch.cli import LightningCLI

    config = {"trainer": {"default_root_dir": str(tmp_path), "max_steps": 12, "max_epochs": 5, "accelerator": "cpu",
                          "devices": 1, "enable_progress_bar": False,
                          "callbacks": [{"class_path": "lightning_perf.ABTrial",
                                         "init_args": {"change": "matmul_precision", "value": "medium",
                                                       "warmup": 2, "block": 2, "blocks": 4}}]}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    LightningCLI(Tiny, args=["fit", "--config", str(path)], save_config_kwargs={"overwrite": True})
    section = find_summary(tmp_path)["trial"]
    assert section["change"] == "matmul_precision" and section["status"] == "done" and section["pairs"] == 2
