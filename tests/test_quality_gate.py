import json
import urllib.error

import numpy as np
import pytest
import torch
import torchmetrics
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from skimage.metrics import peak_signal_noise_ratio, structural_similarity
from torchmetrics.functional import mean_absolute_error
from torchmetrics.functional.image import peak_signal_noise_ratio as tm_psnr
from torchmetrics.functional.image import structural_similarity_index_measure as tm_ssim

from helpers import ImageModel, find_summary, fit, read_scalars, trainer_kwargs
from lightning_perf import QualityGate
from lightning_perf.measure.quality import image_quality
from lightning_perf.summary.compare import compare_summaries

IMAGE = ["psnr", "ssim", "l1"]


@pytest.fixture(autouse=True)
def _lpips_not_tried_yet(monkeypatch):
    """Each test loads LPIPS as a fresh process would: a failure another test simulated is not remembered."""
    monkeypatch.setattr(image_quality, "_LPIPS_FAILURES", {})


def reference_values():
    preds, target = ImageModel().val_pairs()
    p, t = preds.numpy(), target.numpy()
    psnr = np.mean([peak_signal_noise_ratio(t[i], p[i], data_range=1.0) for i in range(len(p))])
    ssim = np.mean([structural_similarity(t[i], p[i], data_range=1.0, channel_axis=0, gaussian_weights=True,
                                          sigma=1.5, use_sample_covariance=False) for i in range(len(p))])
    l1 = np.abs(p - t).mean()
    functional = {
        "psnr": float(tm_psnr(preds, target, data_range=1.0, dim=(1, 2, 3))),
        "ssim": float(tm_ssim(preds, target, data_range=1.0)),
        "l1": float((preds - target).abs().mean()),
    }
    return {"psnr": psnr, "ssim": ssim, "l1": l1}, functional


def gate_fit(tmp_path, **kwargs):
    kwargs.setdefault("metrics", IMAGE)
    gate = QualityGate(**kwargs)
    fit(tmp_path, [gate], model=ImageModel(), max_epochs=2)
    return gate, find_summary(tmp_path)


def test_metrics_match_torchmetrics_functional_and_scikit_image(tmp_path):
    outside, functional = reference_values()
    _, summary = gate_fit(tmp_path)
    metrics = summary["quality_gate"]["metrics"]
    for name in IMAGE:
        assert metrics[name]["value"] == pytest.approx(functional[name], rel=1e-5), name
        assert metrics[name]["value"] == pytest.approx(outside[name], rel=2e-3), name
    assert summary["quality_gate"]["passed"] is None  # no baseline: measured, not gated
    scalars = read_scalars(tmp_path)
    for name in IMAGE:
        assert scalars[f"quality/{name}"][-1][1] == pytest.approx(functional[name], rel=1e-5)


@pytest.mark.parametrize("name", ["psnr", "ssim", "l1"])
def test_within_tolerance_passes_and_just_past_fails_in_each_direction(tmp_path, name):
    _, functional = reference_values()
    value = functional[name]
    better_up = name != "l1"
    # the baseline 0.4% better than this run: within 0.5%; 0.6% better: past it
    for shift, expected in ((0.004, True), (0.006, False)):
        baseline = {name: value * (1 + shift) if better_up else value * (1 - shift)}
        _, summary = gate_fit(tmp_path / f"{shift}", metrics=[name], baseline=baseline)
        result = summary["quality_gate"]["metrics"][name]
        assert result["passed"] is expected, (name, shift, result)
        assert summary["quality_gate"]["passed"] is expected
        assert result["mode"] == ("max" if better_up else "min")


def test_absolute_tolerance_per_metric(tmp_path):
    _, functional = reference_values()
    baseline = {"psnr": functional["psnr"] + 0.2, "l1": functional["l1"] * 1.01}  # this run's L1 is lower: better
    _, summary = gate_fit(tmp_path, metrics=["psnr", "l1"], baseline=baseline,
                          tolerance={"psnr": 0.25, "l1": 0.0}, tolerance_mode={"psnr": "absolute"})
    metrics = summary["quality_gate"]["metrics"]
    assert metrics["psnr"]["passed"] is True and metrics["psnr"]["tolerance_mode"] == "absolute"
    assert metrics["l1"]["passed"] is True and metrics["l1"]["tolerance"] == 0.0


