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
from lightning_perf.summary.io import write_json_atomic


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
    assert copier.copies[0]._trainer_save is None and copier.copies[2]._sampler is None
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
    stale = tmp_path / f".perf_summary.{dead_pid}.abc123.tmp"
    alive = tmp_path / f".perf_summary.{os.getppid()}.def456.tmp"  # a living process: maybe still writing
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
