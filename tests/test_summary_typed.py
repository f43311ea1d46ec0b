"""Every field a callback writes into perf_summary.json is declared in the model, so every one is type-checked.

The model keeps fields it does not declare (a newer writer's file still reads), untyped, in ``model_extra``: a field
the callbacks write but the model forgets passes through unchecked, and readers trust its type. Four such keys of
``tail.by_cause`` were once found by chance, and a search then found more than thirty others. These tests fail closed on the
next one: real short fits that reach as many fields as a CPU run can, parsed with the model, walked to the bottom; any
``model_extra`` left anywhere fails with its dotted path. A field typed ``Any`` would hide what is under it from that
walk, so the model has none.

A CPU run leaves null the figures the callbacks write only on CUDA (allocator peaks, NVML memory and activity, CUDA
event times, allocator retries): a field among them the model forgot would pass unnoticed. One more fit reaches them
with only the hardware simulated, by the fakes the callbacks' own tests use, and is walked the same way.
"""

import typing

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from pydantic import BaseModel
from torch import nn

import lightning_perf.callbacks.vram_monitor.callback as vram_module
import lightning_perf.measure.memory.readers as memory_module
from helpers import ImageModel, SimulatedDevice, TinyModel, find_summary, fit
from lightning_perf import (EvalNoGradGuard, IterationTimer, PerfSuite, QualityGate, SectionProfiler, VRAMMonitor,
                            profile_section)
from lightning_perf.summary.baseline import write_baseline
from lightning_perf.summary.model import PerfSummary, parse
from test_device_activity import ActiveNvml, Ticker
from test_tail import Allocator
from test_vram_monitor import FakeCuda


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


# -- the figures written only on CUDA, with the hardware simulated ----------------------------------------------------
class OnSimulatedGpu(TinyModel):
    """Drives the fake allocator (test_vram_monitor.FakeCuda) in training and validation, retries it once an epoch
    (test_tail.Allocator) and runs a user section, whose device time the simulated events give."""

    cuda: FakeCuda  # set by the test; not init arguments, so checkpoints stay plain
    allocator: Allocator

    def training_step(self, batch, batch_idx):
        self.cuda.alloc(100)
        if batch_idx == 3:
            self.allocator.retries += 1
        with profile_section("sampling"):
            pass
        self.cuda.free(100)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.cuda.alloc(300)
        self.cuda.free(300)
        return super().validation_step(batch, batch_idx)


def test_a_fit_on_a_simulated_gpu_leaves_no_cuda_only_field_untyped(tmp_path, monkeypatch):
    """The CUDA and NVML paths of the callbacks, reached on the CPU with the fakes of their own tests: VRAMMonitor on
    test_vram_monitor's allocator and test_device_activity's NVML (memory, utilisation, power, clock, temperature,
    ticked per batch as there), IterationTimer's and SectionProfiler's CUDA event clocks of helpers.HostEvent, the
    allocator's retries as test_tail reads them, and MFU against a peak FLOP/s. Every CUDA-only figure is filled, then
    the whole summary is walked."""
    cuda, nvml, allocator = FakeCuda(), ActiveNvml(), Allocator()
    cuda.alloc(500)  # weights already on the device
    monkeypatch.setattr(vram_module, "cuda_backend", lambda: cuda)
    monkeypatch.setattr(VRAMMonitor, "_device", lambda self, trainer: torch.device("cuda", 0))
    monkeypatch.setattr(memory_module, "load_pynvml", lambda: nvml)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)  # HostEvents are always complete
    model = OnSimulatedGpu()
    model.cuda, model.allocator = cuda, allocator
    timer = IterationTimer(warmup_steps=1, flops_per_batch="auto", available_flops=312e12)
    timer._read_alloc_retries = allocator.read  # on CUDA, torch.cuda.memory_stats_as_nested_dict's num_alloc_retries
    profiler = SectionProfiler(warmup_steps=1, print_reports=False)
    monitor = VRAMMonitor(nvml_interval_s=60)  # the Ticker samples activity, once a batch
    ticker = Ticker(monitor, nvml, {"train": [70, 0, 90], "validation": [20]})
    fit(tmp_path, [ticker, PerfSuite([timer, profiler, monitor]), SimulatedDevice(timer),
                   SimulatedDevice(profiler)], model=model, max_epochs=2, limit_val_batches=2)
    summary = find_summary(tmp_path)
    timer_s, profiler_s, vram = summary["iteration_timer"], summary["section_profiler"], summary["vram"]
    # what the run must reach for the walk to mean something: every CUDA-only figure, filled
    for section in (timer_s, profiler_s, vram):
        assert not section.get("measurement_failures"), section["measurement_failures"]
    assert timer_s["device_ms_per_iter"]["mean"] is not None and timer_s["device_events_dropped"] == 0
    assert timer_s["tail"]["alloc_retries"] == 2 and timer_s["mfu_pct"] is not None
    assert timer_s["available_flops"] == 312e12 and timer_s["tflops_per_s"] is not None
    assert all(profiler_s["sections"][name]["device_mean_ms"] is not None
               for name in ("forward", "backward", "optimizer_step", "sampling"))
    assert vram["source"] == "torch allocator + NVML + host RSS" and vram["resets_torch_peak_stats"] is True
    assert vram["lifetime_peak_allocated_mb"] and vram["lifetime_peak_reserved_mb"] and vram["device_total_mb"]
    for phase in ("train", "validation"):
        figures = vram["phases"][phase]
        assert None not in [figures[f] for f in ("peak_allocated_mb", "peak_reserved_mb", "nvml_peak_used_mb",
                                                 "nvml_process_peak_mb", "usage_pct")], (phase, figures)
    activity = vram["activity"]
    assert activity["source"] == "NVML + psutil + schedstat" and activity["unavailable"] == {}
    assert all(activity["phases"][phase][name]["samples"] for phase in ("train", "validation")
               for name in ("gpu_util_pct", "mem_util_pct", "power_w", "sm_clock_mhz", "temperature_c"))
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
