"""Verdicts that fail closed and checkpoint state that never stops a resume: a gate that never checked, state moving
between PerfSuite and separate callbacks, malformed state in a checkpoint, two suites in one Trainer."""

import math

import pytest
from lightning.pytorch import Trainer

from helpers import ImageModel, find_summary, fit
from lightning_perf import PerfCheckFailed, QualityGate

# -- a gate that never checked -----------------------------------------------------------------------------------

# ImageModel trains 4 steps an epoch; with max_epochs=1 the run's last step is 4.
NEVER = [
    ({"at_steps": [5000]}, {}, r"never checked: at_steps=\[5000\] is past the run's last step 4"),
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
    with pytest.warns(UserWarning, match=r"never checked: at_steps=\[5000\] is past the run's last step 4"):
        fit(tmp_path, [gate(action=action, at_steps=[5000])], model=ImageModel(), max_epochs=1)
    s = find_summary(tmp_path)
    assert s["status"] == "completed"
    assert s["quality_gate"]["passed"] is False
    assert s["quality_gate"]["reason"] == "never checked: at_steps=[5000] is past the run's last step 4 (validations" \
                                          " ran at steps 4)"


def test_an_unreachable_schedule_is_said_at_setup(tmp_path):
    with pytest.warns(UserWarning, match=r"at_steps=\[5000\] is past the run's last step 4: this gate will not check"):
        fit(tmp_path, [gate(at_steps=[5000])], model=ImageModel(), max_epochs=None, max_steps=4)


def test_a_gate_that_checked_or_has_no_baseline_is_not_never_checked(tmp_path):
    fit(tmp_path / "checked", [gate(action="fail", at_steps=[4], tolerance=1.0)], model=ImageModel(), max_epochs=1)
    g = find_summary(tmp_path / "checked")["quality_gate"]
    assert g["passed"] is True and g["reason"] is None and g["checks"] == 1
    no_baseline = QualityGate(metrics=["psnr"], action="fail", at_steps=[5000])
    fit(tmp_path / "measured", [no_baseline], model=ImageModel(), max_epochs=1)  # nothing to gate: completes
    g = find_summary(tmp_path / "measured")["quality_gate"]
    assert g["passed"] is None and g["reason"] is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"tolerance": math.inf}, r"`QualityGate\(tolerance=inf\)`. Expected a finite tolerance >= 0"),
        ({"tolerance": {"psnr": math.inf}}, r"`QualityGate\(tolerance=inf\)`. Expected a finite tolerance"),
        ({"data_range": math.inf}, r"`QualityGate\(data_range=inf\)`. Expected a finite number > 0"),
        ({"at_steps": []}, r"`QualityGate\(at_steps=\[\]\)`. Expected at least one global step"),
    ],
)
def test_a_gate_that_could_never_fail_is_refused_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        QualityGate(metrics=["psnr"], baseline={"psnr": 10.0}, **kwargs)