def test_record_baseline_then_gate_against_it_and_against_a_summary(tmp_path):
    base = tmp_path / "baseline.json"
    gate_fit(tmp_path / "first", record_baseline=str(base))
    recorded = json.loads(base.read_text())
    assert set(recorded["metrics"]) == set(IMAGE)
    _, second = gate_fit(tmp_path / "second", baseline=str(base))
    assert second["quality_gate"]["passed"] is True
    first_summary = next((tmp_path / "first").rglob("perf_summary.json"))
    _, third = gate_fit(tmp_path / "third", baseline=str(first_summary))
    assert third["quality_gate"]["passed"] is True
    comparison = compare_summaries(second, third)
    assert set(comparison["quality"]) == set(IMAGE)
    assert comparison["quality"]["psnr"]["delta"] == pytest.approx(0.0)


def test_action_fail_fails_the_fit_after_writing_the_summary(tmp_path):
    _, functional = reference_values()
    with pytest.raises(RuntimeError, match=r"QualityGate: 2 of 2 checks failed \(action='fail'\)"):
        gate_fit(tmp_path, metrics=["psnr"], baseline={"psnr": functional["psnr"] + 1.0}, action="fail")
    summary = find_summary(tmp_path)
    assert summary["status"] == "failed" and "QualityGate" in summary["error"]["message"]
    assert summary["quality_gate"]["passed"] is False
    assert summary["quality_gate"]["failed_checks"][0]["metrics"] == ["psnr"]
    assert read_scalars(tmp_path)["quality/gate_passed"][-1][1] == 0.0


def test_action_stop_stops_at_the_first_failing_check(tmp_path):
    _, functional = reference_values()
    gate = QualityGate(metrics=["psnr"], baseline={"psnr": functional["psnr"] + 1.0}, action="stop")
    trainer = fit(tmp_path, [gate], model=ImageModel(), max_epochs=5)
    assert trainer.current_epoch == 1 and trainer.global_step == 4  # stopped after the first epoch's check
    assert find_summary(tmp_path)["quality_gate"]["checks"] == 1


def test_at_steps_and_every_n_steps_choose_the_checks(tmp_path):
    _, summary = gate_fit(tmp_path / "at", at_steps=[8])
    assert summary["quality_gate"]["checks"] == 1 and summary["quality_gate"]["step"] == 8
    _, summary = gate_fit(tmp_path / "every", every_n_steps=4)
    assert summary["quality_gate"]["checks"] == 2


def test_named_metric_gate_and_model_checkpoint_on_quality(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="quality/psnr", mode="max")
    gate = QualityGate(metrics=["psnr"], monitor={"val_l1": "min"}, baseline={"psnr": 1.0, "val_l1": 1.0})
    fit(tmp_path, [gate, ckpt], model=ImageModel(), max_epochs=2)
    metrics = find_summary(tmp_path)["quality_gate"]["metrics"]
    assert metrics["val_l1"]["passed"] is True and metrics["val_l1"]["mode"] == "min"
    assert ckpt.best_model_score is not None and ckpt.best_model_path


def go_offline(monkeypatch):
    """The backbone's download fails as it does without internet; returns the list of download attempts."""
    import torchvision.models._api

    attempts = []

    def offline(url, *args, **kwargs):
        attempts.append(url)
        raise urllib.error.URLError("Name or service not known")

    # torchvision downloads through its own import of torch.hub's function: patched where it is called
    monkeypatch.setattr(torchvision.models._api, "load_state_dict_from_url", offline)
    return attempts


def test_lpips_offline_is_unavailable_and_the_rest_is_gated(tmp_path, monkeypatch):
    attempts = go_offline(monkeypatch)
    _, functional = reference_values()
    baseline = {**functional, "lpips": 0.1}
    with pytest.warns(UserWarning, match="LPIPS is unavailable and not gated: the pretrained alex backbone"):
        _, summary = gate_fit(tmp_path, metrics=["psnr", "ssim", "l1", "lpips"], baseline=baseline)
    g = summary["quality_gate"]
    assert "URLError" in g["unavailable"]["lpips"] and "lpips_weights_dir" in g["unavailable"]["lpips"]
    assert "lpips" not in g["metrics"] and g["lpips"]["available"] is False
    assert g["passed"] is True and set(g["metrics"]) == set(IMAGE)
    assert len(attempts) == 1


