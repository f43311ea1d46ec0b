"""Nothing lost: copies of running callbacks, summary files' permissions and leftovers, SIGTERM recorded."""

import copy
import os
import pickle
import signal
import stat
import subprocess
import sys

import pytest
from lightning.pytorch import Callback

from helpers import TinyModel, find_summary, fit
from lightning_perf import IterationTimer, SectionProfiler, VRAMMonitor
from lightning_perf.summary.io import _temporary_prefix, write_json_atomic


class CopyDuringFit(Callback):
    """Deep-copies and pickles the given callbacks in the middle of training, as a user's code or a spawn might."""

    def __init__(self, targets):
        self.targets, self.copies = targets, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx == 3:
            for target in self.targets:
                self.copies.append(copy.deepcopy(target))
                self.copies.append(pickle.loads(pickle.dumps(target)))


def test_running_profiler_and_monitor_can_be_copied_and_pickled(tmp_path):
    targets = [SectionProfiler(print_reports=False, warmup_steps=1), VRAMMonitor(nvml_interval_s=0.01)]
    copier = CopyDuringFit(targets)
    fit(tmp_path, targets + [copier], max_epochs=1)
    assert len(copier.copies) == 4
    assert copier.copies[0]._checkpoint_io is None and copier.copies[2]._sampler is None
    # the originals were not disturbed: the fit measured on
    s = find_summary(tmp_path)
    assert s["section_profiler"]["iterations"] == 7 and s["vram"]["sampler_samples"] > 0


def test_summary_file_gets_the_process_umask_like_lightnings_files(tmp_path):
    old = os.umask(0o022)
    try:
        write_json_atomic(str(tmp_path / "perf_summary.json"), {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "perf_summary.json").st_mode) == 0o644


def test_temporaries_of_a_killed_writer_are_removed_at_the_next_write(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f"{_temporary_prefix(dead_pid)}abc123.tmp"  # named like this host's writers' files
    alive = tmp_path / f"{_temporary_prefix(os.getppid())}def456.tmp"  # a living process: maybe still writing
    stale.write_text("{half")
    alive.write_text("{half")
    write_json_atomic(str(tmp_path / "perf_summary.json"), {"a": 1})
    assert not stale.exists() and alive.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, "perf_summary.json"])


class TerminatedModel(TinyModel):
    def training_step(self, batch, batch_idx):
        if batch_idx == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler turns it into SIGTERMException
        return super().training_step(batch, batch_idx)


def test_sigterm_is_recorded_as_interrupted_with_the_signal_named(tmp_path):
    with pytest.raises(SystemExit):
        fit(tmp_path, [IterationTimer(warmup_steps=1)], model=TerminatedModel(), max_epochs=1)
    s = find_summary(tmp_path)
    assert s["status"] == "interrupted"
    assert s["error"]["type"] == "SIGTERMException" and s["error"]["signal"] == "SIGTERM"
    assert s["error"]["message"] and s["iteration_timer"]["iterations"] >= 3


# -- the conformance group: every callback of the suite, nothing lost --------------------------------------------

from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from helpers import trainer_kwargs  # noqa: E402
from lightning_perf import PerfConfigError  # noqa: E402
from suite import SUITE  # noqa: E402

NAMES = sorted(SUITE)


class ModelWithTest(TinyModel):
    def __init__(self, fail_test=False):
        super().__init__()
        self.fail_test = fail_test

    def test_step(self, batch, batch_idx):
        if self.fail_test:
            raise RuntimeError("test blew up")
        return self.validation_step(batch, batch_idx)

    def test_dataloader(self):
        return self.val_dataloader()

    def predict_step(self, batch, batch_idx):
        return self(batch[0])


def _read(path):
    import json

    with open(path) as fh:
        return json.load(fh)


@pytest.mark.parametrize("name", NAMES)
def test_a_failing_test_after_a_fit_leaves_the_fits_summary_alone(name, tmp_path):
    cb = SUITE[name][0]()
    model = ModelWithTest(fail_test=True)
    trainer = Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
    trainer.fit(model)
    fit_path = os.path.join(trainer.log_dir, "perf_summary.json")
    before = _read(fit_path)
    with pytest.raises(RuntimeError, match="test blew up"):
        trainer.test(model)
    after = _read(fit_path)
    assert after["status"] == "completed" and after[SUITE[name][1]] == before[SUITE[name][1]]
    test_path = os.path.join(trainer.log_dir, "perf_summary_test.json")
    if name == "VRAMMonitor":  # the one callback that measures a test run: its own file, failed
        t = _read(test_path)
        assert t["status"] == "failed" and t["stage"] == "test" and "test" in t["vram"]["phases"]
        assert set(after["vram"]["phases"]) == {"train", "validation"}


