"""Writes an adversary can break (issue 63): summaries of several processes under one ``run``, a SIGTERM while the
suite writes at the end of a fit, a ``--baseline`` that is not a regular file."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def run_cli(*args, cwd=None, timeout=240, preexec_fn=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", "run", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout, stdin=subprocess.DEVNULL, preexec_fn=preexec_fn)


def _data_limit(gib):
    """A child's heap capped at ``gib`` GiB: a reader that takes /dev/zero whole fails fast (MemoryError) instead of
    filling the machine's memory before a timeout ends it."""
    import resource

    limit = int(gib * 2**30)
    return lambda: resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def read(path):
    with open(path) as fh:
        return json.load(fh)


# -- 1. several processes under one `run` ----------------------------------------------------------------------------

#: A user's script that fits one Trainer in each of two processes; ARGS: how the processes are made.
POOL = '''
import multiprocessing
import os
import sys

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(steps):
    torch.set_num_threads(1)
    trainer = Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(Net(), DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4))
    return steps


if __name__ == "__main__":
    how = sys.argv[1]
    if how == "os.fork":
        pid = os.fork()
        fit(3 if pid == 0 else 4)
        if pid == 0:
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    pool = multiprocessing.get_context(how).Pool(2)
    print(sorted(pool.map(fit, [3, 4], chunksize=1)), flush=True)
    pool.close()
    pool.join()
'''


@pytest.mark.parametrize("how", ["fork", "spawn", "os.fork"])
def test_trainers_of_two_processes_under_one_run_get_a_file_each(tmp_path, how):
    script = write(tmp_path / "project" / "pool.py", POOL)
    out = tmp_path / "o"
    proc = run_cli("--out", str(out), "--name", "p", "--", sys.executable, str(script), how, cwd=str(script.parent))
    assert proc.returncode == 0, proc.stderr
    files = sorted(os.listdir(out / "p"))
    assert files == ["perf_summary.json", "perf_summary_trainer2.json"], (files, proc.stderr)
    summaries = [read(out / "p" / name) for name in files]
    assert sorted(s["iteration_timer"]["iterations"] for s in summaries) == [3, 4]  # one file per fit, none lost
    assert [s["run"]["name"] for s in summaries] == ["p", "p-trainer2"]
    assert all(s["status"] == "completed" for s in summaries)
    for name in files:
        assert proc.stderr.count(f"lightning-perf run: summary written to {out / 'p' / name}\n") == 1, proc.stderr


DDP = """
    if sys.argv[1] == "ddp":
        trainer = Trainer(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                          enable_model_summary=False, accelerator="cpu", devices=2, strategy="ddp")
        trainer.fit(Net(), DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4))
        sys.exit(0)
"""


def test_a_ddp_fit_under_run_is_one_trainer_numbered_by_rank_0(tmp_path):
    """Its ranks are processes of the command too: rank 0 takes the number, the others get it from rank 0."""
    script = write(tmp_path / "project" / "ddp.py", POOL.replace('\n    how = sys.argv[1]\n', DDP + '    how = 0\n'))
    out = tmp_path / "o"
    proc = run_cli("--out", str(out), "--name", "d", "--", sys.executable, str(script), "ddp", cwd=str(script.parent))
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(out / "d")) == ["perf_summary.json"], proc.stderr
    summary = read(out / "d" / "perf_summary.json")
    assert summary["run"]["world_size"] == 2 and summary["run"]["name"] == "d"
    assert proc.stderr.count("lightning-perf run: summary written to") == 1, proc.stderr


# -- 2. SIGTERM while the suite writes at the end of a fit -----------------------------------------------------------

#: A fit whose process SIGTERMs itself at the end of the fit, where ARGV[2] says: inside the summary's write (between
#: the temporary file and its rename), inside the diagnosis of the first end report, or in a user's on_fit_end between
#: two lightning_perf callbacks (Lightning has given SIGTERM its default action back by then).
SIGTERM_AT_END = '''
import os
import signal
import sys

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

import lightning_perf.callbacks.core.summary_book as book
import lightning_perf.summary.io as io
from lightning_perf import IterationTimer, PerfSuite, SectionProfiler


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def terminate_once(fn):
    done = []

    def wrapper(*args, **kwargs):
        if not done:
            done.append(1)
            print("sending SIGTERM", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
        return fn(*args, **kwargs)

    return wrapper


class TerminateAtFitEnd(Callback):
    def on_fit_end(self, trainer, pl_module):
        print("sending SIGTERM", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)


root, where = sys.argv[1], sys.argv[2]
if where in ("write", "run"):
    io._json_safe = terminate_once(io._json_safe)  # inside write_json_atomic, after the temporary file is made
    callbacks = None if where == "run" else [PerfSuite()]  # under `lightning-perf run`: the suite it attaches
elif where == "diagnosis":
    book.diagnose = terminate_once(book.diagnose)  # the first end report prints the diagnosis
    callbacks = [PerfSuite()]
else:
    callbacks = [IterationTimer(), TerminateAtFitEnd(), SectionProfiler()]
torch.set_num_threads(1)
trainer = Trainer(max_steps=6, callbacks=callbacks, default_root_dir=root, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
trainer.fit(Net(), DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4))
print("after fit", flush=True)
'''