def test_lpips_with_a_random_backbone_computes_through_the_same_path(tmp_path):
    gate, summary = gate_fit(tmp_path, metrics=["lpips"], lpips_pretrained=False)
    preds, target = ImageModel().val_pairs()
    with torch.no_grad():
        expected = float(gate._lpips_model(preds * 2 - 1, target * 2 - 1).mean())
    value = summary["quality_gate"]["metrics"]["lpips"]["value"]
    assert value == pytest.approx(expected, rel=1e-5) and value > 0
    assert summary["quality_gate"]["lpips"]["backbone"].startswith("random")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"metrics": ["psnr", "fid"]}, r"QualityGate\(metrics=\['psnr', 'fid'\]\).*psnr, ssim, l1, lpips"),
        ({"action": "explode"}, r"QualityGate\(action='explode'\).*warn, fail, stop"),
        ({"tolerance": -0.1}, r"QualityGate\(tolerance=-0.1\).*from 0 to"),
        ({"tolerance_mode": "percent"}, r"relative, absolute"),
        ({"monitor": {"val/acc": "up"}}, r"'val/acc' -> 'max' or 'min'"),
        ({"baseline": "/no/such/baseline.json"}, r"baseline file /no/such/baseline.json: no such file"),
        ({"baseline": {"psnr": 26.0}}, r"lacks gated metric\(s\) ssim, l1, lpips; it has: psnr"),
        ({"lpips_net": "resnet"}, r"alex, vgg, squeeze"),
        ({"at_steps": [-1]}, r"QualityGate\(at_steps=\[-1\]\)"),
        ({"data_range": 0}, r"QualityGate\(data_range=0\)"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QualityGate(**kwargs)


def test_baseline_file_that_is_not_json(tmp_path):
    bad = tmp_path / "b.json"
    bad.write_text("psnr: 26")
    with pytest.raises(ValueError, match=r"baseline file .*b\.json: not valid JSON"):
        QualityGate(baseline=str(bad))


class WrongOutputs(ImageModel):
    def validation_step(self, batch, batch_idx):
        preds, target = batch
        return {"prediction": preds, "target": target}


class WrongShapes(ImageModel):
    def validation_step(self, batch, batch_idx):
        preds, target = batch
        return preds[:, :, :16], target


@pytest.mark.parametrize(
    "model, match",
    [(WrongOutputs(), r"has no 'preds'; it has keys \['prediction', 'target'\]"),
     (WrongShapes(), r"differ in shape: \(4, 3, 16, 32\) vs \(4, 3, 32, 32\)")],
)
def test_bad_outputs_fail_at_the_sanity_check_before_training(tmp_path, model, match):
    gate = QualityGate(metrics=IMAGE)
    with pytest.raises(ValueError, match=match):
        fit(tmp_path, [gate], model=model, max_epochs=1)
    assert model.global_step == 0


def test_a_monitored_name_that_was_not_logged(tmp_path):
    with pytest.raises(ValueError, match=r"monitored metric 'val/acc' was not logged"):
        fit(tmp_path, [QualityGate(metrics=[], monitor={"val/acc": "max"})], model=ImageModel(), max_epochs=1)


@pytest.mark.slow
def test_ddp_gives_the_numbers_of_one_process(tmp_path):
    _, functional = reference_values()
    fit(tmp_path, [QualityGate(metrics=IMAGE)], model=ImageModel(), strategy="ddp_spawn", devices=2, max_epochs=1)
    metrics = find_summary(tmp_path)["quality_gate"]["metrics"]
    for name in IMAGE:
        assert metrics[name]["value"] == pytest.approx(functional[name], rel=1e-5), name


def test_a_metric_the_baseline_run_could_not_measure_is_not_gated(tmp_path, monkeypatch):
    go_offline(monkeypatch)
    with pytest.warns(UserWarning, match="LPIPS is unavailable"):
        gate_fit(tmp_path / "base", metrics=IMAGE + ["lpips"])
    base = next((tmp_path / "base").rglob("perf_summary.json"))
    monkeypatch.undo()
    with pytest.warns(UserWarning, match="lpips is measured but not gated: the baseline run could not measure it"):
        _, summary = gate_fit(tmp_path / "cand", metrics=IMAGE + ["lpips"], baseline=str(base), lpips_pretrained=False)
    g = summary["quality_gate"]
    assert g["passed"] is True and g["metrics"]["lpips"]["passed"] is None
    assert "could not measure" in g["unavailable"]["lpips_verdict"]


class DivergedModel(ImageModel):
    """Validation predictions are NaN: what a diverged model produces."""

    def validation_step(self, batch, batch_idx):
        out = super().validation_step(batch, batch_idx)
        return {"preds": torch.full_like(out["preds"], float("nan")), "target": out["target"]}


def test_a_diverged_model_fails_the_gate_and_records_no_baseline(tmp_path):
    from lightning_perf import PerfCheckFailed

    _, functional = reference_values()
    gate = QualityGate(metrics=["psnr", "l1"], baseline={"psnr": functional["psnr"], "l1": functional["l1"]},
                       action="fail", record_baseline=str(tmp_path / "base.json"))
    with pytest.raises(PerfCheckFailed, match="checks failed"):
        fit(tmp_path, [gate], model=DivergedModel(), max_epochs=1)
    q = find_summary(tmp_path)["quality_gate"]
    assert q["passed"] is False and q["failed_check_count"] == 1
    assert q["metrics"]["psnr"]["passed"] is False and "nan" in q["metrics"]["psnr"]["reason"]
    assert not (tmp_path / "base.json").exists() and "no finite value" in q["unavailable"]["recorded_baseline"]


def test_nan_without_a_baseline_is_still_said(tmp_path):
    with pytest.warns(UserWarning, match="psnr is nan"):
        fit(tmp_path, [QualityGate(metrics=["psnr"])], model=DivergedModel(), max_epochs=1)


def test_one_validation_logs_all_its_quality_keys_at_one_step_and_no_key_twice(tmp_path):
    _, functional = reference_values()
    gate_fit(tmp_path, baseline={n: functional[n] for n in IMAGE})
    scalars = read_scalars(tmp_path)
    steps = {tag: [s for s, _ in scalars[tag]] for tag in ("quality/psnr", "quality/ssim", "quality/l1",
                                                           "quality/gate_passed")}
    assert len(set(map(tuple, steps.values()))) == 1 and len(steps["quality/psnr"]) == 2, steps
    for tag, points in scalars.items():
        assert len({s for s, _ in points}) == len(points), f"{tag} logged twice at one step: {points}"


def test_a_baseline_that_scored_a_different_number_of_images_is_warned_about(tmp_path):
    base = tmp_path / "base.json"
    gate_fit(tmp_path / "a", record_baseline=str(base))
    assert json.loads(base.read_text())["images"] == 16
    gate = QualityGate(metrics=IMAGE, baseline=str(base))
    with pytest.warns(UserWarning, match="scored 8 images, the baseline scored 16"):
        fit(tmp_path / "b", [gate], model=ImageModel(n_val=8), max_epochs=1)
    assert find_summary(tmp_path / "b")["quality_gate"]["images_scored"] == 8


def test_lpips_is_not_loaded_without_a_validation_loop(tmp_path):
    gate = QualityGate(metrics=["psnr", "lpips"], lpips_pretrained=False)
    fit(tmp_path, [gate], model=ImageModel(), max_epochs=1, limit_val_batches=0, num_sanity_val_steps=0)
    assert gate._lpips_model is None and gate._lpips_reason is None


def test_fit_end_prints_every_failed_check_and_the_verdict(tmp_path, caplog):
    _, functional = reference_values()
    with caplog.at_level("INFO"):
        gate_fit(tmp_path, baseline={**{n: functional[n] for n in IMAGE}, "psnr": functional["psnr"] + 1.0})
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("QualityGate:"))
    assert "FAILED 2 of 2 checks (step 4: psnr; step 8: psnr)" in line, line


