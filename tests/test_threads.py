"""`--threads` of matrix and race: every run's torch gets the cores other processes leave free."""

import multiprocessing
import os
import subprocess
import sys

import pytest

from helpers import write_toy_cli
from lightning_perf.bench import threads as threads_module
from lightning_perf.bench.threads import busy_cores, choose_threads, parse_threads, thread_env

SHOWS_THREADS = """import torch
print("TORCH_THREADS", torch.get_num_threads(), flush=True)
exec(compile(open("cli_toy.py").read(), "cli_toy.py", "exec"))
"""


def cli(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=900, env=env)


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5", "", "01"])
def test_a_bad_thread_count_is_refused_naming_it(bad):
    with pytest.raises(ValueError, match="expected auto, keep or a whole number of threads >= 1"):
        parse_threads(bad)


def test_auto_gives_the_free_cores_and_keeps_what_the_user_set(monkeypatch):
    monkeypatch.setattr(threads_module, "_usable_cores", lambda: 2)
    one_busy = choose_threads("auto", environ={}, measure=lambda: 1.02)
    assert one_busy["threads"] == 1 and "1.0 of 2 cores were busy" in one_busy["reason"]
    assert thread_env({"A": "1"}, one_busy) == {"A": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    idle = choose_threads("auto", environ={}, measure=lambda: 0.3)
    assert idle["threads"] is None and "all 2 cores were free" in idle["reason"]
    assert thread_env({"A": "1"}, idle) == {"A": "1"}
    all_busy = choose_threads("auto", environ={}, measure=lambda: 2.0)
    assert all_busy["threads"] == 1  # never none: each run gets one thread at least
    given = choose_threads("auto", environ={"OMP_NUM_THREADS": "2"}, measure=lambda: 1.5)
    assert given["threads"] is None and "OMP_NUM_THREADS=2 in the environment, kept" in given["reason"]
    unread = choose_threads("auto", environ={}, measure=lambda: None)
    assert unread["threads"] is None and "could not be read" in unread["reason"]
    assert choose_threads("keep", environ={}, measure=lambda: 1.0)["threads"] is None
    assert choose_threads(3, environ={}, measure=lambda: 1.0)["threads"] == 3


def _spin():
    while True:
        pass


def test_busy_cores_reads_a_spin_loop_beside_it():
    """One process spinning: the machine's busy cores over a second, read from the CPU counters, hold it (other work
    on the machine can only add to the figure)."""
    spinner = multiprocessing.Process(target=_spin, daemon=True)
    spinner.start()
    try:
        busy = busy_cores(1.0)
    finally:
        spinner.terminate()
        spinner.join()
    assert busy is not None and busy >= 0.7, busy


def test_matrix_and_race_run_torch_with_the_chosen_threads(tmp_path):
    """The commands as a user runs them: each run's torch reports the threads chosen, and the report says why;
    with a count in the environment and auto, the user's count is kept."""
    write_toy_cli(tmp_path / "cli_toy.py", lr=0.05, samples=32)
    (tmp_path / "threads_toy.py").write_text(SHOWS_THREADS)
    proc = cli("matrix", "--script", "threads_toy.py", "--variant", "baseline=--trainer.max_steps=8", "--repeats",
               "1", "--noise-floor", "off", "--threads", "1", "--out", "m1", cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TORCH_THREADS 1\n" in (tmp_path / "m1" / "baseline" / "output.log").read_text()
    assert "torch threads: 1 a run (--threads 1)" in proc.stdout, proc.stdout
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = cli("race", "--cmd", f"a={sys.executable} threads_toy.py fit --trainer.max_steps=8", "--cmd",
               f"b={sys.executable} threads_toy.py fit --trainer.max_steps=8", "--repeats", "1", "--noise-floor",
               "off", "--out", "r", cwd=str(tmp_path), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in ("a", "b"):
        assert "TORCH_THREADS 1\n" in (tmp_path / "r" / name / "repeat_1" / "output.log").read_text()
    assert "torch threads: default a run (OMP_NUM_THREADS=1 in the environment, kept)" in proc.stdout, proc.stdout
