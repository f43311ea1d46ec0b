"""Verdicts that fail closed and checkpoint state that never stops a resume: a gate that never checked, state moving
between PerfSuite and separate callbacks, malformed state in a checkpoint, two suites in one Trainer."""

import math
import warnings

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import ImageModel, TinyModel, find_summary, fit, trainer_kwargs
from lightning_perf import (
    EvalNoGradGuard,
    IterationTimer,
    PerfCheckFailed,
    PerfConfigError,
    PerfSuite,
    QualityGate,
    SectionProfiler,
    VRAMMonitor,
)

# -- a gate that never checked -----------------------------------------------------------------------------------

# ImageModel trains 4 steps an epoch; with max_epochs=1 the run's last step is 4.
NEVER = [
    ({"at_steps": [5000]}, {}, r"never checked: at_steps=\[5000\] is outside the run's steps 1 to 4"),
    ({"every_n_steps": 1000}, {}, r"never checked: every_n_steps=1000 is larger than the run's last step 4"),
    ({}, {"limit_val_batches": 0, "num_sanity_val_steps": 0}, r"never checked: no validation ran in this fit"),
    ({}, {"check_val_every_n_epoch": 5}, r"never checked: no validation ran in this fit, which ended at step 4"),
    ({"at_steps": [3]}, {}, r"never checked: no validation ran at at_steps=\[3\] \(validations ran at steps 4\)"),
]


def gate(**kwargs):
    return QualityGate(metrics=["psnr"], baseline={"psnr": 10.0}, **kwargs)


@pytest.mark.parametrize("gate_args, trainer_args, reason", NEVER)
def test_a_failing_gate_that_never_checked_fails_the_fit_with_the_reason(tmp_path, gate_args, trainer_args, reason):
    with pytest.raises(PerfCheckFailed, match=reason):
        fit(tmp_path, [gate(action="fail", **gate_args)], model=ImageModel(), max_epochs=1, **trainer_args)
    s = find_summary(tmp_path)
    assert s["status"] == "failed" and "never checked" in s["error"]["message"]
    g = s["quality_gate"]
    assert g["passed"] is False and g["checks"] == 0
    assert g["reason"].startswith("never checked: ") and g["unavailable"]["metrics"] == g["reason"]


@pytest.mark.parametrize("action", ["warn", "stop"])
def test_a_warning_or_stopping_gate_that_never_checked_warns_and_records_it(tmp_path, action):
    with pytest.warns(UserWarning, match=r"never checked: at_steps=\[5000\] is outside the run's steps 1 to 4"):
        fit(tmp_path, [gate(action=action, at_steps=[5000])], model=ImageModel(), max_epochs=1)
    s = find_summary(tmp_path)
    assert s["status"] == "completed"
    assert s["quality_gate"]["passed"] is False
    assert s["quality_gate"]["reason"] == "never checked: at_steps=[5000] is outside the run's steps 1 to 4 (validations" \
                                          " ran at steps 4)"


def test_an_unreachable_schedule_is_said_at_setup(tmp_path):
    with pytest.warns(UserWarning, match=r"at_steps=\[5000\] is outside the run's steps 1 to 4: this gate will not check"):
        fit(tmp_path, [gate(at_steps=[5000])], model=ImageModel(), max_epochs=None, max_steps=4)


def test_a_gate_that_checked_or_has_no_baseline_is_not_never_checked(tmp_path):
    fit(tmp_path / "checked", [gate(action="fail", at_steps=[4], tolerance=1.0)], model=ImageModel(), max_epochs=1)
    g = find_summary(tmp_path / "checked")["quality_gate"]
    assert g["passed"] is True and g["reason"] is None and g["checks"] == 1
    no_baseline = QualityGate(metrics=["psnr"], action="fail", at_steps=[5000])
    fit(tmp_path / "measured", [no_baseline], model=ImageModel(), max_epochs=1)  # nothing to gate: completes
    g = find_summary(tmp_path / "measured")["quality_gate"]
    assert g["passed"] is None and g["reason"] is None


