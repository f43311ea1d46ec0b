"""`race` and `matrix` under what a user meets (issue 63): a Ctrl-C, a timed-out `bash -c` command, a crashed
candidate, commands with no summary, a machine with no core free, a device or a pipe given as a file. The commands are
small Python scripts that write a summary recorded from a real fit (a completed one, or one that crashed), so each run
costs a Python start-up, not a training."""

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from helpers import alive, gone_within

pytestmark = pytest.mark.slow

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
PY = sys.executable

#: A command that writes the summary SOURCE where race or the matrix reads it (its exit code 1 where the summary's
#: status is not completed, as a crashed training's); a run of round 2 or later holds until interrupted when the
#: environment has HOLD_FROM_ROUND_2 (it leaves a file named `holding` in its folder first).
FAKE = '''
import json, os, shutil, sys, time

source = sys.argv[1]
path = os.environ.get("LIGHTNING_PERF_SUMMARY_PATH") or os.path.join(os.environ["LIGHTNING_PERF_RUN_OUT"],
                                                                     "perf_summary.json")
if os.environ.get("HOLD_FROM_ROUND_2") and "repeat_" in path and "repeat_1" not in path:
    open(os.path.join(os.path.dirname(path), "holding"), "w").close()
    time.sleep(600)
shutil.copyfile(source, path)
with open(source) as fh:
    sys.exit(0 if json.load(fh)["status"] == "completed" else 1)
'''

#: The matrix's script: the summary named by ``--summary=FILE`` among its overrides.
FAKE_CLI = '''
import runpy, sys

source = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--summary="))
sys.argv = [sys.argv[0], source]
runpy.run_path(sys.argv[0].replace("fake_cli.py", "fake.py"), run_name="__main__")
'''


