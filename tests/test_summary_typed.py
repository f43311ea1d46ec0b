"""Every field a callback writes into perf_summary.json is declared in the model, so every one is type-checked.

The model keeps fields it does not declare (a newer writer's file still reads), untyped, in ``model_extra``: a field
the callbacks write but the model forgets passes through unchecked, and readers trust its type. Four such keys of
``tail.by_cause`` were once found by chance, and a search then found more than thirty others. These tests fail closed on the
next one: real short fits that reach as many fields as a CPU run can, parsed with the model, walked to the bottom; any
``model_extra`` left anywhere fails with its dotted path. A field typed ``Any`` would hide what is under it from that
walk, so the model has none.
"""

import typing

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from pydantic import BaseModel
from torch import nn

from helpers import ImageModel, TinyModel, find_summary, fit
from lightning_perf import (EvalNoGradGuard, IterationTimer, PerfSuite, QualityGate, SectionProfiler, VRAMMonitor,
                            profile_section)
from lightning_perf.summary.baseline import write_baseline
from lightning_perf.summary.model import PerfSummary, parse


def untyped(node, path=""):
    """The dotted path of every field of a parsed summary that the model kept untyped (``model_extra``)."""
    found = []
    if isinstance(node, BaseModel):
        found += [f"{path}.{key}" if path else key for key in node.model_extra or {}]
        for name in type(node).model_fields:
            found += untyped(getattr(node, name), f"{path}.{name}" if path else name)
    elif isinstance(node, dict):
        for key, value in node.items():
            found += untyped(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += untyped(value, f"{path}[{i}]")
    return found


def assert_all_typed(summary):
    extra = untyped(parse(summary, "the summary"))
    assert not extra, ("fields the callbacks write that the model does not declare (add each to"
                       " lightning_perf/summary/model.py, then run python -m lightning_perf.summary.derived --write):\n"
                       + "\n".join(extra))


class Everything(ImageModel):
    """Image pairs for QualityGate, a logged loss, a forward in eval mode with grad on (a finding), a list that keeps
    the second epoch's graphs (a retained graph) and a user section."""

    def __init__(self):
        super().__init__()
        self.probe = nn.Linear(16, 16)
        self.kept = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.current_epoch == 1:  # a retained graph the guard finds at the second epoch's end
            self.kept.append(loss)
        self.log("train_loss", loss)
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx == 1:
            self.eval()
            self.probe(torch.randn(4, 16))
            self.train()
        with profile_section("sampling"):
            pass

    def on_train_epoch_end(self):
        self.kept.clear()


def test_a_fit_with_every_callback_leaves_no_field_untyped(tmp_path):
    """The five callbacks in a PerfSuite, FLOPs counted, checkpoints, and a gate against a baseline recorded at another
    step with ``require_same_step``: each check fails with its reason, each metric has its delta and tolerance."""
    baseline = tmp_path / "baseline.json"
    write_baseline(str(baseline), {"psnr": {"value": 1000.0, "mode": "max"}, "l1": {"value": 0.04, "mode": "min"},
                                   "lpips": {"value": 0.5, "mode": "min"}, "val_l1": {"value": 0.04, "mode": "min"}},
                   step=1, images=16)
    suite = PerfSuite([
        IterationTimer(warmup_steps=1, flops_per_batch="auto", keep_slowest=3, items_fn=lambda b: b[0].numel()),
        SectionProfiler(warmup_steps=1, report_every_n_steps=2, print_reports=False),
        VRAMMonitor(nvml_interval_s=0.01),
        EvalNoGradGuard(allow=["on_test_batch_end"]),
        QualityGate(metrics=["psnr", "l1", "lpips"], monitor={"val_l1": "min"}, baseline=str(baseline),
                    require_same_step=True, lpips_pretrained=False)])
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    with pytest.warns(UserWarning):
        fit(tmp_path / "run", [suite, saver], model=Everything(), max_epochs=2)
    summary = find_summary(tmp_path / "run")
    gate, guard, tail = summary["quality_gate"], summary["eval_no_grad_guard"], summary["iteration_timer"]["tail"]
    # what the run must reach for the walk to mean something: the nested records, filled
    assert gate["failed_checks"] and gate["failed_checks"][0]["reason"] and gate["metrics"]["psnr"]["delta"] < 0
    assert guard["findings"] and guard["retained_graphs"] and tail["by_cause"] and tail["slowest"]
    assert summary["iteration_timer"]["flops_per_batch"] and summary["section_profiler"]["after_last_iteration"]
    assert_all_typed(summary)


class Crashes(TinyModel):
    def training_step(self, batch, batch_idx):
        if self.global_step == 5:
            raise RuntimeError("boom at step 5")
        return super().training_step(batch, batch_idx)


def test_a_failed_fit_and_a_section_that_could_not_be_built_leave_no_field_untyped(tmp_path, monkeypatch):
    """Separate callbacks, a fit that raises, and VRAMMonitor's figures raising as they are built: its section is the
    error alone."""
    def broken(self):
        raise ValueError("no figures")

    monkeypatch.setattr(VRAMMonitor, "_summary_section", broken)
    callbacks = [IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, print_reports=False),
                 VRAMMonitor(nvml_interval_s=0.01), EvalNoGradGuard(),
                 QualityGate(metrics=[], monitor={"val_loss": "min"}, baseline={"val_loss": 1.0})]
    with pytest.raises(RuntimeError, match="boom at step 5"):
        fit(tmp_path, callbacks, model=Crashes())
    summary = find_summary(tmp_path)
    assert summary["status"] == "failed" and summary["vram"]["error"] == "ValueError: no figures"
    assert_all_typed(summary)


@pytest.mark.slow
def test_a_ddp_fit_leaves_no_field_untyped(tmp_path):
    """Two CPU processes: the `ranks` spreads of IterationTimer, SectionProfiler and VRAMMonitor."""
    callbacks = [IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, print_reports=False),
                 VRAMMonitor(nvml_interval_s=0.01)]
    fit(tmp_path, callbacks, strategy="ddp_spawn", devices=2, max_epochs=1)
    summary = find_summary(tmp_path)
    assert all(summary[s]["ranks"] for s in ("iteration_timer", "section_profiler", "vram"))
    assert_all_typed(summary)


def _any_inside(annotation):
    return annotation is typing.Any or any(_any_inside(arg) for arg in typing.get_args(annotation))


def _models(model=PerfSummary, seen=None):
    """Every model class a summary's fields reach."""
    seen = set() if seen is None else seen
    if model not in seen:
        seen.add(model)
        for field in model.model_fields.values():
            stack = [field.annotation]
            while stack:
                kind = stack.pop()
                if isinstance(kind, type) and issubclass(kind, BaseModel):
                    _models(kind, seen)
                stack += typing.get_args(kind)
    return seen


def test_no_field_of_the_model_is_typed_any():
    """`Any` is checked by nothing, and what it holds is no `model_extra` the walk above would find."""
    loose = [f"{model.__name__}.{name}" for model in _models() for name, field in model.model_fields.items()
             if _any_inside(field.annotation)]
    assert not loose, loose