def test_recording_a_baseline_at_unreachable_steps_is_said_at_setup(tmp_path):
    """A first run that records the baseline a later run gates on, at steps this run never reaches: said before
    training (a later run would otherwise find a baseline that lacks every metric), and no file is written."""
    target = tmp_path / "base.json"
    recorder = QualityGate(metrics=["psnr"], at_steps=[3100], record_baseline=str(target))
    with pytest.warns(UserWarning, match=r"at_steps=\[3100\] is outside the run's steps 1 to 4: nothing will be"
                                         r" measured in this run, and record_baseline='.*base\.json' will write no"
                                         r" baseline\.$"):
        fit(tmp_path, [recorder], model=ImageModel(), max_epochs=None, max_steps=4)
    assert not target.exists()
    with pytest.warns(UserWarning, match=r"at_steps=\[3100\] is outside the run's steps 1 to 4: nothing will be"
                                         r" measured in this run\.$"):
        fit(tmp_path / "plain", [QualityGate(metrics=["psnr"], at_steps=[3100])], model=ImageModel(), max_epochs=None,
            max_steps=4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tolerance": math.inf}, r"`QualityGate\(tolerance=inf\)`. Expected a tolerance from 0 to 1e\+06"),
        ({"tolerance": 1e308}, r"`QualityGate\(tolerance=1e\+308\)`. Expected a tolerance from 0 to 1e\+06"),
        ({"tolerance": {"psnr": math.inf}}, r"`QualityGate\(tolerance=inf\)`. Expected a tolerance from 0"),
        ({"data_range": math.inf}, r"`QualityGate\(data_range=inf\)`. Expected a finite number > 0"),
        ({"at_steps": []}, r"`QualityGate\(at_steps=\[\]\)`. Expected at least one global step"),
    ],
)
def test_a_gate_that_could_never_fail_is_refused_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QualityGate(metrics=["psnr"], baseline={"psnr": 10.0}, **kwargs)


# -- state moves between PerfSuite and separate callbacks ----------------------------------------------------------


def children():
    return [IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, print_reports=False),
            VRAMMonitor(nvml_interval_s=0.01), EvalNoGradGuard(), QualityGate(metrics=[], monitor={"val_loss": "min"})]


def arranged(how):
    return [PerfSuite(children())] if how == "suite" else children()


SECTIONS = ("iteration_timer", "section_profiler", "vram", "eval_no_grad_guard", "quality_gate")