def test_test_and_predict_memory_reach_their_own_summaries(tmp_path):
    from lightning_perf import VRAMMonitor

    model = ModelWithTest()
    trainer = Trainer(callbacks=[VRAMMonitor(nvml_interval_s=0.01)], **trainer_kwargs(tmp_path, max_epochs=1))
    trainer.fit(model)
    trainer.test(model)
    trainer.predict(model, dataloaders=model.val_dataloader())
    for stage in ("test", "predict"):
        s = _read(os.path.join(trainer.log_dir, f"perf_summary_{stage}.json"))
        assert s["status"] == "completed" and s["stage"] == stage
        assert s["vram"]["phases"][stage]["host_rss_peak_mb"] > 0
    assert _read(os.path.join(trainer.log_dir, "perf_summary.json"))["stage"] == "fit"


@pytest.mark.parametrize("name", NAMES)
def test_continuing_a_fit_on_the_same_trainer_accumulates_like_a_resume(name, tmp_path):
    timer = IterationTimer(warmup_steps=1)
    cbs = [timer] if name == "IterationTimer" else [timer, SUITE[name][0]()]
    model = TinyModel()
    trainer = Trainer(callbacks=cbs, **trainer_kwargs(tmp_path, max_epochs=1))
    trainer.fit(model)
    trainer.fit_loop.max_epochs = 2
    trainer.fit(model)
    s = find_summary(tmp_path)
    assert s["status"] == "completed" and s["run"]["global_step"] == 16
    assert s["iteration_timer"]["iterations"] == 16 and s["iteration_timer"]["fits"] == 2
    trainer.fit(model)  # nothing left to do: the record must not drop to zero
    assert find_summary(tmp_path)["iteration_timer"]["iterations"] == 16
    assert "measurement_failures" not in find_summary(tmp_path)[SUITE[name][1]]


def test_section_profiler_covers_the_whole_run_after_a_mid_epoch_resume(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=12, save_top_k=-1)
    fit(tmp_path / "a", [IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, print_reports=False),
                         ckpt], max_epochs=None, max_steps=12)
    timer, profiler = IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, print_reports=False)
    trainer = Trainer(callbacks=[timer, profiler], **trainer_kwargs(tmp_path / "b", max_epochs=3))
    trainer.fit(TinyModel(), ckpt_path=str(next((tmp_path / "ckpt").glob("*.ckpt"))))
    s = find_summary(tmp_path / "b")
    t, p = s["iteration_timer"], s["section_profiler"]
    # Lightning's own count: 24 steps (12 + 12) since 2.3; 2.2 runs one batch more after a mid-epoch resume (25)
    assert trainer.global_step in (24, 25)
    assert t["iterations"] == trainer.global_step
    assert sum(e["iterations"] for e in t["epochs"]) == trainer.global_step, t["epochs"]
    assert [e["epoch"] for e in t["epochs"]] == [0, 1, 2]
    assert p["iterations"] == t["measured_iterations"]  # both: every iteration of both processes, warm-ups out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("where", ["proc", "directory"])
def test_an_unwritable_summary_path_fails_before_training(name, where, tmp_path):
    path = "/proc/lightning_perf/perf_summary.json" if where == "proc" else str(tmp_path)
    cb = SUITE[name][0]()
    cb.summary_path = path

    class Counting(TinyModel):
        steps = 0

        def training_step(self, batch, batch_idx):
            Counting.steps += 1
            return super().training_step(batch, batch_idx)

    with pytest.raises(PerfConfigError, match=r"summary_path"):
        fit(tmp_path / "run", [cb], model=Counting(), max_epochs=1)
    assert Counting.steps == 0


def test_an_unwritable_record_baseline_fails_before_training(tmp_path):
    from lightning_perf import QualityGate

    gate = QualityGate(metrics=[], monitor={"val_loss": "min"}, record_baseline="/proc/nope/base.json")
    with pytest.raises(PerfConfigError, match=r"QualityGate\(record_baseline\)='/proc/nope/base.json' cannot be"):
        fit(tmp_path, [gate], max_epochs=1)


def test_a_disk_that_fails_at_the_end_sends_the_summary_to_the_log_dir(tmp_path, monkeypatch):
    from lightning_perf.callbacks.core import summary_book as _summary_book

    target = tmp_path / "elsewhere" / "s.json"
    real = _summary_book.write_json_atomic

    def flaky(path, data):
        if str(path) == str(target):
            raise OSError("disk full")
        return real(path, data)

    monkeypatch.setattr(_summary_book, "write_json_atomic", flaky)
    with pytest.warns(UserWarning, match="disk full.*the summary went to"):
        fit(tmp_path / "run", [IterationTimer(summary_path=str(target))], max_epochs=1)
    assert find_summary(tmp_path / "run")["status"] == "completed"


