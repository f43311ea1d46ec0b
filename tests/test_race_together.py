"""`lightning-perf race --together`: each round's commands run at the same time, pinned to the same cores, a finished
one's place kept busy by a spin loop until the round's last run ends (docs/bench.md, "Together rounds"). The runner
is checked on small scripts that see each other (each waits for the other's file, so they must run at once), and the
race end to end as a user runs it."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import SLEEPY_SCRIPT, gone_within

from lightning_perf.bench.rounds import run_rounds
from lightning_perf.bench.together import can_pin, pick_cores, run_together

pinning = pytest.mark.skipif(not can_pin(), reason="pinning to cores needs os.sched_setaffinity (Linux)")

#: A job that says it started, then waits (up to 60 s) for the file named in its second argument: two of them end
#: only where they ran at the same time. It writes its cores, and those of a thread it starts.
MEETS = textwrap.dedent('''
    import json, os, sys, threading, time
    mine, theirs = sys.argv[1], sys.argv[2]
    open(mine, "w").close()
    deadline = time.monotonic() + 60
    while not os.path.exists(theirs):
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.01)
    seen = {}
    thread = threading.Thread(target=lambda: seen.update(thread=sorted(os.sched_getaffinity(0))))
    thread.start(); thread.join()
    json.dump({"cores": sorted(os.sched_getaffinity(0)), "thread": seen["thread"]}, open(mine + ".json", "w"))
''')


def _job(tmp_path, argv, name):
    out = open(tmp_path / f"{name}.log", "w")
    return (argv, out, dict(os.environ))


@pinning
def test_the_jobs_of_a_round_run_at_once_pinned_to_the_cores_with_every_thread(tmp_path):
    script = tmp_path / "meets.py"
    script.write_text(MEETS)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    core = sorted(os.sched_getaffinity(0))[-1]
    ended = run_together([_job(tmp_path, [sys.executable, str(script), a, b], "a"),
                          _job(tmp_path, [sys.executable, str(script), b, a], "b")], [core])
    assert [code for code, _ in ended] == [0, 0]  # one after the other, the first would have waited in vain (3)
    for path in (a, b):
        seen = json.loads(open(path + ".json").read())
        assert seen == {"cores": [core], "thread": [core]}
    assert all(wall > 0 for _, wall in ended)


@pinning
def test_a_job_that_ends_first_leaves_a_spin_loop_in_its_place_until_the_last_ends(tmp_path):
    marker, pids = tmp_path / "filler_started", tmp_path / "filler_pids"
    # the filler says it runs (and its pid), then spins; the long job ends only once it sees the filler
    filler = [sys.executable, "-c", f"import os; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n');"
              f" open({str(marker)!r}, 'w').close()\nwhile True: pass"]
    long_job = [sys.executable, "-c", textwrap.dedent(f'''
        import os, sys, time
        deadline = time.monotonic() + 60
        while not os.path.exists({str(marker)!r}):
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.01)
    ''')]
    ended = run_together([_job(tmp_path, [sys.executable, "-c", "pass"], "short"),
                          _job(tmp_path, long_job, "long")], sorted(os.sched_getaffinity(0)), filler=filler)
    assert [code for code, _ in ended] == [0, 0]
    filler_pids = [int(p) for p in pids.read_text().split()]
    assert len(filler_pids) == 1  # one job ended before the other: one place to keep busy
    assert all(gone_within(pid, seconds=30.0) for pid in filler_pids)  # the filler ends with the round


@pinning
def test_a_job_past_the_timeout_is_killed_with_its_group_and_one_that_cannot_start_is_127(tmp_path):
    child_pid = tmp_path / "child"
    hangs = [sys.executable, "-c", textwrap.dedent(f'''
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(child_pid)!r}, "w").write(str(child.pid))
        time.sleep(120)
    ''')]
    started = tmp_path / "filler_pids"
    filler = [sys.executable, "-c", f"import os, time; open({str(started)!r}, 'a').write(f'{{os.getpid()}}\\n');"
              " time.sleep(120)"]
    ended = run_together([_job(tmp_path, hangs, "hangs"),
                          _job(tmp_path, [str(tmp_path / "no_such_program")], "missing")],
                         sorted(os.sched_getaffinity(0)), timeout_s=15.0, filler=filler)
    assert ended[0][0] is None and ended[1][0] == 127
    assert "cannot run" in (tmp_path / "missing.log").read_text()
    fillers = [int(p) for p in started.read_text().split()]  # the one that never started kept its place
    assert len(fillers) == 1 and all(gone_within(p, seconds=30.0) for p in fillers)
    pid = int(child_pid.read_text())  # written long before the timeout, even on a busy machine
    assert gone_within(pid, seconds=30.0), "the timed-out job's child outlived its group"



class _Times(tuple):
    """psutil's per-core times: (user, idle)."""

    def __new__(cls, user, idle):
        self = super().__new__(cls, (user, idle))
        self.user, self.idle = user, idle
        return self


