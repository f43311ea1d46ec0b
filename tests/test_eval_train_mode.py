"""EvalNoGradGuard's training-mode check: evaluation run with BatchNorm or Dropout in training mode, found in
validation, test, predict and ``phase("eval_in_train_hooks")``, with the modules named and BatchNorm's running
statistics checked against the model's own counters."""

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from torch import nn

from helpers import TinyModel, find_summary, fit, read_scalars, trainer_kwargs
from lightning_perf import EvalNoGradGuard, phase
from lightning_perf.errors import PerfCheckFailed


class BatchNormModel(TinyModel):
    """TinyModel with a BatchNorm1d in its net (at ``net.1``); ``train_in_validation_step`` calls ``self.train()``
    at the top of each validation step, as a step that reuses training code might."""

    def __init__(self, train_in_validation_step=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
        self.train_in_validation_step = train_in_validation_step

    def validation_step(self, batch, batch_idx):
        if self.train_in_validation_step:
            self.train()
        return super().validation_step(batch, batch_idx)


class DropoutModel(TinyModel):
    """TinyModel with a Dropout at ``net.2``; ``train_after_step`` calls ``self.train()`` at the end of each
    validation step, so the first batch of a run is evaluated in eval mode and the others in training mode. It
    counts its own validation forwards with the dropout in training mode."""

    def __init__(self, train_after_step=False):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 1))
        self.train_after_step = train_after_step
        self.dropout_forwards_in_training = 0

    def validation_step(self, batch, batch_idx):
        self.dropout_forwards_in_training += int(self.net[2].training)
        loss = super().validation_step(batch, batch_idx)
        if self.train_after_step:
            self.train()
        return loss


class TrainsAtEvalStart(Callback):
    """A callback that switches the module back to training mode as each evaluation run starts."""

    def on_validation_start(self, trainer, pl_module):
        pl_module.train()

    on_test_start = on_predict_start = on_validation_start


def guard_section(tmp_path):
    return find_summary(tmp_path)["eval_no_grad_guard"]


def test_batchnorm_validated_in_training_mode_is_found_with_module_and_changed_statistics(tmp_path):
    model = BatchNormModel(train_in_validation_step=True)
    with pytest.warns(UserWarning, match=r"validation ran with 1 module in training mode \(BatchNorm1d net\.1\): 1"
                                         r" forward; BatchNorm normalised with batch statistics and changed its"
                                         r" running statistics\. Call `model.eval\(\)`"):
        trainer = fit(tmp_path, [EvalNoGradGuard()], model=model, max_epochs=1)
    g = guard_section(tmp_path)
    assert g["clean"] is False and g["check_train_mode"] is True
    (finding,) = g["train_mode_findings"]
    assert finding["phase"] == "validation" and finding["site"] is None
    assert finding["modules"] == ["net.1"] and finding["module_types"] == ["BatchNorm1d"]
    assert finding["module_count"] == 1 and finding["running_stats_changed"] is True
    assert finding["runs"] == 2  # the sanity check and the epoch's validation
    # the BatchNorm's own counter: one per training step, the rest from evaluation (1 sanity + 4 validation batches)
    evaluated = int(model.net[1].num_batches_tracked) - trainer.global_step
    assert finding["forwards"] == evaluated == 5
    assert g["train_mode_eval_forwards"] == 5
    assert read_scalars(tmp_path)["guard/train_mode_eval_forwards"][-1][1] == 5
    # the autograd check is untouched: validation ran under no_grad
    assert g["findings"] == [] and g["grad_enabled_eval_forwards"] == 0


