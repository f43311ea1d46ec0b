"""`--trial MODULE:SWITCH_ON,SWITCH_OFF` (and `MODULE:OBJECT`): a user's own change, tried from the command line
inside an unchanged script, by `lightning-perf run` and `lightning-perf matrix`, and by name in `ABTrial`."""

import json
import os
import subprocess
import sys

import pytest
from helpers import TinyModel, find_summary, fit, write_toy_cli
from test_run_command import TRAIN, run_cli, write

from lightning_perf import ABTrial
from lightning_perf.cli import main
from lightning_perf.errors import PerfConfigError

#: A package of switches, written beside (not inside) the script and put on PYTHONPATH: `on` makes the model's
#: forward sleep 5 ms (an instance attribute over the class's method), `off` takes that away again.
SWITCHES = '''
import time

DELAY_S = 0.005
LOG = {log!r}


def _mark(word):
    if LOG:
        with open(LOG, "a") as fh:
            fh.write(word + "\\n")


def on(trainer, pl_module):
    net = pl_module.net
    inner = type(net).forward

    def slow_forward(*args, **kwargs):
        time.sleep(DELAY_S)
        return inner(net, *args, **kwargs)

    net.forward = slow_forward
    _mark("on")


def off(trainer, pl_module):
    pl_module.net.__dict__.pop("forward", None)
    _mark("off")


def broken_on(trainer, pl_module):
    raise RuntimeError("the switch broke")


def takes_one(trainer):
    pass


class Slow:
    """The same change as an object with switch_on / switch_off."""

    def switch_on(self, trainer, pl_module):
        on(trainer, pl_module)

    def switch_off(self, trainer, pl_module):
        off(trainer, pl_module)
'''


def write_switches(root, package="tests_pkg", log=""):
    write(root / package / "__init__.py", "")
    return write(root / package / "switches.py", SWITCHES.format(log=log))


def with_pythonpath(root):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return env


def run_script(tmp_path, spec, steps, switch_root=None, timeout=180):
    script = write(tmp_path / "project" / "train.py", TRAIN.format(namespace="lightning.pytorch"))
    env = with_pythonpath(switch_root) if switch_root is not None else None
    proc = run_cli("--out", str(tmp_path / "runs"), "--trial", spec, "--", sys.executable, str(script), str(steps),
                   "0", "ckpt", cwd=str(script.parent), env=env, timeout=timeout)
    summary_path = tmp_path / "runs" / "perf_summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return proc, summary


@pytest.mark.slow
def test_run_trial_of_a_users_switch_pair_finds_the_injected_sleep(tmp_path):
    """The switches are imported in the script's process (not in the script, which is unchanged): the on arm's
    forward sleeps 5 ms, so the trial decides the change slower and the arms differ by about the sleep."""
    write_switches(tmp_path / "switchpath")
    spec = "tests_pkg.switches:on,off"
    proc, summary = run_script(tmp_path, spec, 260, switch_root=tmp_path / "switchpath")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["status"] == "completed"
    trial = summary["trial"]
    assert trial["change"] == spec and trial["status"] == "done", trial
    assert trial["pairs"] == 12 and trial["verdict"] == "slower" and trial["speedup"] < 1
    # the arms differ by the injected sleep (at least 5 ms each on-iteration): a bound on the difference, generous
    extra_ms = trial["arms"]["on"]["ms_per_iter"] - trial["arms"]["off"]["ms_per_iter"]
    assert 2.5 < extra_ms < 100, trial["arms"]
    assert trial["switches"] >= 2 and trial["quality_degraded_on"] == []
    assert f"ABTrial: with {spec}: " in proc.stderr and "x slower" in proc.stderr


@pytest.mark.slow
def test_run_trial_of_a_switch_object_is_tried_the_same_way(tmp_path):
    """`MODULE:OBJECT`: a class with switch_on / switch_off (instantiated without arguments)."""
    log = tmp_path / "switched.txt"
    write_switches(tmp_path / "switchpath", log=str(log))
    proc, summary = run_script(tmp_path, "tests_pkg.switches:Slow", 40, switch_root=tmp_path / "switchpath")
    assert proc.returncode == 0, proc.stderr[-3000:]
    trial = summary["trial"]
    assert trial["change"] == "tests_pkg.switches:Slow" and trial["status"] == "incomplete", trial
    assert trial["switches"] >= 2 and log.read_text().split()[:2] == ["on", "off"]
    assert summary["iteration_timer"]["iterations"] == 40


@pytest.mark.parametrize("spec", ["tests_pkg.switches", "tests_pkg.switches:", ":on,off", "tests_pkg.switches:on,",
                                  "tests_pkg.switches:,off", "tests_pkg.switches:on,off,again", "mod:on off",
                                  "1mod:on,off", "mod..x:on,off", "mod:on,1off"])