class _Psutil:
    def __init__(self, rounds):
        self.rounds = iter(rounds)

    def cpu_times(self, percpu=False):
        assert percpu
        return next(self.rounds)


@pinning
def test_pick_cores_takes_the_least_busy_and_all_of_them_with_torchs_default(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    busy_first = _Psutil([[_Times(0, 0), _Times(0, 0), _Times(0, 0)],
                          [_Times(10, 0), _Times(1, 9), _Times(5, 5)]])
    assert pick_cores(1, psutil_module=busy_first, sleep=lambda s: None) == [1]
    busy_first = _Psutil([[_Times(0, 0)] * 3, [_Times(10, 0), _Times(1, 9), _Times(5, 5)]])
    assert pick_cores(2, psutil_module=busy_first, sleep=lambda s: None) == [1, 2]
    assert pick_cores(None) == [0, 1, 2] and pick_cores(5) == [0, 1, 2]

    class Broken:
        def cpu_times(self, percpu=False):
            raise OSError("no counters")

    assert pick_cores(1, psutil_module=Broken(), sleep=lambda s: None) == [0]


def test_rounds_run_together_get_each_round_in_its_order_at_once():
    asked = []

    def run_round(names, k):
        asked.append((list(names), k))
        return {name: f"{name}{k}" for name in names}

    info = run_rounds(["a", "b", "c"], 3, lambda name, k: pytest.fail("run one at a time"), log=lambda m: None,
                      run_round=run_round)
    assert asked == [(["a", "b", "c"], 1), (["c", "b", "a"], 2), (["a", "b", "c"], 3)]
    assert info["results"] == {"a": ["a1", "a2", "a3"], "b": ["b1", "b2", "b3"], "c": ["c1", "c2", "c3"]}


def test_together_is_refused_in_one_line_where_cores_cannot_be_pinned(tmp_path, monkeypatch, capsys):
    from lightning_perf import cli
    from lightning_perf.bench import together

    monkeypatch.setattr(together, "can_pin", lambda: False)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["race", "--together", "--cmd", "a=python x.py", "--cmd", "b=python y.py", "--out", "out"])
    err = capsys.readouterr().err
    assert code == 2 and "--together: this platform cannot pin a process to cores" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def _overlap(one, two):
    return one[0] < two[1] and two[0] < one[1]