# -- any memory layout; a gate that scored nothing -------------------------------------------------------------------

LAYOUTS = {
    "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last),
    "transposed": lambda t: t.transpose(2, 3),  # a non-contiguous view: other strides, the same storage
}


class LaidOutModel(ImageModel):
    """Validation outputs in another memory layout than torch's default (a channels_last model's)."""

    def __init__(self, layout: str) -> None:
        super().__init__()
        self.layout = layout

    def validation_step(self, batch, batch_idx):
        out = super().validation_step(batch, batch_idx)
        return {k: LAYOUTS[self.layout](v) for k, v in out.items()}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_outputs_in_any_memory_layout_score_as_their_contiguous_copy(tmp_path, layout):
    preds, target = (LAYOUTS[layout](t) for t in ImageModel().val_pairs())
    assert not preds.is_contiguous()
    preds, target = preds.contiguous(), target.contiguous()  # the same images, torch's default layout
    gate = QualityGate(metrics=IMAGE + ["lpips"], lpips_pretrained=False)
    fit(tmp_path, [gate], model=LaidOutModel(layout), max_epochs=1)
    q = find_summary(tmp_path)["quality_gate"]
    with torch.no_grad():
        expected = {"psnr": float(tm_psnr(preds, target, data_range=1.0, dim=(1, 2, 3))),
                    "ssim": float(tm_ssim(preds, target, data_range=1.0)),
                    "l1": float(mean_absolute_error(preds, target)),
                    "lpips": float(gate._lpips_model(preds * 2 - 1, target * 2 - 1).mean())}
    for name, value in expected.items():
        assert q["metrics"][name]["value"] == pytest.approx(value, rel=1e-5), (name, q["metrics"][name])
    assert q["images_scored"] == 16 and "measurement_failures" not in q