@pytest.mark.parametrize("where", ["write", "diagnosis", "user_hook_between"])
def test_sigterm_while_the_suite_writes_at_fit_end_keeps_the_whole_summary(tmp_path, where):
    script = write(tmp_path / "sigterm_at_end.py", SIGTERM_AT_END)
    root = tmp_path / "root"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.run([sys.executable, str(script), str(root), where], capture_output=True, text=True, env=env,
                          timeout=180, stdin=subprocess.DEVNULL)
    assert "sending SIGTERM" in proc.stdout, proc.stderr
    assert proc.returncode == -signal.SIGTERM, proc.stderr  # the process still ends as SIGTERM asks (143 in a shell)
    assert "after fit" not in proc.stdout
    assert sorted(os.listdir(root)) == ["perf_summary.json"]  # no .perf_summary.*.tmp left
    summary = read(root / "perf_summary.json")
    assert summary["status"] == "interrupted"
    assert summary["error"]["signal"] == "SIGTERM" and summary["error"]["type"] == "SIGTERM"
    assert "after the fit completed" in summary["error"]["message"]
    assert summary["iteration_timer"]["iterations"] == 6  # the whole fit: its measurements are complete
    # the iterations after the 5 warm-up steps, as in a fit that ends normally
    assert summary["section_profiler"]["iterations"] == summary["iteration_timer"]["measured_iterations"] == 1
    if where != "user_hook_between":
        assert summary["vram"] and summary["eval_no_grad_guard"]
    assert summary["diagnosis"]["verdict"]


# -- 4. a --baseline that is not a regular file ----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_run_refuses_a_baseline_that_is_not_a_regular_file_at_once(tmp_path, kind):
    if kind == "fifo":
        path = str(tmp_path / "baseline.json")
        os.mkfifo(path)
        what = "a named pipe"
    else:
        path, what = kind, "a character device"
    marker = tmp_path / "ran"
    # the hang guards: read whole, /dev/zero fills memory (capped) and a named pipe blocks until the timeout; the
    # timeout leaves room for the command's start on a busy machine (7 s idle, over 60 s seen under load)
    proc = run_cli("--baseline", path, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w').close()",
                   timeout=240, preexec_fn=_data_limit(6))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"lightning-perf: error: --baseline {path!r}: "), proc.stderr
    assert f"is {what}, not a regular file" in lines[0]
    assert not marker.exists()  # refused before the command ran


def test_sigterm_while_the_attached_suite_writes_under_run_keeps_the_summary_and_says_where(tmp_path):
    script = write(tmp_path / "project" / "sigterm_at_end.py", SIGTERM_AT_END)
    out = tmp_path / "o"
    proc = run_cli("--out", str(out), "--", sys.executable, str(script), str(tmp_path / "root"), "run",
                   cwd=str(script.parent))
    assert "sending SIGTERM" in proc.stdout, proc.stderr
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert sorted(os.listdir(out)) == ["perf_summary.json"]
    assert f"lightning-perf run: summary written to {out / 'perf_summary.json'}" in proc.stderr
    summary = read(out / "perf_summary.json")
    assert summary["status"] == "interrupted" and summary["error"]["signal"] == "SIGTERM"
    assert summary["iteration_timer"]["iterations"] == 6


def test_a_fit_that_ends_without_a_signal_gives_sigterm_back_as_it_found_it(tmp_path):
    from helpers import fit, find_summary
    from lightning_perf import PerfSuite

    def handler(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        fit(tmp_path, [PerfSuite()], max_steps=3)
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGTERM, previous)
    summary = find_summary(tmp_path)
    assert summary["status"] == "completed" and summary["error"] is None