@pytest.mark.parametrize("command", ["run", "matrix"])
def test_a_malformed_trial_spec_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, spec, command):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"
    if command == "run":
        argv = ["run", "--trial", spec, "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    else:
        write_toy_cli(tmp_path / "cli_toy.py", lr=0.05, samples=64)
        argv = ["matrix", "--script", "cli_toy.py", "--variant", "baseline", "--trial", spec, "--out", "runs"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"argument --trial: {spec!r}" in err or f"argument --trial: invalid choice: {spec!r}" in err, err
    assert "MODULE:SWITCH_ON,SWITCH_OFF" in err and "MODULE:OBJECT" in err and "'channels_last'" in err, err
    assert not marker.exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_run_trial_of_a_module_that_cannot_be_imported_is_not_started_and_training_goes_on(tmp_path):
    proc, summary = run_script(tmp_path, "no_such_module_here.switches:on,off", 12)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["status"] == "completed" and summary["iteration_timer"]["iterations"] == 12
    trial = summary["trial"]
    assert trial["status"] == "not-started" and trial["pairs"] == 0 and trial["speedup"] is None
    assert "cannot import 'no_such_module_here.switches'" in trial["reason"], trial["reason"]
    assert "No module named 'no_such_module_here'" in trial["reason"]
    assert "cannot import 'no_such_module_here.switches'" in proc.stderr and "runs without the trial" in proc.stderr


@pytest.mark.slow
def test_run_trial_of_a_switch_that_raises_is_stopped_and_training_completes(tmp_path):
    write_switches(tmp_path / "switchpath")
    # warm-up 20: the change goes on after 10 iterations, and its switch raises there
    proc, summary = run_script(tmp_path, "tests_pkg.switches:broken_on,off", 30, switch_root=tmp_path / "switchpath")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["status"] == "completed" and summary["iteration_timer"]["iterations"] == 30
    trial = summary["trial"]
    assert trial["status"] == "stopped", trial
    assert trial["reason"] == "switching the change on raised RuntimeError: the switch broke"
    assert "Training goes on with the change off." in proc.stderr


@pytest.mark.parametrize("spec, words", [
    ("{pkg}.switches:on,nothing_here", "has no attribute 'nothing_here'"),
    ("{pkg}.switches:on,DELAY_S", "'DELAY_S' is a float, not a function of (trainer, pl_module)"),
    ("{pkg}.switches:on,takes_one", "'takes_one' cannot be called with (trainer, pl_module)"),
    ("{pkg}.switches:DELAY_S", "'DELAY_S' is a float without switch_on and switch_off"),
    ("{pkg}.missing:on,off", "cannot import '{pkg}.missing' (ModuleNotFoundError"),
])
def test_abtrial_refuses_a_switch_spec_it_cannot_use_at_construction(tmp_path, monkeypatch, spec, words):
    pkg = f"user_pkg_{abs(hash(spec)) % 10 ** 8}"
    write_switches(tmp_path, package=pkg)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec, words = spec.format(pkg=pkg), words.format(pkg=pkg)
    with pytest.raises(PerfConfigError, match="ABTrial") as err:
        ABTrial(change=spec)
    assert words in str(err.value) and repr(spec) in str(err.value), str(err.value)


def test_abtrial_takes_a_switch_spec_by_name_in_python(tmp_path, monkeypatch):
    """The Python API's (and a LightningCLI YAML's) form of the same change: `change="MODULE:ON,OFF"`."""
    log = tmp_path / "switched.txt"
    write_switches(tmp_path, package="user_pkg_py", log=str(log))
    monkeypatch.syspath_prepend(str(tmp_path))
    trial = ABTrial(change="user_pkg_py.switches:on,off", warmup=2, block=2, blocks=4, settle=0, order="abba",
                    quality_batches=0, verbose=False)
    fit(tmp_path, [trial], max_epochs=2)  # 16 steps: warm-up 2 and 4 blocks of 2
    section = find_summary(tmp_path)["trial"]
    assert section["change"] == "user_pkg_py.switches:on,off" and section["status"] == "done", section
    assert section["pairs"] == 2 and section["targets"] is None
    assert log.read_text().split()[0] == "on" and log.read_text().split()[-1] == "off"


@pytest.mark.slow
def test_matrix_trial_passes_a_users_switch_spec_to_the_fits(tmp_path):
    """The switch module is imported in each variant's LightningCLI process; its switch is called inside the fit."""
    log = tmp_path / "switched.txt"
    write_switches(tmp_path / "switchpath", log=str(log))
    write_toy_cli(tmp_path / "cli_toy.py", lr=0.05, samples=64)
    spec = "tests_pkg.switches:on,off"
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "matrix", "--script", "cli_toy.py",
                           "--variant", "baseline=--trainer.max_steps=14", "--repeats", "1", "--noise-floor", "off",
                           "--trial", spec, "--out", "runs", "--csv", "m.csv"], capture_output=True, text=True,
                          cwd=str(tmp_path), env=with_pythonpath(tmp_path / "switchpath"), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trial = json.loads((tmp_path / "runs" / "baseline" / "perf_summary.json").read_text())["trial"]
    assert trial["change"] == spec and trial["status"] == "incomplete" and trial["switches"] >= 2, trial
    assert log.read_text().split()[:2] == ["on", "off"]
    assert f"| Trial: {spec} in-run speedup (95% CI) |" in proc.stdout