def broken_l1_update(monkeypatch):
    """L1's update fails as it did on channels_last outputs: the measurement breaks, not the model."""
    def update(self, preds, target):
        raise RuntimeError("view size is not compatible with input tensor's size and stride")

    monkeypatch.setattr(torchmetrics.MeanAbsoluteError, "update", update)


def test_a_gate_that_scored_nothing_is_not_checked_with_the_reason_not_a_diverged_model(tmp_path, monkeypatch):
    from lightning_perf import PerfCheckFailed

    broken_l1_update(monkeypatch)
    _, functional = reference_values()
    gate = QualityGate(metrics=["l1"], baseline={"l1": functional["l1"]}, action="fail")
    with pytest.raises(PerfCheckFailed, match=r"never checked: .*l1 could not score .*view size is not compatible"):
        fit(tmp_path, [gate], model=ImageModel(), max_epochs=2)
    q = find_summary(tmp_path)["quality_gate"]
    assert q["passed"] is False and q["reason"].startswith("never checked:") and "view size" in q["reason"]
    assert q["checks"] == 0 and q["failed_check_count"] == 0 and q["images_scored"] in (None, 0)
    assert "diverged" not in json.dumps(q)
    assert q["metrics"]["l1"]["value"] is None and q["metrics"]["l1"]["passed"] is None
    assert q["metrics"]["l1"]["reason"].startswith("not checked: could not score")
    assert "quality/gate_passed" not in read_scalars(tmp_path)  # no verdict was logged


def test_a_metric_that_could_not_score_leaves_the_gate_not_passed_and_the_others_checked(tmp_path, monkeypatch):
    broken_l1_update(monkeypatch)
    _, functional = reference_values()
    with pytest.warns(UserWarning, match=r"l1 could not score the validation outputs \(RuntimeError: view size"):
        _, summary = gate_fit(tmp_path, metrics=["psnr", "l1"],
                              baseline={"psnr": functional["psnr"], "l1": functional["l1"]})
    q = summary["quality_gate"]
    assert q["metrics"]["psnr"]["passed"] is True and q["metrics"]["psnr"]["value"] == pytest.approx(functional["psnr"])
    assert q["metrics"]["l1"]["passed"] is None and "view size" in q["metrics"]["l1"]["reason"]
    assert q["checks"] == 2 and q["failed_check_count"] == 0 and q["images_scored"] == 16
    assert q["passed"] is False
    assert q["reason"].startswith("not checked at 2 validations; first at step 4: l1 could not score")
    assert "diverged" not in json.dumps(q)