def test_dropout_active_in_evaluation_is_found_also_after_the_first_batch(tmp_path):
    model = DropoutModel(train_after_step=True)
    with pytest.warns(UserWarning, match=r"validation ran with 1 module in training mode \(Dropout net\.2\): 3"
                                         r" forwards; dropout was active\."):
        fit(tmp_path, [EvalNoGradGuard()], model=model, max_epochs=1)
    (finding,) = guard_section(tmp_path)["train_mode_findings"]
    # each run's first batch in eval mode (Lightning's model.eval()), the next ones in training mode: the sanity
    # check's one batch never, the epoch's four batches three times
    assert finding["forwards"] == model.dropout_forwards_in_training == 3
    assert finding["modules"] == ["net.2"] and finding["module_types"] == ["Dropout"]
    assert finding["running_stats_changed"] is False and finding["runs"] == 1


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_evaluation_switched_to_training_mode_by_a_callback_is_found_under_inference_mode(tmp_path, stage):
    model = BatchNormModel()
    model.net.insert(3, nn.Dropout(0.1))
    model.test_step = model.validation_step
    model.test_dataloader = model.predict_dataloader = model.val_dataloader
    model.predict_step = lambda batch, batch_idx: model(batch[0])
    guard = EvalNoGradGuard()
    trainer = Trainer(callbacks=[guard, TrainsAtEvalStart()], **trainer_kwargs(tmp_path))
    before = int(model.net[1].num_batches_tracked)
    with pytest.warns(UserWarning, match=r"ran with 2 modules in training mode \(BatchNorm1d net\.1; Dropout net\.3\)"):
        getattr(trainer, stage)(model)
    (finding,) = guard.train_mode_findings
    assert finding["phase"] == {"validate": "validation"}.get(stage, stage)
    assert finding["modules"] == ["net.1", "net.3"] and finding["module_count"] == 2
    assert finding["forwards"] == int(model.net[1].num_batches_tracked) - before == 4  # 32 items in batches of 8
    assert finding["running_stats_changed"] is True


class EvaluatesInTrainHook(BatchNormModel):
    """Seed 001's held-out sampling from a training hook, marked as a phase: at batches 2 and 5, two forwards of
    held-out data, in training mode unless ``eval_mode``."""

    def __init__(self, eval_mode=False):
        super().__init__()
        self.eval_mode = eval_mode

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx not in (2, 5):
            return
        with phase("eval_in_train_hooks"), torch.no_grad():
            if self.eval_mode:
                self.eval()
            for _ in range(2):
                self(torch.randn(8, 16))
            self.train()


def test_evaluation_in_a_training_hook_phase_is_found_with_its_site(tmp_path):
    model = EvaluatesInTrainHook()
    with pytest.warns(UserWarning, match=r"EvaluatesInTrainHook.on_train_batch_end ran `phase\('eval_in_train_hooks'\)`"
                                         r" with 1 module in training mode \(BatchNorm1d net\.1\): 2 forwards"):
        trainer = fit(tmp_path, [EvalNoGradGuard()], model=model, max_epochs=1)
    g = guard_section(tmp_path)
    assert [f["phase"] for f in g["train_mode_findings"]] == ["eval_in_train_hooks"]
    (finding,) = g["train_mode_findings"]
    assert finding["site"] == "EvaluatesInTrainHook.on_train_batch_end"
    assert finding["runs"] == 2 and finding["forwards"] == 4 and finding["running_stats_changed"] is True
    # the model's own counter: 8 training steps and 4 sampled forwards; validation ran in eval mode
    assert int(model.net[1].num_batches_tracked) - trainer.global_step == 4


def test_raise_mode_fails_the_fit_after_a_phase_in_training_mode(tmp_path):
    with pytest.raises(PerfCheckFailed, match=r"EvalNoGradGuard: EvaluatesInTrainHook.on_train_batch_end ran"
                                              r" `phase\('eval_in_train_hooks'\)` with 1 module in training mode"):
        fit(tmp_path, [EvalNoGradGuard(mode="raise")], model=EvaluatesInTrainHook(), max_epochs=1)
    with pytest.raises(PerfCheckFailed, match=r"validation ran with 1 module in training mode"):
        fit(tmp_path / "val", [EvalNoGradGuard(mode="raise")], model=BatchNormModel(True), max_epochs=1)


def test_fix_mode_reports_training_mode_as_warn_does_and_changes_nothing(tmp_path):
    model = BatchNormModel(train_in_validation_step=True)
    with pytest.warns(UserWarning, match=r"validation ran with 1 module in training mode"):
        trainer = fit(tmp_path, [EvalNoGradGuard(mode="fix")], model=model, max_epochs=1)
    (finding,) = guard_section(tmp_path)["train_mode_findings"]
    assert finding["forwards"] == int(model.net[1].num_batches_tracked) - trainer.global_step == 5