@pytest.mark.slow
@pinning
def test_a_race_together_runs_each_rounds_commands_at_once_and_says_their_it_per_s_are_of_shared_cores(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SLEEPY_SCRIPT).lstrip())
    py = sys.executable
    proc = subprocess.run([py, "-m", "lightning_perf.cli", "race", "--together", "--repeats", "2",
                           "--cmd", f"a={py} {script} 60 0.03", "--cmd", f"b={py} {script} 60 0.03 again",
                           "--out", "out", "--threads", "1"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[race] round 1 of 2: a, b, a_aa together" in proc.stderr
    assert "[race] round 2 of 2: a_aa, b, a together" in proc.stderr
    result = json.loads((tmp_path / "out" / "race.json").read_text())
    cores = result["rounds"]["together"]["cores"]
    assert len(cores) == 1 and cores[0] in os.sched_getaffinity(0)
    for k in (1, 2):  # the fits of a round overlap in time
        spans = {}
        for name in ("a", "b", "a_aa"):
            run = json.loads((tmp_path / "out" / name / f"repeat_{k}" / "perf_summary.json").read_text())["run"]
            spans[name] = (run["started_at"], run["finished_at"])
        assert _overlap(spans["a"], spans["b"]) and _overlap(spans["a"], spans["a_aa"]), spans
    text = proc.stdout
    assert f"together: each round's commands ran at the same time on core(s) {cores[0]}" in text
    assert "only the ratios compare" in text
    assert "measured on a busy machine" not in text  # the waits for the shared core are the design, not the machine
    assert "ran at the same time on the same cores (race --together)" in text


def _run(accelerator):
    return {"summary": {"run": {"accelerator": accelerator}}}


def test_an_undecided_race_of_cpu_training_one_after_the_other_names_together_in_what_would_decide():
    from lightning_perf.bench.race import TOGETHER_HINT, _all_on_cpu, _offer_together
    from lightning_perf.bench.sequential import IN_RUN_HINT

    assert _all_on_cpu({"a": [_run("CPUAccelerator"), {"summary": None}], "b": [_run("CPUAccelerator")]})
    assert not _all_on_cpu({"a": [_run("CPUAccelerator")], "b": [_run("CUDAAccelerator")]})
    assert not _all_on_cpu({"a": [{"summary": None}]})
    why = f"its interval holds 1; this machine's drift hides changes under ~18% at 12 rounds {IN_RUN_HINT}"
    comparisons = {"b": {"verdict": {"verdict": "within noise", "why": why}, "sequential": {"why": why}},
                   "a_aa": {"verdict": {"verdict": "within noise", "why": why}}}
    _offer_together(comparisons, "a_aa")
    assert comparisons["b"]["verdict"]["why"].endswith(TOGETHER_HINT)
    assert comparisons["b"]["sequential"]["why"].endswith(TOGETHER_HINT)
    assert comparisons["a_aa"]["verdict"]["why"] == why  # the A/A copy's line is the floor's, not a suggestion
    assert "--together" in TOGETHER_HINT and "in-run trial" in TOGETHER_HINT


#: A training whose own IterationTimer writes its summary to one fixed file, whichever run it is.
OWN_PATH_SCRIPT = '''
import sys

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from lightning_perf import IterationTimer


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    trainer = Trainer(max_steps=20, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", devices=1,
                      callbacks=[IterationTimer(warmup_steps=2, summary_path=sys.argv[1])])
    trainer.fit(Net(), DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4))
'''


@pytest.mark.slow
@pinning
def test_runs_of_a_round_whose_own_callbacks_write_one_file_are_not_taken_for_each_other(tmp_path):
    script = tmp_path / "own.py"
    script.write_text(OWN_PATH_SCRIPT.lstrip())
    py, mine = sys.executable, tmp_path / "mine.json"
    proc = subprocess.run([py, "-m", "lightning_perf.cli", "race", "--together", "--repeats", "1", "--threads", "1",
                           "--callbacks", "IterationTimer",
                           "--cmd", f"a={py} {script} {mine}", "--cmd", f"b={py} {script} {mine} again",
                           "--out", "out"], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]  # no run has a summary of its own: not a race that passed
    assert mine.is_file()  # the file all three wrote, at once
    result = json.loads((tmp_path / "out" / "race.json").read_text())
    for name in ("a", "b", "a_aa"):
        run, = result["runs"][name]
        assert run["exit_code"] == 0 and run["status"] is None
        assert f"wrote the summary to {mine}, as another run of the same round did" in run["problem"], run
        assert not (tmp_path / "out" / name / "repeat_1" / "perf_summary.json").exists()
    assert result["comparisons"]["b"]["verdict"]["verdict"] == "no verdict"