@pytest.mark.parametrize("first, then", [("separate", "suite"), ("suite", "separate"), ("suite", "suite")])
def test_a_resume_keeps_the_state_between_a_suite_and_separate_callbacks(tmp_path, first, then):
    fit(tmp_path / "a", arranged(first) + [ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)], max_epochs=1)
    trainer = Trainer(callbacks=arranged(then), **trainer_kwargs(tmp_path / "b", max_epochs=2))
    trainer.fit(TinyModel(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    s = find_summary(tmp_path / "b")
    assert s["status"] == "completed"
    assert s["iteration_timer"]["iterations"] == 16 and s["iteration_timer"]["resumed_at_iteration"] == 8
    assert s["iteration_timer"]["measured_iterations"] == 14  # 7 of each process: one warm-up step each
    assert s["section_profiler"]["iterations"] == 14
    assert s["iteration_timer"]["validation_runs"] == 2 and s["section_profiler"]["validation"]["runs"] == 2
    assert s["quality_gate"]["checks"] == 2
    for section in SECTIONS:
        assert "checkpoint_state" not in s[section].get("unavailable", {}), section
        assert "measurement_failures" not in s[section], section


@pytest.mark.parametrize("then", ["separate", "suite"])
def test_a_resume_from_a_checkpoint_without_the_state_says_so(tmp_path, then):
    fit(tmp_path / "a", [ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)], max_epochs=1)
    trainer = Trainer(callbacks=arranged(then), **trainer_kwargs(tmp_path / "b", max_epochs=2))
    with pytest.warns(UserWarning, match=r"IterationTimer: resumed at step 8 from a checkpoint without"
                                         r" IterationTimer state"):
        trainer.fit(TinyModel(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    s = find_summary(tmp_path / "b")
    assert s["status"] == "completed" and s["iteration_timer"]["iterations"] == 8
    for section in SECTIONS:
        reason = s[section]["unavailable"]["checkpoint_state"]
        assert reason.startswith("resumed at step 8 from a checkpoint without") and "not in this summary" in reason


# -- malformed state in a checkpoint -------------------------------------------------------------------------------

BAD_HISTOGRAM = {"bin_keys": ["a"], "bin_counts": [1.5], "count": "1"}
# name -> variant -> how the callback's state is edited (the state is replaced by what the function returns)
MALFORMED = {
    "IterationTimer": {
        "list": lambda st: [1, 2],
        "string_number": lambda st: {**st, "iterations": "many"},
        "other_version": lambda st: {"iteration_count": 8},
        "histogram": lambda st: {**st, "histogram_ms": BAD_HISTOGRAM},
    },
    "SectionProfiler": {
        "list": lambda st: ["iterations", 8],
        "string_number": lambda st: {**st, "overhead_s": "0.1"},
        "other_version": lambda st: {"steps": 8},
        "histogram": lambda st: {**st, "sections": {"forward": {"kind": "auto", "host_ms": BAD_HISTOGRAM}}},
    },
    "VRAMMonitor": {
        "list": lambda st: [],
        "string_number": lambda st: {**st, "lifetime": {"peak_allocated_mb": "big"}},
        "other_version": lambda st: {"peaks": {}},
        "histogram": lambda st: {**st, "phases": {"train": [1, 2]}},
    },
    "EvalNoGradGuard": {
        "list": lambda st: [{"site": "x"}],
        "string_number": lambda st: {**st, "findings": [{"site": "val", "module": "M", "count": "3"}]},
        "other_version": lambda st: {"warnings": []},
        "histogram": lambda st: {**st, "findings": {"site": "val"}},
    },
    "QualityGate": {
        "list": lambda st: "checks=2",
        "string_number": lambda st: {**st, "checks": "2"},
        "other_version": lambda st: {"verdicts": []},
        "histogram": lambda st: {**st, "results": {"val_loss": 0.5}},
    },
    "PerfSuite": {
        "list": lambda st: [1],
        "string_number": lambda st: {**st, "IterationTimer": {**st["IterationTimer"], "iterations": "8"}},
        "other_version": lambda st: {**st, "IterationTimer": {"iteration_count": 8}},
        "histogram": lambda st: {**st, "IterationTimer": {**st["IterationTimer"], "blocks_ms": {"sums": "x"}}},
    },
}
SECTION = {"IterationTimer": "iteration_timer", "SectionProfiler": "section_profiler", "VRAMMonitor": "vram",
           "EvalNoGradGuard": "eval_no_grad_guard", "QualityGate": "quality_gate", "PerfSuite": "iteration_timer"}


def make(name):
    if name == "PerfSuite":
        return PerfSuite(children())
    return next(cb for cb in children() if type(cb).__name__ == name)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One 8-step checkpoint per callback (and for a suite of all five), written once for the module."""
    made = {}

    def checkpoint(name):
        if name not in made:
            root = tmp_path_factory.mktemp(name)
            fit(root, [make(name), ModelCheckpoint(dirpath=root / "ckpt", save_last=True)], max_epochs=1)
            made[name] = root / "ckpt" / "last.ckpt"
        return made[name]

    return checkpoint


@pytest.mark.parametrize("variant", ["list", "string_number", "other_version", "histogram"])
@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_state_is_recorded_and_the_resume_goes_on(tmp_path, checkpoints, name, variant):
    ckpt = torch.load(checkpoints(name), weights_only=False)
    key = next(k for k in ckpt["callbacks"] if k.startswith(name))
    ckpt["callbacks"][key] = MALFORMED[name][variant](ckpt["callbacks"][key])
    torch.save(ckpt, tmp_path / "edited.ckpt")
    trainer = Trainer(callbacks=[make(name)], **trainer_kwargs(tmp_path / "b", max_epochs=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(TinyModel(), ckpt_path=str(tmp_path / "edited.ckpt"))
    s = find_summary(tmp_path / "b")
    section = s[SECTION[name]]
    assert s["status"] == "completed" and "measurement_failures" not in section, section
    reason = section["unavailable"]["checkpoint_state"]
    assert "not in this summary" in reason and ("could not be read" in reason or "without" in reason), reason
    said = [w for w in caught if str(w.message).startswith(f"{SECTION_OWNER[SECTION[name]]}: ")
            and "checkpoint" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in caught]  # warned once
    if SECTION[name] == "iteration_timer":  # started fresh: this process's 8 iterations, no resume point
        assert section["iterations"] == 8 and section["resumed_at_iteration"] is None


SECTION_OWNER = {"iteration_timer": "IterationTimer", "section_profiler": "SectionProfiler", "vram": "VRAMMonitor",
                 "eval_no_grad_guard": "EvalNoGradGuard", "quality_gate": "QualityGate"}


def test_a_whole_suite_state_that_is_not_a_dict_is_recorded_on_every_callback(tmp_path, checkpoints):
    ckpt = torch.load(checkpoints("PerfSuite"), weights_only=False)
    key = next(k for k in ckpt["callbacks"] if k.startswith("PerfSuite"))
    ckpt["callbacks"][key] = "garbage"
    torch.save(ckpt, tmp_path / "edited.ckpt")
    trainer = Trainer(callbacks=[PerfSuite(children())], **trainer_kwargs(tmp_path / "b", max_epochs=2))
    trainer.fit(TinyModel(), ckpt_path=str(tmp_path / "edited.ckpt"))
    s = find_summary(tmp_path / "b")
    for section in SECTIONS:
        assert "the state is a str, expected a dict" in s[section]["unavailable"]["checkpoint_state"], section


def test_a_histogram_with_wrong_types_is_refused_not_half_read():
    from lightning_perf.measure.stats.streaming import LogHistogram

    good = LogHistogram()
    for v in (1.0, 2.0, 3.0):
        good.add(v)
    assert LogHistogram.from_dict(good.to_dict()).summary() == good.summary()
    for bad in (BAD_HISTOGRAM, {**good.to_dict(), "sum": math.nan}, {**good.to_dict(), "count": 7},
                {**good.to_dict(), "min": "1"}, [1, 2]):
        with pytest.raises(ValueError, match="malformed histogram"):
            LogHistogram.from_dict(bad)


# -- two suites in one Trainer -------------------------------------------------------------------------------------


def test_two_suites_of_different_callbacks_keep_their_state_apart(tmp_path):
    def two():
        return [PerfSuite([IterationTimer(warmup_steps=1), EvalNoGradGuard()]),
                PerfSuite([VRAMMonitor(nvml_interval_s=0.01), SectionProfiler(warmup_steps=1, print_reports=False)])]

    first = two()
    assert first[0].state_key != first[1].state_key
    fit(tmp_path / "a", first + [ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)], max_epochs=1)
    states = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["callbacks"]
    assert set(states[first[0].state_key]) == {"IterationTimer", "EvalNoGradGuard"}
    assert set(states[first[1].state_key]) == {"VRAMMonitor", "SectionProfiler"}
    trainer = Trainer(callbacks=two(), **trainer_kwargs(tmp_path / "b", max_epochs=2))
    trainer.fit(TinyModel(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    s = find_summary(tmp_path / "b")
    assert s["iteration_timer"]["iterations"] == 16 and s["section_profiler"]["validation"]["runs"] == 2
    assert all("checkpoint_state" not in s[k].get("unavailable", {}) for k in SECTIONS if k in s)


@pytest.mark.parametrize("callbacks", [
    lambda: [PerfSuite([IterationTimer()]), IterationTimer()],
    lambda: [PerfSuite([IterationTimer(), EvalNoGradGuard()]), PerfSuite([IterationTimer()])],
])
def test_one_callback_twice_across_suites_is_refused_at_setup(tmp_path, callbacks):
    trainer = Trainer(callbacks=callbacks(), **trainer_kwargs(tmp_path, max_epochs=1))
    with pytest.raises(PerfConfigError, match=r"two lightning_perf callbacks with the state key 'IterationTimer'"
                                              r" \(in .*\); their checkpoint state and summary section would collide"):
        trainer.fit(TinyModel())
    assert trainer.global_step == 0


def test_two_identical_suites_are_refused_naming_the_argument_before_any_step(tmp_path):
    """Before: Lightning's own "Found more than one stateful callback of type `PerfSuite`" from ``Trainer(...)``,
    which names neither the argument nor a way out. Now the Trainer is built (the suites' keys differ until
    ``setup``), and ``setup`` refuses the pair naming ``PerfSuite(callbacks=...)`` before any training step."""
    steps = []

    class Counting(TinyModel):
        def training_step(self, batch, batch_idx):
            steps.append(batch_idx)
            return super().training_step(batch, batch_idx)

    trainer = Trainer(callbacks=[PerfSuite(), PerfSuite()], **trainer_kwargs(tmp_path, max_epochs=1))
    with pytest.raises(PerfConfigError, match=r"PerfSuite\(callbacks=\.\.\.\): this Trainer has two PerfSuites with"
                                              r" the same callbacks \(IterationTimer, SectionProfiler, VRAMMonitor,"
                                              r" EvalNoGradGuard"):
        trainer.fit(Counting())
    assert steps == []


def test_a_suite_has_its_plain_key_from_setup_on_whatever_else_was_built(tmp_path):
    """The key a checkpoint's entry is saved under never depends on which other suites were alive: a suite built
    while a twin waits (not set up) is keyed apart only until its own setup."""
    waiting = PerfSuite()
    suite = PerfSuite()
    assert suite.state_key != waiting.state_key  # in one Trainer(...) these would pass Lightning's check
    fit(tmp_path, [suite, ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)], max_epochs=1)
    plain = suite._generate_state_key(callbacks=[cb.state_key for cb in suite.callbacks])
    assert suite.state_key == plain  # whatever keys the suites not set up hold (their keys wait for their setup)
    assert plain in torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["callbacks"]


def test_the_same_callback_object_in_a_suite_and_in_the_trainer_is_refused(tmp_path):
    """One object in two places would run every hook twice and count each iteration twice."""
    timer = IterationTimer(warmup_steps=1)
    trainer = Trainer(callbacks=[PerfSuite([timer]), timer], **trainer_kwargs(tmp_path, max_epochs=1))
    with pytest.raises(PerfConfigError, match=r"the same callback object is given twice, in .* and in .*; every hook"
                                              r" would run twice"):
        trainer.fit(TinyModel())
    assert trainer.global_step == 0


def test_at_steps_may_be_any_iterable_of_steps(tmp_path):
    """An iterator is read once at construction: the checks and the gate see the same steps."""
    gate = QualityGate(metrics=["psnr"], baseline={"psnr": 1.0}, at_steps=iter([4]), action="fail")
    assert gate.at_steps == [4]
    fit(tmp_path, [gate], model=ImageModel(), max_epochs=1)
    s = find_summary(tmp_path)["quality_gate"]
    assert s["passed"] is True and s["checks"] == 1


def test_a_failing_gate_fails_the_fit_when_its_baseline_cannot_be_written(tmp_path, monkeypatch):
    """The disk fails when the baseline is written at fit end: the verdict, the summary and the failure still come
    (before, the write's OSError ended the hook: no summary, and a failing gate passed)."""
    from lightning_perf.callbacks.quality_gate import callback as quality_gate

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(quality_gate, "write_baseline", disk_full)
    gate = QualityGate(metrics=["psnr"], baseline={"psnr": 1000.0}, action="fail",
                       record_baseline=str(tmp_path / "base.json"))
    with pytest.raises(PerfCheckFailed, match="checks failed"):
        fit(tmp_path, [gate], model=ImageModel(), max_epochs=1)
    s = find_summary(tmp_path)
    assert s["status"] == "failed" and s["quality_gate"]["passed"] is False
    assert "No space left on device" in s["quality_gate"]["unavailable"]["recorded_baseline"]


@pytest.mark.parametrize("edit, match", [
    (lambda h: {"renamed": 1}, "no count, bin_keys, bin_counts"),
    (lambda h: {**h, "bin_keys": [10**400] + h["bin_keys"][1:]}, "bin_keys holds a huge integer"),
    (lambda h: {**h, "relative_accuracy": 1e-300}, "relative_accuracy is 1e-300"),
    (lambda h: {**h, "count": 10**18, "zero_count": 10**18 - 3}, "zero_count holds 999999999999999997"),
])
def test_a_histogram_from_another_version_or_out_of_range_is_refused(edit, match):
    from lightning_perf.measure.stats.streaming import LogHistogram

    good = LogHistogram()
    for v in (1.0, 2.0, 3.0):
        good.add(v)
    with pytest.raises(ValueError, match=match):
        LogHistogram.from_dict(edit(good.to_dict()))


def test_a_count_past_any_real_run_is_refused_in_checkpoint_state():
    from lightning_perf.callbacks.core.state import StateError, StateReader

    assert StateReader({"iterations": 12}).count("iterations") == 12
    for bad in (10**18, 10**400, -1, 1.5):
        with pytest.raises(StateError, match="expected an integer from 0 to"):
            StateReader({"iterations": bad}).count("iterations")


def test_the_console_verdict_counts_one_check_in_the_singular(tmp_path):
    passing = gate(at_steps=[4], tolerance=1.0)
    fit(tmp_path / "gated", [passing], model=ImageModel(), max_epochs=None, max_steps=4)
    assert passing.verdict().startswith("QualityGate: passed 1 check; last: psnr ")
    measured = QualityGate(metrics=["psnr"], at_steps=[4])
    fit(tmp_path / "measured", [measured], model=ImageModel(), max_epochs=None, max_steps=4)
    assert measured.verdict().endswith("(no baseline, not gated; 1 check)")
