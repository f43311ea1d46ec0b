"""Every callback of the suite: constructible, configurable from YAML, fits twice, resumes, survives a crash, DDP."""

import importlib
import json

import pytest
import yaml
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import TinyModel, find_summary, fit, trainer_kwargs
from suite import SUITE

NAMES = sorted(SUITE)


def make(name):
    return SUITE[name][0]()


def section_of(name):
    return SUITE[name][1]


@pytest.mark.parametrize("name", NAMES)
def test_constructible_with_defaults(name):
    cls = getattr(importlib.import_module("lightning_perf"), name)
    cb = cls()
    assert cb.state_dict() is not None


@pytest.mark.parametrize("name", NAMES)
def test_from_lightning_cli_yaml(name, tmp_path):
    from lightning.pytorch.cli import LightningCLI

    config = {
        "trainer": {
            "default_root_dir": str(tmp_path),
            "max_epochs": 1,
            "accelerator": "cpu",
            "devices": 1,
            "enable_progress_bar": False,
            "callbacks": [{"class_path": f"lightning_perf.{name}", "init_args": SUITE[name][2]}],
        }
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = LightningCLI(TinyModel, args=["fit", "--config", str(path)], save_config_kwargs={"overwrite": True})
    assert any(type(cb).__name__ == name for cb in cli.trainer.callbacks)
    summary = find_summary(tmp_path)
    assert summary["status"] == "completed" and section_of(name) in summary


@pytest.mark.parametrize("name", NAMES)
def test_two_fits_in_a_row_with_one_instance(name, tmp_path):
    cb = make(name)
    fit(tmp_path / "one", [cb], max_epochs=1)
    fit(tmp_path / "two", [cb], max_epochs=2)
    first, second = find_summary(tmp_path / "one"), find_summary(tmp_path / "two")
    assert first["status"] == second["status"] == "completed"
    assert section_of(name) in first and section_of(name) in second
    assert "measurement_failures" not in second[section_of(name)]
    if name == "IterationTimer":  # the second summary covers the second fit only
        assert second["iteration_timer"]["iterations"] == 16


@pytest.mark.parametrize("name", NAMES)
def test_resume_from_checkpoint(name, tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit(tmp_path / "a", [make(name), ckpt], max_epochs=1)
    trainer = Trainer(callbacks=[make(name)], **trainer_kwargs(tmp_path / "b", max_epochs=2))
    trainer.fit(TinyModel(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    summary = find_summary(tmp_path / "b")
    assert summary["status"] == "completed" and "measurement_failures" not in summary[section_of(name)]


class CrashingModel(TinyModel):
    def training_step(self, batch, batch_idx):
        if self.global_step == 5:
            raise RuntimeError("boom at step 5")
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("name", NAMES)
def test_exception_leaves_a_valid_failed_summary(name, tmp_path):
    with pytest.raises(RuntimeError, match="boom at step 5"):
        fit(tmp_path, [make(name)], model=CrashingModel(), max_epochs=3)
    summary = find_summary(tmp_path)
    assert summary["status"] == "failed"
    assert summary["error"] == {"type": "RuntimeError", "message": "boom at step 5"}
    assert section_of(name) in summary
    assert not list(tmp_path.rglob(".perf_summary.*.tmp"))  # the atomic writer left nothing behind


@pytest.mark.slow
def test_ddp_two_processes_write_one_summary(tmp_path):
    callbacks = [make(name) for name in NAMES]
    fit(tmp_path, callbacks, strategy="ddp_spawn", devices=2, max_epochs=2)
    summary = find_summary(tmp_path)
    assert summary["status"] == "completed"
    assert summary["run"]["world_size"] == 2
    for name in NAMES:
        assert section_of(name) in summary, name
        assert "measurement_failures" not in summary[section_of(name)], summary[section_of(name)]
    ranks = summary["iteration_timer"]["ranks"]["median_ms_per_iter"]
    assert len(ranks["per_rank"]) == 2 and all(v is not None for v in ranks["per_rank"])
    assert ranks["worst_rank"] in (0, 1)
    json.dumps(summary)
