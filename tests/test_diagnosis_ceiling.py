"""Each diagnosis states what removing its bottleneck could give at most (Amdahl on the measured shares), checked
against the costs injected on the virtual clock."""

import pytest
from test_diagnosis import run

from lightning_perf.summary.diagnosis import diagnosis_line


def test_input_bound_ceiling_is_the_iteration_without_the_wait(tmp_path, monkeypatch):
    d = run(tmp_path, monkeypatch, fetch=16.0, step=30.0)["diagnosis"]  # 46 ms an iteration, 16 of it waiting
    assert d["verdict"] == "input-bound"
    ceiling = d["ceilings"]["input-bound"]
    assert ceiling["at_most"] == pytest.approx(46 / 30)
    assert "never waited for data" in ceiling["assumption"]
    assert "if the loop never waited for data (iterations), at most 1.53x faster" in diagnosis_line(d)


def test_evaluation_heavy_ceiling_is_half_the_validations_skipped(tmp_path, monkeypatch):
    d = run(tmp_path, monkeypatch, step=10.0, val=10.0)["diagnosis"]  # 80 ms of evaluation beside 160 of training
    assert d["ceilings"]["evaluation-heavy"]["at_most"] == pytest.approx(240 / 200)
    assert "half the validations" in diagnosis_line(d)


def test_compute_bound_ceiling_names_its_assumed_step_speed_up(tmp_path, monkeypatch):
    d = run(tmp_path, monkeypatch, fetch=10.0, step=36.0)["diagnosis"]  # the step is 36 of 46 ms
    assert d["verdict"] == "compute-bound"
    assert d["ceilings"]["compute-bound"]["at_most"] == pytest.approx(46 / (10 + 18))
    assert d["ceilings"]["input-bound"]["at_most"] == pytest.approx(46 / 36)  # also stated where it did not fire
    assert "if the step ran 2x faster" in diagnosis_line(d)
