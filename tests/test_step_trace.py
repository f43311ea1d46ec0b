"""StepTrace: a torch.profiler trace of chosen steps and of the steps after a slow one, linked from the tail."""

import json
import os
import time

import pytest
import torch

from helpers import TinyModel, find_summary, fit
from lightning_perf import IterationTimer, StepTrace

SLOW_EVERY = 7


class SlowEveryN(TinyModel):
    """Every SLOW_EVERY-th iteration (the one that ends at a multiple of SLOW_EVERY) runs a named slow op."""

    def training_step(self, batch, batch_idx):
        if (self.trainer.global_step + 1) % SLOW_EVERY == 0:
            with torch.profiler.record_function("injected_slow_op"):
                a = torch.randn(500, 500)
                for _ in range(6):
                    a = a @ a / 500
                time.sleep(0.25)  # slow on any machine: far past slow_factor x a ~1.5 ms median, above load spikes
        return super().training_step(batch, batch_idx)


class FailsAt(TinyModel):
    def __init__(self, step):
        super().__init__()
        self.fail_step = step

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step + 1 == self.fail_step:
            raise RuntimeError("boom in training_step")
        return super().training_step(batch, batch_idx)


def trace_names(path):
    with open(path) as fh:
        events = json.load(fh)["traceEvents"]
    return [e.get("name") for e in events]


def test_a_slow_step_triggers_a_trace_that_shows_the_injected_op_and_the_tail_links_it(tmp_path):
    # slow_factor 30: a loaded machine's hiccup over 3x the median triggered step 6 once in a full run
    trace = StepTrace(slow_factor=30.0, capture_steps=SLOW_EVERY, max_captures=1, warmup_steps=3)
    fit(tmp_path, [IterationTimer(warmup_steps=1), trace], model=SlowEveryN(), max_epochs=4)
    summary = find_summary(tmp_path)
    section = summary["step_trace"]
    captures = section["captures"]
    # bounded: one capture, although IterationTimer saw later slow iterations too
    slowest = {e["step"]: e for e in summary["iteration_timer"]["tail"]["slowest"]}
    assert len(captures) == 1 and section["slow_iterations"] == 1
    assert len([s for s in slowest if s % SLOW_EVERY == 0 and s > captures[0]["last_step"]]) >= 2
    capture = captures[0]
    assert capture["trigger"] == "slow" and capture["slow_step"] % SLOW_EVERY == 0
    assert (capture["first_step"], capture["last_step"]) == (capture["slow_step"] + 1,
                                                             capture["slow_step"] + SLOW_EVERY)
    assert capture["complete"] and os.path.isfile(capture["path"])
    # the window holds the next slow iteration: its named op is in the trace, once
    assert trace_names(capture["path"]).count("injected_slow_op") == 1
    assert capture["top_ops"][0]["name"] in ("injected_slow_op", "aten::mm", "aten::div", "aten::randn",
                                             "aten::normal_")
    # the tail's slow iterations link it: the one that triggered it (`next`) and the one it holds (`this`)
    trigger, held = slowest[capture["slow_step"]], slowest[capture["slow_step"] + SLOW_EVERY]
    assert trigger["trace"] == {"path": capture["path"], "first_step": capture["first_step"],
                                "last_step": capture["last_step"], "covers": "next"}
    assert held["trace"]["covers"] == "this" and held["trace"]["path"] == capture["path"]
    assert any(line.startswith(f"see trace {capture['path']}") for line in summary["diagnosis"]["evidence"])


def test_requested_steps_are_traced_exactly(tmp_path):
    trace = StepTrace(steps=[1, 3, 4, 9])
    fit(tmp_path, [trace], max_epochs=2)
    captures = find_summary(tmp_path)["step_trace"]["captures"]
    assert [(c["first_step"], c["last_step"], c["trigger"]) for c in captures] == [
        (1, 1, "requested"), (3, 4, "requested"), (9, 9, "requested")]
    # an independent count of the iterations in each file: the optimizer's steps the profiler saw
    for capture, iterations in zip(captures, (1, 2, 1)):
        names = trace_names(capture["path"])
        assert sum(1 for n in names if n and n.startswith("Optimizer.step#SGD.step")) == iterations
        assert os.path.basename(capture["path"]).startswith(f"step_{capture['first_step']}")


def test_nothing_due_means_nothing_captured_and_the_summary_says_why(tmp_path):
    fit(tmp_path, [StepTrace(steps=[1000])], max_epochs=1)
    section = find_summary(tmp_path)["step_trace"]
    assert section["captures"] == [] and "1000" in section["unavailable"]["steps_not_reached"]
    assert not os.path.exists(section["trace_dir"])


def test_a_crash_inside_the_window_keeps_the_trace_up_to_it(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path, [StepTrace(steps=[4, 5, 6, 7])], model=FailsAt(6), max_epochs=1)
    summary = find_summary(tmp_path)
    assert summary["status"] == "failed"
    (capture,) = summary["step_trace"]["captures"]
    assert capture["complete"] is False and capture["first_step"] == 4 and os.path.isfile(capture["path"])
    # steps 4 and 5, and the start of the failing one (Lightning runs training_step inside the optimizer's step)
    assert sum(1 for n in trace_names(capture["path"]) if n and n.startswith("Optimizer.step#SGD.step")) == 3
    assert "aten::addmm" in trace_names(capture["path"])


@pytest.mark.parametrize("kwargs, shown", [
    ({"steps": [0]}, "steps=[0]"), ({"steps": 5}, "steps=5"), ({"slow_factor": 1.0}, "slow_factor=1.0"),
    ({"capture_steps": 0}, "capture_steps=0"), ({"max_captures": -1}, "max_captures=-1"),
    ({"record_shapes": "yes"}, "record_shapes='yes'"),
])
def test_bad_arguments_are_refused_at_construction(kwargs, shown):
    with pytest.raises(ValueError, match=f"StepTrace\\({shown.replace('[', '.').replace(']', '.')}\\)"):
        StepTrace(**kwargs)


def test_with_gradient_accumulation_a_step_is_one_optimizer_step_of_its_micro_batches(tmp_path):
    trace = StepTrace(steps=[3])
    fit(tmp_path, [trace], max_epochs=1, accumulate_grad_batches=2)
    (capture,) = trace.captures
    names = trace_names(capture["path"])
    assert sum(1 for n in names if n and n.startswith("Optimizer.step#SGD.step")) == 1
    # both micro-batches of that step: each fetched once from the DataLoader
    assert sum(1 for n in names if n and n.startswith("enumerate(DataLoader)")) == 2


def test_the_printed_diagnosis_ends_with_the_first_evidence_line():
    from lightning_perf.summary.diagnosis import diagnosis_line

    line = diagnosis_line({"verdict": "tail-heavy", "figure": "tail", "value": 30.0, "threshold": 20.0,
                           "advice": "look", "evidence": ["see trace /a.json (steps 5-6)", "see trace /b.json"]})
    assert line.endswith(" Evidence: see trace /a.json (steps 5-6) (+1 more in the summary's diagnosis.evidence)")
    assert "Evidence" not in diagnosis_line({"verdict": "tail-heavy", "figure": "tail", "evidence": []})
