"""Writes that fail closed: only regular files are replaced, the set-up check tries the real path, variant names stay
under --out, a crashed ddp_spawn run keeps its measurements, an unreadable error message still gets a record, temp
files of other hosts survive, and no write opens a window with umask 0."""

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from helpers import TinyModel, find_summary, fit
from lightning_perf import IterationTimer, PerfConfigError, QualityGate, SectionProfiler, VRAMMonitor
from lightning_perf.cli import main
from lightning_perf.summary import io as summary_io
from lightning_perf.summary.io import NotARegularFileError, write_json_atomic


class Counting(TinyModel):
    steps = 0

    def training_step(self, batch, batch_idx):
        type(self).steps += 1
        return super().training_step(batch, batch_idx)


def fifo(path):
    os.mkfifo(path)
    return str(path)


def assert_still_fifo(path):
    assert stat.S_ISFIFO(os.lstat(path).st_mode)


def cli(*args, timeout=120):
    """The real command in a subprocess, with a limit: writing into a named pipe would block, not fail."""
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def one_line_error(proc):
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    return proc.stderr


# -- item 1: only regular files are replaced ---------------------------------------------------------------------------
def test_a_named_pipe_at_summary_path_is_refused_at_setup(tmp_path):
    path = fifo(tmp_path / "fifo")
    Counting.steps = 0
    with pytest.raises(PerfConfigError, match=r"IterationTimer\(summary_path\)=.*fifo' is a named pipe, not a regular"
                                              r" file"):
        fit(tmp_path / "run", [IterationTimer(summary_path=path)], model=Counting(), max_epochs=1)
    assert Counting.steps == 0
    assert_still_fifo(path)


def test_a_symlink_to_a_named_pipe_is_judged_by_its_target(tmp_path):
    target = fifo(tmp_path / "fifo")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with pytest.raises(PerfConfigError, match="is a named pipe"):
        fit(tmp_path / "run", [IterationTimer(summary_path=str(link))], max_epochs=1)
    assert os.path.islink(link)
    assert_still_fifo(target)


def test_the_writer_never_replaces_a_named_pipe(tmp_path):
    path = fifo(tmp_path / "perf_summary.json")
    with pytest.raises(NotARegularFileError, match="named pipe"):
        write_json_atomic(path, {"a": 1})
    assert_still_fifo(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["perf_summary.json"]  # no temporary file left


def test_a_named_pipe_at_a_stage_file_is_refused_before_that_stage_runs(tmp_path):
    path = tmp_path / "s.json"
    trainer = fit(tmp_path, [VRAMMonitor(summary_path=str(path))], max_epochs=1)  # it writes a file per stage
    stage_file = fifo(tmp_path / "s_validate.json")
    with pytest.raises(PerfConfigError, match=r"s_validate.json' is a named pipe"):
        trainer.validate(trainer.lightning_module, verbose=False)
    assert_still_fifo(stage_file)
    assert json.loads(path.read_text())["status"] == "completed"


def test_a_named_pipe_at_record_baseline_is_refused_at_setup(tmp_path):
    path = fifo(tmp_path / "base.json")
    gate = QualityGate(metrics=[], monitor={"val_loss": "min"}, record_baseline=path)
    with pytest.raises(PerfConfigError, match=r"QualityGate\(record_baseline\)=.*is a named pipe"):
        fit(tmp_path / "run", [gate], max_epochs=1)
    assert_still_fifo(path)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["report --plot", "bench --csv", "bench --plot", "matrix --csv",
                                     "matrix --report"])
def test_cli_outputs_that_are_named_pipes_are_refused_without_opening_them(command, tmp_path):
    path = fifo(tmp_path / "out")
    summary = tmp_path / "s.json"
    write_json_atomic(str(summary), {"schema_version": 2, "status": "completed", "run": {}})
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a variant must not run')\n")
    name, flag = command.split()
    args = {"report": ["report", str(summary)],
            "bench": ["bench", "--model", "nowhere:nothing", "--no-progress"],
            "matrix": ["matrix", "--script", str(script), "--variant", "baseline", "--out", str(tmp_path / "m")]}[name]
    if name == "bench" and flag == "--plot":
        args += ["--no-csv"]
    err = one_line_error(cli(*args, flag, path))
    assert f"{flag} '{path}' is a named pipe, not a regular file" in err
    assert_still_fifo(path)
    assert not (tmp_path / "m").exists()  # the matrix ran no variant


