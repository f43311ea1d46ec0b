"""`lightning-perf run`: the suite attached to a user's unchanged training script, run as a real command."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import TinyModel, fit, write_toy_cli
from lightning.pytorch.callbacks import Timer
import lightning_perf._attach as attach
from lightning_perf import IterationTimer, PerfSuite, SectionProfiler
from lightning_perf._attach import gate_arguments, hook, parse_callbacks
from lightning_perf._attach.launch import STARTUP_DIR
from lightning_perf._attach.suite import AttachedSuite

pytestmark = pytest.mark.slow

#: A user's training script, in a folder with no lightning_perf import: ARGS are steps, exit code, folder.
TRAIN = '''
"""A user's training script, as it was before any measuring tool."""
import sys

import torch
from {namespace} import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loader(n):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4)


def main(argv, callbacks=None):
    steps, code, root = int(argv[0]), int(argv[1]), argv[2]
    print("args:", argv, flush=True)
    trainer = Trainer(max_steps=steps, val_check_interval=4, limit_val_batches=2, num_sanity_val_steps=0,
                      callbacks=callbacks, default_root_dir=root, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(Net(), loader(64), loader(8))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
'''


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def run_cli(*args, cwd=None, env=None, input=None, timeout=180):
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", "run", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, input=input, timeout=timeout)


def read(path):
    with open(path) as fh:
        return json.load(fh)


def sections(summary):
    return {key for key, value in summary.items()
            if isinstance(value, dict) and key not in ("run", "logged", "error", "diagnosis")}


def test_an_unchanged_script_is_measured_as_with_explicit_callbacks(tmp_path):
    script = write(tmp_path / "project" / "train.py", TRAIN.format(namespace="lightning.pytorch"))
    assert "lightning_perf" not in script.read_text()
    out = tmp_path / "runs"
    proc = run_cli("--out", str(out), "--name", "base", "--", sys.executable, str(script), "10", "3", "ckpt",
                   cwd=str(script.parent))
    assert proc.returncode == 3, proc.stderr  # the script's own exit code
    assert "args: ['10', '3', 'ckpt']" in proc.stdout  # its arguments in, its output out, ours not in it
    assert "lightning-perf run:" not in proc.stdout
    attached_path = out / "base" / "perf_summary.json"
    assert f"lightning-perf run: summary written to {attached_path}" in proc.stderr
    attached = read(attached_path)

    # the same script with PerfSuite given by hand, in this process
    spec = importlib.util.spec_from_file_location("user_train", script)
    user_train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(user_train)
    assert user_train.main(["10", "0", str(tmp_path / "explicit")], callbacks=[PerfSuite()]) == 0
    explicit = read(tmp_path / "explicit" / "perf_summary.json")

    assert attached["status"] == explicit["status"] == "completed"
    assert sections(attached) == sections(explicit) == {"iteration_timer", "section_profiler", "vram",
                                                        "eval_no_grad_guard"}
    a, e = attached["iteration_timer"], explicit["iteration_timer"]
    # closed form: 10 steps of 4 samples, a validation every 4 steps, the default 5 warm-up steps left out
    assert (a["iterations"], a["samples"], a["validation_runs"], a["measured_iterations"]) == (10, 40, 2, 5)
    for key in ("iterations", "batches", "samples", "measured_iterations", "warmup_steps", "validation_runs"):
        assert a[key] == e[key], key
    sa, se = attached["section_profiler"]["sections"], explicit["section_profiler"]["sections"]
    assert set(sa) == set(se) and {"data_loading", "forward", "backward", "optimizer_step"} <= set(sa)
    assert {n: s["count"] for n, s in sa.items()} == {n: s["count"] for n, s in se.items()}
    assert attached["run"]["name"] == "base" and explicit["run"]["name"] is None
    assert not (script.parent / "ckpt" / "perf_summary.json").exists()  # --out, not the script's log_dir


def test_trainers_with_lightning_perf_callbacks_are_left_alone_and_several_trainers_keep_their_files(tmp_path):
    script = write(tmp_path / "project" / "several.py", '''
        import torch
        from lightning.pytorch import LightningModule, Trainer
        from torch.utils.data import DataLoader, TensorDataset

        from lightning_perf import IterationTimer


        class Net(LightningModule):
            def __init__(self):
                super().__init__()
                self.net = torch.nn.Linear(4, 1)

            def training_step(self, batch, batch_idx):
                return self.net(batch[0]).pow(2).mean()

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)


        def fit(steps, callbacks=None, append=None):
            trainer = Trainer(max_steps=steps, callbacks=callbacks, logger=False, enable_checkpointing=False,
                              enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
            if append is not None:  # after construction: the attached suite stands aside at set-up
                trainer.callbacks.append(append)
            trainer.fit(Net(), DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4))


        fit(3, callbacks=[IterationTimer(summary_path="own/given.json")])
        fit(4)
        fit(6)
        fit(5, append=IterationTimer(summary_path="own/appended.json"))
        ''')
    out = tmp_path / "runs"
    proc = run_cli("--out", str(out), "--name", "multi", "--", sys.executable, str(script), cwd=str(script.parent))
    assert proc.returncode == 0, proc.stderr
    given, appended = read(script.parent / "own" / "given.json"), read(script.parent / "own" / "appended.json")
    assert given["iteration_timer"]["iterations"] == 3 and appended["iteration_timer"]["iterations"] == 5
    assert sections(given) == sections(appended) == {"iteration_timer"}  # no suite beside the user's callback
    first, second = read(out / "multi" / "perf_summary.json"), read(out / "multi" / "perf_summary_trainer2.json")
    assert first["iteration_timer"]["iterations"] == 4 and second["iteration_timer"]["iterations"] == 6
    assert (first["run"]["name"], second["run"]["name"]) == ("multi", "multi-trainer2")
    assert sorted(os.listdir(out / "multi")) == ["perf_summary.json", "perf_summary_trainer2.json"]
    assert "2 Trainer(s) had lightning_perf callbacks of their own and were left alone" in proc.stderr
    assert proc.stderr.count("lightning-perf run: summary written to") == 2


def test_module_form_with_lightning_cli_and_chosen_callbacks(tmp_path):
    pytest.importorskip("jsonargparse")
    project = tmp_path / "project"
    write(project / "pkg" / "__init__.py", "")
    write_toy_cli(project / "pkg" / "train_cli.py", lr=0.1, samples=32)
    out = tmp_path / "runs"
    proc = run_cli("--out", str(out), "--callbacks", "iterationtimer,SectionProfiler", "--", sys.executable, "-m",
                   "pkg.train_cli", "fit", "--trainer.max_steps=7", "--trainer.logger=false",
                   "--trainer.enable_progress_bar=false", "--trainer.enable_checkpointing=false", "--model.lr=0.05",
                   cwd=str(project))
    assert proc.returncode == 0, proc.stderr
    summary = read(out / "perf_summary.json")
    assert sections(summary) == {"iteration_timer", "section_profiler"}
    assert summary["iteration_timer"]["iterations"] == 7  # 8 batches an epoch: max_steps ends it
    assert "--model.lr=0.05" in summary["run"]["command"]


def test_pytorch_lightning_namespace(tmp_path):
    pytest.importorskip("pytorch_lightning")
    script = write(tmp_path / "project" / "train_pl.py", TRAIN.format(namespace="pytorch_lightning"))
    proc = run_cli("--out", str(tmp_path / "runs"), "--", sys.executable, str(script), "6", "0", "logs",
                   cwd=str(script.parent))
    assert proc.returncode == 0, proc.stderr
    summary = read(tmp_path / "runs" / "perf_summary.json")
    assert summary["iteration_timer"]["iterations"] == 6 and summary["iteration_timer"]["samples"] == 24
    assert summary["iteration_timer"]["validation_runs"] == 1


def test_a_command_without_lightning_runs_untouched(tmp_path):
    """Arguments, stdin, stdout and exit code pass through; Lightning is never imported for it; the user's
    PYTHONPATH and own sitecustomize still work; nothing of the run is left behind."""
    user_site = write(tmp_path / "usersite" / "sitecustomize.py", '''
        import os
        os.environ["USER_SITECUSTOMIZE"] = "ran"
        ''').parent
    script = write(tmp_path / "plain.py", '''
        import os, sys
        print("argv", sys.argv[1:])
        print("stdin", sys.stdin.readline().strip())
        print("lightning imported", any(m.split(".")[0] in ("lightning", "torch", "pytorch_lightning")
                                        for m in sys.modules))
        print("startup folder on sys.path", any(p and os.path.abspath(p) == {startup!r} for p in sys.path))
        print("user sitecustomize", os.environ.get("USER_SITECUSTOMIZE"))
        print("user entry on sys.path", {user!r} in sys.path)
        sys.exit(3)
        '''.replace("{startup!r}", repr(STARTUP_DIR)).replace("{user!r}", repr(str(user_site))))
    own_tmp = tmp_path / "tmp"
    own_tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(own_tmp),
               PYTHONPATH=os.pathsep.join([str(user_site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = run_cli("--", sys.executable, str(script), "--out", "x y", env=env, input="hello\n")
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.splitlines() == ["argv ['--out', 'x y']", "stdin hello", "lightning imported False",
                                        "startup folder on sys.path False", "user sitecustomize ran",
                                        "user entry on sys.path True"]
    assert "lightning-perf run: no Trainer was built; nothing was measured" in proc.stderr
    assert os.listdir(own_tmp) == []  # the manifest is gone


@pytest.mark.parametrize("how, expected", [("SIGTERM", 5), ("SIGINT", 130), ("SIGKILL", 137)])
def test_signals_reach_the_command_and_its_exit_status_comes_back(tmp_path, how, expected):
    script = write(tmp_path / "wait.py", '''
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: (print("got SIGTERM", flush=True), sys.exit(5)))
        print("ready", flush=True)
        if sys.argv[1] == "SIGKILL":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        ''')
    proc = subprocess.Popen([sys.executable, "-m", "lightning_perf.cli", "run", "--", sys.executable, str(script),
                             how], stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        if how != "SIGKILL":
            time.sleep(0.2)  # the parent's handlers are installed before the command starts; this is for slack only
            proc.send_signal(getattr(signal, how))  # to lightning-perf, not to the command
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == expected, err
    assert ("got SIGTERM" in out) == (how == "SIGTERM")


def test_bad_callbacks_name_the_value_and_the_choices_and_run_nothing(tmp_path):
    marker = tmp_path / "ran"
    script = write(tmp_path / "touch.py", f"open({str(marker)!r}, 'w').close()\n")
    proc = run_cli("--callbacks", "IterationTimer,GPUMonitor", "--", sys.executable, str(script))
    assert proc.returncode == 2
    assert "argument --callbacks: 'GPUMonitor' in 'IterationTimer,GPUMonitor' is not a lightning_perf callback;" \
           " allowed: IterationTimer, SectionProfiler, VRAMMonitor, EvalNoGradGuard, QualityGate" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not marker.exists()
    with pytest.raises(ValueError, match="named twice"):
        parse_callbacks("IterationTimer,iterationtimer")
    with pytest.raises(ValueError, match="at least one"):
        parse_callbacks(" , ")
    assert parse_callbacks("vrammonitor, QualityGate") == ["VRAMMonitor", "QualityGate"]


def test_bad_out_name_baseline_and_command_fail_before_anything_runs(tmp_path):
    marker = tmp_path / "ran"
    script = write(tmp_path / "touch.py", f"open({str(marker)!r}, 'w').close()\n")
    (tmp_path / "file").write_text("")
    cases = [
        (["--out", str(tmp_path / "file")], f"--out {str(tmp_path / 'file')!r} is a file; expected a folder"),
        (["--out", str(tmp_path), "--name", "a/b"], "--name 'a/b': expected a folder name"),
        (["--baseline", str(tmp_path / "missing.json")], "--baseline"),
        ([], "run needs the command to run after --"),
    ]
    for options, message in cases:
        command = [] if not options else ["--", sys.executable, str(script)]
        proc = run_cli(*options, *command)
        assert proc.returncode == 2 and message in proc.stderr, (options, proc.stderr)
    assert not marker.exists()
    proc = run_cli("--", str(tmp_path / "no-such-program"))
    assert proc.returncode == 127 and "command not found" in proc.stderr


def test_gate_arguments_gate_every_metric_of_the_baseline(tmp_path):
    summary = tmp_path / "base.json"  # a summary's quality section alone: not a whole summary for conftest's check
    summary.write_text(json.dumps({"schema_version": 2, "quality_gate": {"metrics": {
        "psnr": {"value": 30.0, "mode": "max"}, "l1": {"value": 0.02, "mode": "min"},
        "val/acc": {"value": 0.9, "mode": "max"}}}}))
    assert gate_arguments(str(summary)) == {"metrics": ["psnr", "l1"], "monitor": {"val/acc": "max"}}
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"kind": "lightning_perf.quality_baseline", "metrics": {}}))
    with pytest.raises(ValueError, match="no quality metric to gate"):
        gate_arguments(str(empty))


def test_attach_failures_leave_the_trainer_as_the_script_built_it(tmp_path, monkeypatch, capsys):
    """A suite that cannot be built: the Trainer gets exactly the script's arguments, one line says why."""
    monkeypatch.setenv("LIGHTNING_PERF_RUN_CALLBACKS", "IterationTimer,QualityGate")
    monkeypatch.setenv("LIGHTNING_PERF_RUN_BASELINE", str(tmp_path / "gone.json"))
    given = {"callbacks": [Timer()], "max_steps": 3}
    assert hook.with_suite(given, "lightning.pytorch") is given
    assert hook.with_suite(given, "lightning.pytorch") is given
    err = capsys.readouterr().err
    assert err.count("lightning-perf run: the suite could not be attached") == 1 and "gone.json" in err
    monkeypatch.delenv("LIGHTNING_PERF_RUN_BASELINE")
    mine = [Timer()]
    built = hook.with_suite({"callbacks": mine, "max_steps": 3}, "lightning.pytorch")
    assert built["callbacks"][0] is mine[0] and isinstance(built["callbacks"][1], AttachedSuite)
    assert len(mine) == 1  # a new list: the script's own is not changed
    theirs = {"callbacks": [SectionProfiler()]}
    assert hook.with_suite(theirs, "lightning.pytorch") is theirs  # lightning_perf callbacks given: left alone


def test_attached_suite_stands_aside_when_its_summary_cannot_be_written(tmp_path, monkeypatch):
    monkeypatch.setitem(attach._count, "trainers", 0)  # the process's first Trainer, whatever ran before: its file is
    (tmp_path / "out" / "perf_summary.json").mkdir(parents=True)  # perf_summary.json, and a folder is there
    suite = AttachedSuite([IterationTimer()], out=str(tmp_path / "out"))
    trainer = fit(tmp_path / "logs", [suite], model=TinyModel(), max_epochs=1, logger=False)
    assert trainer.global_step == 8  # the fit ran to its end
    assert suite.callbacks == [] and suite.trainer_number is not None
    assert not (tmp_path / "logs" / "perf_summary.json").exists()