def test_correct_models_in_eval_mode_report_clean(tmp_path, recwarn):
    bn = EvaluatesInTrainHook(eval_mode=True)
    fit(tmp_path / "bn", [EvalNoGradGuard()], model=bn, max_epochs=1)
    fit(tmp_path / "dropout", [EvalNoGradGuard()], model=DropoutModel(), max_epochs=1)
    for run in ("bn", "dropout"):
        g = guard_section(tmp_path / run)
        assert g["clean"] is True and g["train_mode_findings"] == [] and g["train_mode_eval_forwards"] == 0, run
    assert int(bn.net[1].num_batches_tracked) == 8  # the training steps' alone
    assert not [w for w in recwarn if "EvalNoGradGuard" in str(w.message)]
    # PyTorch's module hooks are all given back
    assert all(not m._forward_pre_hooks for m in bn.modules())


def test_check_off_says_so_and_names_are_bounded(tmp_path):
    fit(tmp_path / "off", [EvalNoGradGuard(check_train_mode=False)], model=BatchNormModel(True), max_epochs=1)
    g = guard_section(tmp_path / "off")
    assert g["train_mode_eval_forwards"] is None and g["train_mode_findings"] == []
    assert g["unavailable"]["train_mode_eval_forwards"] == "not checked: EvalNoGradGuard(check_train_mode=False)"

    wide = BatchNormModel(True)
    wide.net = nn.Sequential(nn.Linear(16, 32), *[nn.BatchNorm1d(32) for _ in range(20)], nn.Linear(32, 1))
    with pytest.warns(UserWarning, match=r"with 20 modules in training mode .* and 4 more\): 1 forward;"):
        fit(tmp_path / "wide", [EvalNoGradGuard()], model=wide, max_epochs=1)
    (finding,) = guard_section(tmp_path / "wide")["train_mode_findings"]
    assert finding["module_count"] == 20 and finding["modules"] == [f"net.{i}" for i in range(1, 17)]


def test_bad_check_train_mode_is_refused():
    with pytest.raises(ValueError, match=r"EvalNoGradGuard\(check_train_mode=.*Expected True or False"):
        EvalNoGradGuard(check_train_mode="yes")


def test_dropout_inside_torch_compile_is_found_by_its_mode_and_its_forwards_left_uncounted(tmp_path):
    """Code compiled before the guard's hooks were put on its submodules does not run them: the Dropout is found by
    its training flag and its forwards are not counted (null, with the reason); the BatchNorm beside it is counted
    by its own counter."""
    model = BatchNormModel()
    model.net.insert(3, nn.Dropout(0.1))
    model.net = torch.compile(model.net, backend="eager")  # Dynamo without a C++ compiler
    with torch.inference_mode():  # compiled for this mode before the guard's hooks exist, as by a first validation
        model.net(torch.randn(8, 16))
    guard = EvalNoGradGuard()
    trainer = Trainer(callbacks=[guard, TrainsAtEvalStart()], **trainer_kwargs(tmp_path))
    with pytest.warns(UserWarning, match=r"validation ran with 2 modules in training mode \(BatchNorm1d"
                                         r" net\._orig_mod\.1; Dropout net\._orig_mod\.3\): 4 forwards"
                                         r" \(net\._orig_mod\.3 inside torch.compile: not counted\)"):
        trainer.validate(model)
    (finding,) = guard.train_mode_findings
    assert finding["uncounted"] == ["net._orig_mod.3"] and finding["forwards"] == 4
    section = guard.summary_section()
    assert section["train_mode_eval_forwards"] is None
    assert "net._orig_mod.3 ran in training mode inside a torch.compile'd module" in \
        section["unavailable"]["train_mode_eval_forwards"]


def test_report_says_under_the_table_which_run_evaluated_in_training_mode(tmp_path):
    import json
    import subprocess
    import sys

    with pytest.warns(UserWarning, match="in training mode"):
        fit(tmp_path / "mistaken", [EvalNoGradGuard()], model=EvaluatesInTrainHook(), max_epochs=1)
    fit(tmp_path / "sound", [EvalNoGradGuard()], model=EvaluatesInTrainHook(eval_mode=True), max_epochs=1)
    paths = []
    for run in ("sound", "mistaken"):
        path = tmp_path / f"{run}.json"
        path.write_text(json.dumps(find_summary(tmp_path / run)))
        paths.append(str(path))
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "report", *paths, "--names", "sound", "mistaken"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert ("- mistaken: evaluation ran modules in training mode (eval_in_train_hooks: net.1); BatchNorm's running"
            " statistics changed: its quality figures are not the model's in eval mode (EvalNoGradGuard)") in proc.stdout
    assert "- sound:" not in proc.stdout