def test_matrix_out_that_is_a_file_or_a_named_pipe_fails_before_any_variant(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a variant must not run')\n")
    regular = tmp_path / "out.txt"
    regular.write_text("mine")
    pipe = fifo(tmp_path / "pipe")
    for out, what in ((str(regular), "is a file"), (pipe, "is a named pipe"),
                      ("/proc/lightning_perf/m", "cannot be written")):
        assert main(["matrix", "--script", str(script), "--variant", "baseline", "--out", out]) == 2
        err = capsys.readouterr().err
        assert f"--out {out!r} {what}" in err and len(err.strip().splitlines()) == 1, err
    assert regular.read_text() == "mine"
    assert_still_fifo(pipe)


def test_matrix_leaves_a_named_pipe_in_a_variant_folder_alone(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a variant must not run')\n")
    (tmp_path / "m" / "baseline").mkdir(parents=True)
    pipe = fifo(tmp_path / "m" / "baseline" / "perf_summary.json")
    assert main(["matrix", "--script", str(script), "--variant", "baseline", "--out", str(tmp_path / "m")]) == 2
    assert "is a named pipe" in capsys.readouterr().err
    assert_still_fifo(pipe)
    assert not (tmp_path / "m" / "baseline" / "output.log").exists()


# -- item 7: the set-up check tries the real path --------------------------------------------------------------------
def test_a_nul_byte_in_summary_path_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"IterationTimer\(summary_path='a\\x00b.json'\).*NUL"):
        IterationTimer(summary_path="a\x00b.json")


@pytest.mark.parametrize("make_path", [
    lambda root: os.path.join(str(root), "missing", "..", "perf_summary.json"),
    lambda root: os.path.join(str(root), "x" * 295 + ".json"),
], ids=["dotdot-through-a-missing-folder", "300-character-name"])
def test_a_path_the_writer_could_not_use_fails_at_setup_not_at_the_end(make_path, tmp_path):
    path = make_path(tmp_path)
    Counting.steps = 0
    with pytest.raises(PerfConfigError, match=r"IterationTimer\(summary_path\)=.* cannot be written"):
        fit(tmp_path / "run", [IterationTimer(summary_path=path)], model=Counting(), max_epochs=1)
    assert Counting.steps == 0
    assert not (tmp_path / "missing").exists() and not (tmp_path / "perf_summary.json").exists()
    assert find_summary(tmp_path / "run")["error"]["type"] == "PerfConfigError"  # the failed set-up's own record


def test_dotdot_through_an_existing_folder_lands_where_it_says(tmp_path):
    (tmp_path / "a").mkdir()
    fit(tmp_path / "run", [IterationTimer(summary_path=str(tmp_path / "a" / ".." / "s.json"))], max_epochs=1)
    assert json.loads((tmp_path / "s.json").read_text())["status"] == "completed"
    assert not list(tmp_path.rglob("probe*")) and not list(tmp_path.rglob(".lightning_perf_probe*"))


# -- item 8: a ddp_spawn run that crashes on rank 1 ----------------------------------------------------------------
class CrashOnRank1(TinyModel):
    def training_step(self, batch, batch_idx):
        if self.global_rank == 1 and self.global_step == 5:
            raise RuntimeError("boom on rank 1")
        return super().training_step(batch, batch_idx)


@pytest.mark.slow
def test_a_ddp_spawn_crash_on_rank_1_keeps_the_measurements_up_to_the_crash(tmp_path):
    callbacks = [IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, print_reports=False), VRAMMonitor()]
    with pytest.raises(Exception, match="boom on rank 1"):
        fit(tmp_path, callbacks, model=CrashOnRank1(), strategy="ddp_spawn", devices=2, max_epochs=3)
    summary = find_summary(tmp_path)  # one file, in the run's log dir: not a second, empty one in the root
    assert summary["status"] == "failed"
    assert summary["error"]["type"] == "ProcessRaisedException"
    assert "RuntimeError: boom on rank 1" in summary["error"]["message"]  # a long traceback keeps its last line
    assert summary["run"]["world_size"] == 2
    assert summary["iteration_timer"]["iterations"] >= 4
    assert summary["section_profiler"]["iterations"] >= 3
    assert "vram" in summary
    assert not [p for p in os.listdir(tempfile.gettempdir()) if p.startswith("lightning_perf.handoff.")
                and f".{os.getpid()}." in p]