def test_without_a_baseline_a_gate_that_scored_nothing_says_why(tmp_path, monkeypatch):
    broken_l1_update(monkeypatch)
    _, summary = gate_fit(tmp_path, metrics=["l1"])
    q = summary["quality_gate"]
    assert q["passed"] is None and "view size" in q["unavailable"]["metrics"]
    assert "diverged" not in json.dumps(q)


def test_a_baseline_nested_too_deeply_gives_the_cli_readers_one_line_error(tmp_path):
    from lightning_perf.summary.io import load_summary
    from lightning_perf.summary.schema import SummaryError

    deep = tmp_path / "deep.json"
    deep.write_text('{"psnr": ' * 200_000 + "1" + "}" * 200_000)
    with pytest.raises(SummaryError) as cli_error:
        load_summary(str(deep))
    with pytest.raises(ValueError) as gate_error:
        QualityGate(metrics=["psnr"], baseline=str(deep))
    assert str(cli_error.value) in str(gate_error.value) and "\n" not in str(gate_error.value)
    assert str(gate_error.value).startswith("Unsupported parameter value `QualityGate(baseline=")


def test_lpips_that_cannot_load_offline_is_tried_once_per_process(tmp_path, monkeypatch, recwarn):
    attempts = go_offline(monkeypatch)
    _, functional = reference_values()
    for run in ("first", "second"):
        _, summary = gate_fit(tmp_path / run, metrics=IMAGE + ["lpips"], baseline={**functional, "lpips": 0.1})
        q = summary["quality_gate"]
        assert "URLError" in q["unavailable"]["lpips"] and q["lpips"]["available"] is False, run
        assert q["passed"] is True and set(q["metrics"]) == set(IMAGE), run  # the other metrics carry on
    assert len(attempts) == 1  # the second fit did not try (and wait on) the download again
    assert "not tried again: it failed earlier in this process" in q["unavailable"]["lpips"]
    said = [w for w in recwarn if "LPIPS is unavailable" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in said]


class KeepOutputs(Callback):
    """What validation_step returned, as the gate saw it: the images torchmetrics scores independently below."""

    def __init__(self) -> None:
        self.preds, self.target = [], []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self.preds.append(outputs["preds"].detach().clone())
            self.target.append(outputs["target"].detach().clone())


def test_the_demo_denoiser_in_channels_last_is_scored(tmp_path):
    """Seed 002's matrix variant: `--model.channels_last=true` on the demo's DenoiseNet."""
    from denoise import DenoiseDataModule, DenoiseNet

    kept, gate = KeepOutputs(), QualityGate(metrics=IMAGE)
    trainer = Trainer(callbacks=[gate, kept], **trainer_kwargs(tmp_path, max_epochs=1))
    trainer.fit(DenoiseNet(channels=8, depth=3, channels_last=True),
                datamodule=DenoiseDataModule(batch_size=4, patch_size=32, train_samples=8, val_samples=8))
    preds, target = torch.cat(kept.preds), torch.cat(kept.target)
    assert preds.is_contiguous(memory_format=torch.channels_last) and not preds.is_contiguous()
    preds, target = preds.contiguous(), target.contiguous()
    q = find_summary(tmp_path)["quality_gate"]
    assert q["images_scored"] == len(preds) == 8 and "measurement_failures" not in q
    assert q["metrics"]["psnr"]["value"] == pytest.approx(float(tm_psnr(preds, target, data_range=1.0,
                                                                         dim=(1, 2, 3))), rel=1e-5)
    assert q["metrics"]["ssim"]["value"] == pytest.approx(float(tm_ssim(preds, target, data_range=1.0)), rel=1e-5)
    assert q["metrics"]["l1"]["value"] == pytest.approx(float(mean_absolute_error(preds, target)), rel=1e-5)
