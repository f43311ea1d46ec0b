"""QualityGate checks the baseline's step: a check at step 4 against a baseline recorded at step 8 warns, or with
``require_same_step=True`` fails, and says both steps. ImageModel validates at steps 4 and 8 (4 batches an epoch)."""

import json
import warnings

import pytest

from helpers import ImageModel, find_summary, fit
from lightning_perf import PerfCheckFailed, QualityGate

MISMATCH = "checked at step 4 against a baseline recorded at step 8"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """A baseline file and the run's summary, both recorded at the last check of a 2-epoch run: step 8."""
    root = tmp_path_factory.mktemp("baseline")
    fit(root / "run", [QualityGate(metrics=["psnr"], record_baseline=str(root / "base.json"))], model=ImageModel(),
        max_epochs=2)
    summary = find_summary(root / "run")
    with open(root / "base.json") as fh:
        assert json.load(fh)["step"] == 8 == summary["quality_gate"]["step"]  # what the gate reads, recomputed
    paths = {"baseline file": str(root / "base.json")}
    paths["summary"] = str(next((root / "run").rglob("perf_summary.json")))
    return paths


def gate_fit(tmp_path, max_epochs, **kwargs):
    fit(tmp_path, [QualityGate(metrics=["psnr"], **kwargs)], model=ImageModel(), max_epochs=max_epochs)
    return find_summary(tmp_path)["quality_gate"]


@pytest.mark.parametrize("source", ["baseline file", "summary"])
def test_a_check_at_another_step_warns_naming_both_steps_and_is_still_gated(tmp_path, baseline, source):
    with pytest.warns(UserWarning, match=MISMATCH) as record:
        gate = gate_fit(tmp_path, 1, baseline=baseline[source])
    assert len([w for w in record if MISMATCH in str(w.message)]) == 1
    assert gate["baseline_step"] == 8 and gate["step"] == 4 and gate["require_same_step"] is False
    assert gate["passed"] is True and gate["metrics"]["psnr"]["passed"] is True  # same images, same PSNR


def test_require_same_step_fails_the_check_and_the_fit_naming_both_steps(tmp_path, baseline):
    with pytest.raises(PerfCheckFailed, match=f"first at step 4: psnr \\({MISMATCH}\\)"):
        gate_fit(tmp_path, 1, baseline=baseline["summary"], require_same_step=True, action="fail")
    gate = find_summary(tmp_path)["quality_gate"]
    assert gate["passed"] is False and gate["failed_check_count"] == 1
    psnr = gate["metrics"]["psnr"]
    assert psnr["passed"] is False and psnr["reason"] == MISMATCH
    assert psnr["delta"] == pytest.approx(0.0, abs=1e-9)  # the values agree: only the step fails it


def test_require_same_step_with_action_warn_warns_the_failure_with_both_steps(tmp_path, baseline):
    with pytest.warns(UserWarning, match=f"quality gate failed at step 4: psnr {MISMATCH}"):
        gate = gate_fit(tmp_path, 1, baseline=baseline["baseline file"], require_same_step=True)
    assert gate["passed"] is False


def test_the_same_step_neither_warns_nor_fails(tmp_path, baseline):
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        gate = gate_fit(tmp_path, 2, baseline=baseline["summary"], at_steps=[8], require_same_step=True,
                        action="fail")
    assert not [w for w in record if "baseline recorded at step" in str(w.message)]
    assert gate["passed"] is True and gate["step"] == gate["baseline_step"] == 8


def test_a_baseline_without_a_step_is_not_checked_for_one(tmp_path, baseline):
    with open(baseline["baseline file"]) as fh:
        value = json.load(fh)["metrics"]["psnr"]["value"]
    gate = gate_fit(tmp_path, 1, baseline={"psnr": value}, require_same_step=True, action="fail")
    assert gate["passed"] is True and gate["baseline_step"] is None


def test_require_same_step_must_be_a_bool():
    with pytest.raises(ValueError, match=r"QualityGate\(require_same_step='yes'\)"):
        QualityGate(metrics=["psnr"], require_same_step="yes")