# -- item 9: variant names stay folders under --out ------------------------------------------------------------------
@pytest.mark.parametrize("name", ["..", ".", "...", ".hidden", "a/b", "../up", "a\\b", "a\x00b"])
def test_variant_names_that_would_leave_out_are_refused_before_anything_runs(name, tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a variant must not run')\n")
    out = tmp_path / "deep" / "m"
    (tmp_path / "deep" / "perf_summary.json").parent.mkdir(parents=True)
    (tmp_path / "deep" / "perf_summary.json").write_text("theirs")
    assert main(["matrix", "--script", str(script), "--variant", f"{name}=--trainer.max_epochs=1",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--variant" in err and len(err.strip().splitlines()) == 1, err
    assert (tmp_path / "deep" / "perf_summary.json").read_text() == "theirs"
    assert not out.exists()


# -- item 10: an exception whose __str__ raises ------------------------------------------------------------------------
class Unprintable(RuntimeError):
    def __str__(self):
        raise ValueError("no message for you")


class Unreadable(Unprintable):
    def __repr__(self):
        raise KeyError("nor a repr")


@pytest.mark.parametrize("error, repr_read", [(Unprintable, True), (Unreadable, False)])
def test_an_exception_whose_message_cannot_be_read_still_gets_a_summary(error, repr_read, tmp_path):
    class Raising(TinyModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                raise error("secret")
            return super().training_step(batch, batch_idx)

    with pytest.raises(error):
        fit(tmp_path, [IterationTimer(), SectionProfiler(print_reports=False)], model=Raising(), max_epochs=1)
    summary = find_summary(tmp_path)
    assert summary["status"] == "failed" and summary["error"]["type"] == error.__name__
    message = summary["error"]["message"]
    assert message.startswith("<the message could not be read: ValueError in __str__")
    assert ("repr: " in message) == repr_read and ("KeyError in __repr__" in message) != repr_read
    assert summary["iteration_timer"]["iterations"] == 2


def test_a_section_value_without_a_readable_text_does_not_cost_the_file(tmp_path):
    class NoText:
        def __str__(self):
            raise ValueError("no")

        def __repr__(self):
            raise ValueError("no")

    write_json_atomic(str(tmp_path / "s.json"), {"a": NoText(), "b": [1, float("nan")], 3: "key"})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": "<unreadable NoText>", "b": [1, None], "3": "key"}


# -- item 11: temporary files of other hosts survive ---------------------------------------------------------------
def dead_pid():
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def test_a_temporary_file_of_another_host_survives_though_its_pid_looks_dead(tmp_path):
    pid = dead_pid()
    other_host = tmp_path / f".perf_summary.another-host-4026531836.{pid}.abc123.tmp"
    old_format = tmp_path / f".perf_summary.{pid}.def456.tmp"  # a writer of an older version: host unknown
    ours = tmp_path / f"{summary_io._temporary_prefix(pid)}ghi789.tmp"
    for path in (other_host, old_format, ours):
        path.write_text("{half")
    write_json_atomic(str(tmp_path / "perf_summary.json"), {"a": 1})
    assert other_host.exists() and old_format.exists() and not ours.exists()


def test_a_sigkilled_writers_temporary_file_is_removed_at_the_next_write(tmp_path):
    """A real writer, killed between writing its temporary file and replacing the summary."""
    code = ("import os, signal, sys\n"
            "from lightning_perf.summary import io\n"
            "os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
            "io.write_json_atomic(sys.argv[1], {'a': 1})\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "perf_summary.json")], timeout=60)
    assert proc.returncode == -signal.SIGKILL
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].startswith(f"{summary_io._TMP_PREFIX}{summary_io._writer_id()}."), left
    write_json_atomic(str(tmp_path / "perf_summary.json"), {"a": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["perf_summary.json"]


# -- item 13: no window with umask 0 -----------------------------------------------------------------------------------
def test_writes_never_open_a_window_in_which_other_threads_create_world_writable_files(tmp_path):
    old = os.umask(0o022)
    modes, stop = set(), threading.Event()
    folder = tmp_path / "other"
    folder.mkdir()

    def create_files():
        i = 0
        while not stop.is_set():
            path = folder / f"f{i % 50}"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
            modes.add(stat.S_IMODE(os.fstat(fd).st_mode))
            os.close(fd)
            os.unlink(path)
            i += 1

    def yield_at_each_line(frame, event, arg):
        """The writer gives the other thread its turn between any two of its lines, as a thread switch may."""
        if frame.f_code.co_filename != summary_io.__file__:
            return None
        if event == "line":
            time.sleep(0)
        return yield_at_each_line

    thread = threading.Thread(target=create_files)
    try:
        thread.start()
        sys.settrace(yield_at_each_line)
        for i in range(100):
            write_json_atomic(str(tmp_path / "perf_summary.json"), {"i": i})
    finally:
        sys.settrace(None)
        stop.set()
        thread.join()
        os.umask(old)
    assert modes == {0o644}
    assert stat.S_IMODE(os.stat(tmp_path / "perf_summary.json").st_mode) == 0o644


def test_the_umask_is_read_without_setting_it(tmp_path, monkeypatch):
    calls = []
    real = os.umask
    monkeypatch.setattr(os, "umask", lambda mask: calls.append(mask) or real(mask))
    old = real(0o027)
    try:
        write_json_atomic(str(tmp_path / "perf_summary.json"), {"a": 1})
    finally:
        real(old)
    assert calls == []
    assert stat.S_IMODE(os.stat(tmp_path / "perf_summary.json").st_mode) == 0o640


def test_a_measurement_failure_whose_message_cannot_be_read_is_still_recorded(tmp_path):
    """A probe that raises an exception whose ``__str__`` raises: the callback records the failure (with a note that
    the message could not be read) instead of losing it in a second exception, and training goes on."""

    class Unprintable(RuntimeError):
        def __str__(self):
            raise ValueError("no text")

    class Breaks(IterationTimer):
        def _summary_section(self):
            raise Unprintable()

    fit(tmp_path, [Breaks(warmup_steps=1)], max_steps=3)
    section = find_summary(tmp_path)["iteration_timer"]
    assert section["error"].startswith("Unprintable: <the message could not be read")


@pytest.mark.parametrize("argument", ["summary_path", "record_baseline"])
def test_a_path_ending_with_a_separator_is_refused_at_setup(tmp_path, argument):
    """``results/`` names a folder: the writer would refuse it at the end and the file would land in log_dir."""
    folder = str(tmp_path / "results") + os.sep
    callback = (IterationTimer(summary_path=folder) if argument == "summary_path"
                else QualityGate(metrics=["psnr"], record_baseline=folder))
    with pytest.raises(PerfConfigError, match=rf"\({argument}\)=.*ends with a path separator"):
        fit(tmp_path, [callback], max_steps=2)


def test_a_variant_name_too_long_for_a_folder_is_refused_before_anything_runs(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('a variant must not run')\n")
    assert main(["matrix", "--script", str(script), "--variant", "ok=--x", "--variant", "v" * 300 + "=--x",
                 "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "at most 100 characters, got 300" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m").exists()


class ChangesFolder(TinyModel):
    """Changes the working folder in the middle of training, as some user code does."""

    def __init__(self, to):
        super().__init__()
        self.folder = str(to)

    def on_train_epoch_start(self):
        os.chdir(self.folder)


def test_a_relative_summary_path_lands_where_it_was_checked_when_the_folder_changes(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    fit(tmp_path / "root", [IterationTimer(summary_path="out/s.json")], model=ChangesFolder(tmp_path / "b"),
        max_steps=3)
    assert json.loads((tmp_path / "a" / "out" / "s.json").read_text())["status"] == "completed"
    assert not (tmp_path / "b" / "out").exists()


# -- issue 45, item 4: a summary write that fails, inputs that are not regular files ----------------------------------
def test_a_summary_that_cannot_be_written_anywhere_says_so_once_naming_the_run(tmp_path, monkeypatch):
    """Before: the write raised into each callback, and all the user saw was "EvalNoGradGuard: measurement failed in
    `write_summary`". Now one warning says the summary was NOT written, for which run, and why; no callback blames
    itself for it."""
    from lightning_perf import EvalNoGradGuard
    from lightning_perf.callbacks.core import summary_book as _summary_book

    def full(path, data):
        raise OSError(27, "File too large")

    monkeypatch.setattr(_summary_book, "write_json_atomic", full)
    with pytest.warns(UserWarning) as caught:
        trainer = fit(tmp_path / "run", [IterationTimer(run_name="nightly"), EvalNoGradGuard()], max_epochs=1)
    texts = [str(w.message) for w in caught]
    not_written = [t for t in texts if "summary NOT written" in t]
    assert len(not_written) == 1, texts
    assert "'nightly'" in not_written[0] and "File too large" in not_written[0], not_written
    assert trainer.log_dir in not_written[0], not_written  # where it would have gone
    assert not any("write_summary" in t for t in texts), texts
    for cb in trainer.callbacks:
        if isinstance(cb, (IterationTimer, EvalNoGradGuard)):
            assert "write_summary" not in cb.summary_section().get("measurement_failures", {})


def test_a_file_size_limit_below_the_summary_loses_it_with_one_plain_line(tmp_path):
    """The adversarial run's case, for real: RLIMIT_FSIZE below the summary's size (Python ignores SIGXFSZ, so the
    write fails with EFBIG). The fit completes; stderr says once that the summary was not written, naming the run."""
    script = tmp_path / "limited.py"
    script.write_text(
        "import resource, sys\n"
        f"sys.path.insert(0, {os.path.join(os.path.dirname(os.path.abspath(__file__)))!r})\n"
        "from helpers import fit\n"
        "from lightning_perf import EvalNoGradGuard, IterationTimer\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (2000, resource.RLIM_INFINITY))\n"
        f"fit({str(tmp_path / 'run')!r}, [IterationTimer(run_name='limited'), EvalNoGradGuard()], max_epochs=1,"
        " logger=False, enable_checkpointing=False)\n"
        "print('FIT DONE')\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONWARNINGS="default"))
    assert proc.returncode == 0 and "FIT DONE" in proc.stdout, proc.stderr[-3000:]
    assert proc.stderr.count("summary NOT written") == 1, proc.stderr[-3000:]
    assert "'limited'" in proc.stderr and "File too large" in proc.stderr, proc.stderr[-3000:]
    assert "measurement failed in `write_summary`" not in proc.stderr, proc.stderr[-3000:]
    assert not list((tmp_path / "run").glob("**/perf_summary.json"))


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_compare_refuses_an_input_that_is_not_a_regular_file_without_reading_it(kind, tmp_path):
    """Before: `compare /dev/zero b.json` read forever (and a named pipe blocked until a writer came)."""
    path = "/dev/zero" if kind == "/dev/zero" else fifo(tmp_path / "pipe.json")
    real = tmp_path / "b.json"
    real.write_text("{}")
    for args in (("compare", path, str(real)), ("report", path)):
        proc = cli(*args, timeout=30)
        err = one_line_error(proc)
        assert path in err and ("a character device" in err or "a named pipe" in err), err
        assert "not a regular file" in err, err


def test_an_input_over_the_size_limit_is_refused_before_it_is_read(tmp_path, monkeypatch):
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:  # sparse: 65 MB of nothing, no disk used
        fh.truncate(summary_io.MAX_INPUT_BYTES + 1)
    proc = cli("compare", str(big), str(big), timeout=60)
    err = one_line_error(proc)
    assert str(big) in err and "64 MiB" in err, err


@pytest.mark.parametrize("args", [("bench", "--from-csv", "/dev/zero"), ("bench-compare", "/dev/zero", "/dev/zero")])
def test_bench_csv_inputs_that_are_not_regular_files_are_refused(args):
    err = one_line_error(cli(*args, timeout=30))
    assert "'/dev/zero' is a character device, not a regular file" in err, err