@pytest.mark.parametrize("make, match", [
    (lambda: SectionProfiler(enabled="false"), r"SectionProfiler\(enabled='false'\).*True or False"),
    (lambda: IterationTimer(verbose=1), r"IterationTimer\(verbose=1\)"),
    (lambda: IterationTimer(summary_path=123), r"IterationTimer\(summary_path=123\).*file path"),
    (lambda: VRAMMonitor(leak_threshold_mb_per_100=float("nan")), r"leak_threshold_mb_per_100=nan"),
    (lambda: VRAMMonitor(nvml="yes"), r"VRAMMonitor\(nvml='yes'\)"),
])
def test_constructor_gaps_fail_at_construction(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize("kwargs, match", [
    ({"monitor": ["val/acc"]}, r"QualityGate\(monitor=\['val/acc'\]\).*dict"),
    ({"metrics": []}, r"Nothing to gate"),
    ({"baseline": {"psnr": float("nan"), "ssim": 0.9, "l1": 0.1, "lpips": 0.2}}, r"baseline of nan"),
    ({"record_baseline": 5}, r"record_baseline=5"),
])
def test_quality_gate_constructor_gaps(kwargs, match):
    from lightning_perf import QualityGate

    with pytest.raises(ValueError, match=match):
        QualityGate(**kwargs)


def test_a_negative_batch_size_is_not_used(tmp_path):
    with pytest.warns(UserWarning, match="negative batch size"):
        fit(tmp_path, [IterationTimer(batch_size_fn=lambda batch: -3)], max_epochs=1)
    t = find_summary(tmp_path)["iteration_timer"]
    assert t["samples_per_s"] is None and "negative" in t["unavailable"]["samples_per_s"]


@pytest.mark.parametrize("name", NAMES + ["PerfSuite"])
def test_a_finished_fit_leaves_nothing_alive(name, tmp_path):
    """A process that runs many fits (a sweep, a notebook) must get each fit's trainer, model and data back once
    the user drops them. Lightning gives every callback `log = lightning_module.log`; a summary registry keyed
    weakly by the trainer but holding the callbacks kept every fit alive for the whole process (seen on a GPU as
    7.5 GB of CUDA tensors from earlier fits)."""
    import gc
    import weakref

    from lightning_perf import PerfSuite

    def run():
        cb = PerfSuite([SUITE[n][0]() for n in NAMES]) if name == "PerfSuite" else SUITE[name][0]()
        model = TinyModel()
        trainer = Trainer(callbacks=[cb], **trainer_kwargs(tmp_path, max_epochs=1))
        trainer.fit(model)
        return weakref.ref(model), weakref.ref(trainer)

    model_ref, trainer_ref = run()
    gc.collect()
    assert model_ref() is None and trainer_ref() is None


def _count_writes(monkeypatch):
    from lightning_perf.callbacks.core import summary_book as _summary_book

    writes = []
    real = _summary_book.write_json_atomic

    def counting(path, data):
        writes.append((path, data["status"], sorted(k for k in data if k in SECTIONS)))
        return real(path, data)

    monkeypatch.setattr(_summary_book, "write_json_atomic", counting)
    return writes


SECTIONS = ("iteration_timer", "section_profiler", "vram", "eval_no_grad_guard", "quality_gate")


@pytest.mark.parametrize("together", [False, True])
def test_a_fit_end_writes_the_summary_once_with_every_section(tmp_path, monkeypatch, together):
    from lightning_perf import EvalNoGradGuard, PerfSuite, QualityGate

    writes = _count_writes(monkeypatch)
    callbacks = [IterationTimer(), SectionProfiler(print_reports=False), VRAMMonitor(), EvalNoGradGuard(),
                 QualityGate(metrics=[], monitor={"val_loss": "min"})]
    fit(tmp_path, [PerfSuite(callbacks)] if together else callbacks, max_epochs=1)
    assert writes == [(writes[0][0], "completed", sorted(SECTIONS))]
    assert find_summary(tmp_path)["status"] == "completed"


def test_a_callback_whose_end_fails_before_it_writes_still_gets_the_file_written_at_teardown(tmp_path, monkeypatch):
    """QualityGate's fit end fails before it writes (here: while it works out why a gate never checked): the failure
    is recorded, and teardown writes the record that the gate never ended. (A baseline that cannot be written no
    longer ends the hook early: test_fail_closed_state.py covers that.)"""
    from lightning_perf import QualityGate

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(QualityGate, "_never_checked_reason", broken)
    writes = _count_writes(monkeypatch)
    gate = QualityGate(metrics=[], monitor={"val_loss": "min"}, baseline={"val_loss": 1.0}, at_steps=[5000])
    with pytest.warns(UserWarning, match="disk full"):
        fit(tmp_path, [IterationTimer(), gate], max_epochs=1)
    assert len(writes) == 1
    s = find_summary(tmp_path)
    assert s["status"] == "completed" and s["iteration_timer"]["measured_iterations"] > 0
    assert "disk full" in s["quality_gate"]["measurement_failures"]["on_fit_end"]