def crash_at(step):
    """A Lightning callback that raises at ``step``, as a training that crashes (a NaN check, a bad batch)."""
    from lightning.pytorch import Callback

    class Crash(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == step:
                raise RuntimeError(f"boom at step {step}")

    return Crash()


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    """Two real summaries: a fit of 40 steps that completed, and one that crashed at step 35 of 40."""
    from helpers import fit
    from lightning_perf import IterationTimer

    root = tmp_path_factory.mktemp("summaries")
    done, crashed = root / "completed.json", root / "failed.json"
    fit(root / "done", [IterationTimer(warmup_steps=2, summary_path=str(done))], max_steps=40, max_epochs=None,
        num_sanity_val_steps=0, limit_val_batches=0)
    with pytest.raises(RuntimeError, match="boom"):
        fit(root / "crash", [IterationTimer(warmup_steps=2, summary_path=str(crashed)), crash_at(35)], max_steps=40,
            max_epochs=None, num_sanity_val_steps=0, limit_val_batches=0)
    assert json.loads(done.read_text())["status"] == "completed"
    assert json.loads(crashed.read_text())["status"] == "failed"
    return {"completed": str(done), "failed": str(crashed)}


@pytest.fixture
def fake(tmp_path):
    (tmp_path / "fake.py").write_text(textwrap.dedent(FAKE).lstrip())
    (tmp_path / "fake_cli.py").write_text(textwrap.dedent(FAKE_CLI).lstrip())
    return tmp_path / "fake.py"


def cli(*args, cwd, timeout=300, env=None):
    return subprocess.run([PY, "-m", "lightning_perf.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env)


def env_here():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env



def interrupt_after_round_1(args, cwd, holding_under):
    """Starts the command in a process group of its own, sends SIGINT to that group (a Ctrl-C at the terminal) once
    a run of round 2 is running, and returns the finished process."""
    env = env_here()
    env["HOLD_FROM_ROUND_2"] = "1"
    # SIGINT as a terminal leaves it: a test runner (or CI) may start with it ignored, which its children inherit and
    # which makes Python install no KeyboardInterrupt (a Ctrl-C cannot reach such a process from a terminal either)
    proc = subprocess.Popen([PY, "-m", "lightning_perf.cli", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    try:
        while not any("holding" in files for _, _, files in os.walk(holding_under)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "round 2 never started"
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        # a hang guard: the command ends on the first Ctrl-C (the held run would sleep 600 s); 60 s ran out on a
        # busy machine, where the report's imports after the interrupt are slow
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


def manifests(root):
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if f.endswith("manifest.jsonl")]


# -- 3: Ctrl-C ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("together", [[], ["--together"]], ids=["one after the other", "together"])
def test_ctrl_c_during_race_reports_the_finished_rounds_marked_interrupted(tmp_path, fake, summaries, together):
    if together and not hasattr(os, "sched_setaffinity"):
        pytest.skip("--together pins processes to cores: Linux")
    done = summaries["completed"]
    code, out, err = interrupt_after_round_1(
        ["race", "--cmd", f"base={PY} {fake} {done}", "--cmd", f"cand={PY} {fake} {done} again", "--repeats", "3",
         "--threads", "keep", "--out", "out", "--report", "race.txt", *together], tmp_path, tmp_path / "out")
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    result = json.loads((tmp_path / "out" / "race.json").read_text())
    assert result["rounds"]["done"] == 1 and result["rounds"]["planned"] == 3
    assert result["rounds"]["interrupted"].startswith("interrupted (SIGINT) in round 2 of 3")
    assert all(len(runs) == 1 for runs in result["runs"].values())  # the round cut short is left out
    text = (tmp_path / "race.txt").read_text()
    assert "1 of 3 interleaved rounds ran" in text and "interrupted (SIGINT) in round 2 of 3" in text
    assert "RACE VERDICT" in out and manifests(tmp_path / "out") == []


def test_ctrl_c_during_matrix_writes_the_report_and_csv_of_the_finished_rounds(tmp_path, fake, summaries):
    done = summaries["completed"]
    code, out, err = interrupt_after_round_1(
        ["matrix", "--script", str(tmp_path / "fake_cli.py"), "--variant", f"baseline=--summary={done}",
         "--variant", f"other=--summary={done} --x=1", "--repeats", "3", "--threads", "keep", "--out", "runs",
         "--report", "m.md", "--csv", "m.csv"], tmp_path, tmp_path / "runs")
    assert code == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    text = (tmp_path / "m.md").read_text()
    assert "1 of 3 interleaved rounds ran" in text and "interrupted (SIGINT) in round 2 of 3" in text
    with open(tmp_path / "m.csv", newline="") as fh:
        rows = {r["variant"]: r for r in csv.DictReader(fh)}
    assert set(rows) == {"baseline", "other", "baseline_aa"}
    assert all(r["rounds_done"] == "1" and r["status"] == "completed" for r in rows.values())
    assert manifests(tmp_path / "runs") == []


# -- 5: a timed-out bash -c command ------------------------------------------------------------------------------------

SLEEPER = '''
import os, sys, time

with open(sys.argv[1], "w") as fh:
    fh.write(str(os.getpid()))
time.sleep(120)
'''


def test_race_timeout_ends_every_process_of_a_bash_c_command(tmp_path):
    (tmp_path / "sleeper.py").write_text(textwrap.dedent(SLEEPER).lstrip())
    pids = [tmp_path / "a.pid", tmp_path / "b.pid"]
    try:
        proc = cli("race", "--cmd", f"a=bash -c '{PY} sleeper.py a.pid; true'",
                   "--cmd", f"b=bash -c '{PY} sleeper.py b.pid; true'", "--repeats", "1", "--noise-floor", "off",
                   "--timeout", "4", "--threads", "keep", "--out", "out", cwd=tmp_path, timeout=120, env=env_here())
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert all(p.exists() for p in pids), "the training process never started within the timeout"
        for path in pids:
            assert gone_within(int(path.read_text())), f"{path.name}: the training process outlived the race"
        result = json.loads((tmp_path / "out" / "race.json").read_text())
        assert [r["exit_code"] for r in result["runs"]["a"]] == [None]  # timed out
    finally:
        for path in pids:
            if path.exists() and alive(int(path.read_text())):
                os.kill(int(path.read_text()), signal.SIGKILL)


SPAWNER = '''
import os, subprocess, sys, time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.pid"), "w") as fh:
    fh.write(str(child.pid))
time.sleep(120)
'''


def test_matrix_timeout_ends_the_processes_the_variant_started(tmp_path):
    (tmp_path / "spawner.py").write_text(textwrap.dedent(SPAWNER).lstrip())
    pid_file = tmp_path / "child.pid"
    try:
        proc = cli("matrix", "--script", "spawner.py", "--variant", "baseline", "--repeats", "1", "--noise-floor",
                   "off", "--timeout", "4", "--threads", "keep", "--out", "runs", cwd=tmp_path, timeout=120,
                   env=env_here())
        assert proc.returncode == 1 and "timed out" in proc.stdout, proc.stderr[-3000:]
        assert pid_file.exists(), "the variant's child never started within the timeout"
        assert gone_within(int(pid_file.read_text())), "the variant's child outlived the matrix"
    finally:
        if pid_file.exists() and alive(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


# -- 8 and 17: a crashed candidate, commands with no summary -----------------------------------------------------------

def test_race_gives_a_failed_command_no_speed_verdict_and_every_command_a_line(tmp_path, fake, summaries):
    done, failed = summaries["completed"], summaries["failed"]
    proc = cli("race", "--cmd", f"base={PY} {fake} {done}", "--cmd", f"crash={PY} {fake} {failed}",
               "--cmd", f"nosum={PY} -c pass", "--repeats", "3", "--threads", "keep", "--out", "out",
               cwd=tmp_path, env=env_here())
    assert proc.returncode == 1, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "race.json").read_text())
    crash, nosum = result["comparisons"]["crash"], result["comparisons"]["nosum"]
    assert crash["verdict"]["verdict"] == "no verdict", crash["verdict"]
    assert "failed" in crash["verdict"]["why"] and "a failed run decides nothing" in crash["verdict"]["why"]
    assert nosum["verdict"]["verdict"] == "no verdict" and "no summary" in nosum["verdict"]["why"]
    assert result["best"] != "crash" and "crash" not in result["tie"]
    assert [r["status"] for r in result["runs"]["crash"]] == ["failed"] * 3
    verdict = proc.stdout.split("RACE VERDICT")[1]
    lines = {line.strip().split(":")[0]: line for line in verdict.splitlines() if line.startswith("  ")}
    assert "3 runs, 3 with a summary, 0 completed" in lines["crash"], verdict
    assert "status failed" in lines["crash"] and "boom at step 35" in lines["crash"], verdict
    assert "3 runs, 0 with a summary" in lines["nosum"], verdict
    assert lines["crash against base"].startswith("  crash against base: no verdict"), verdict
    assert lines["nosum against base"].startswith("  nosum against base: no verdict"), verdict
    assert "faster" not in lines["crash against base"] and "Fastest: crash" not in verdict
    assert "### crash against base" not in proc.stdout  # compare's report is of speeds: none for a failed command


def test_matrix_gives_a_failed_variant_no_speed_verdict(tmp_path, fake, summaries):
    done, failed = summaries["completed"], summaries["failed"]
    proc = cli("matrix", "--script", str(tmp_path / "fake_cli.py"), "--variant", f"baseline=--summary={done}",
               "--variant", f"crash=--summary={failed}", "--repeats", "3", "--threads", "keep", "--out", "runs",
               "--csv", "m.csv", cwd=tmp_path, env=env_here())
    assert proc.returncode == 1, proc.stderr[-3000:]
    with open(tmp_path / "m.csv", newline="") as fh:
        rows = {r["variant"]: r for r in csv.DictReader(fh)}
    crash = rows["crash"]
    assert crash["status"].startswith("failed") and crash["speedup"] == "" and crash["end_to_end_speedup"] == ""
    for basis in ("steady", "end_to_end"):
        assert crash[f"{basis}_verdict"] == "no verdict", crash
        assert "a failed run decides nothing" in crash[f"{basis}_verdict_why"], crash
    table = next(line for line in proc.stdout.splitlines() if line.startswith("| crash |"))
    assert "faster" not in table and "| no verdict |" in table, table
    assert "Decided against baseline: crash" not in proc.stdout
    assert "No verdict: crash (every run failed" in proc.stdout, proc.stdout
    assert "**Best:** crash" not in proc.stdout and "fastest measured: crash" not in proc.stdout


# -- 19: no core free; a device or a pipe as the script or config ------------------------------------------------------

@pytest.mark.parametrize("cores", [1, 2])
def test_threads_auto_says_when_no_core_was_free(monkeypatch, cores):
    from lightning_perf.bench import threads

    monkeypatch.setattr(threads, "_usable_cores", lambda: cores)  # the machine's count, not this one's
    choice = threads.choose_threads("auto", environ={}, measure=lambda: float(cores))
    assert choice["threads"] == 1
    assert choice["reason"] == (f"{cores:.1f} of {cores} cores were busy before the first round: no core was left"
                                " free, so each run gets 1 thread, the least (--threads keep for torch's default)")


@pytest.mark.parametrize("flag", ["--script", "--config"])
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_matrix_script_or_config_that_is_no_regular_file_is_said_as_such(tmp_path, flag, kind):
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    if kind == "fifo":
        path = str(tmp_path / "pipe")
        os.mkfifo(path)
        said = "a named pipe"
    else:
        path, said = os.devnull, "a character device"
    given = {"--script": str(script), "--config": None, flag: path}
    args = ["matrix", "--script", given["--script"], "--variant", "baseline", "--out", str(tmp_path / "runs")]
    if given["--config"]:
        args += ["--config", given["--config"]]
    proc = cli(*args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"{flag} {path!r} is {said}, not a regular file" in proc.stderr, proc.stderr
    assert "no such file" not in proc.stderr and not (tmp_path / "runs").exists()


def test_a_signal_ignored_before_the_rounds_stays_ignored_in_them():
    """Under `nohup` SIGHUP is ignored: closing the terminal must not end the rounds (nor their runs, which inherit
    the ignored signal); SIGTERM still ends them as a Ctrl-C does, and both come back as they were."""
    import signal

    from lightning_perf.bench.process_group import stops_as_interrupts

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM)}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stops_as_interrupts():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, signal.SIG_DFL, before[signal.SIGTERM])
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == before[signal.SIGTERM]
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
