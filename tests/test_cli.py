"""The real `lightning-perf` command in subprocesses, on summaries written by real fits."""

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from helpers import PacedModel, fit, use_virtual_clock
from lightning_perf import IterationTimer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """"fast" costs 2 ms a step, "slow" 6 ms; 5 epochs of 8 batches, 39 measured iterations (32 give an interval)."""
    root = tmp_path_factory.mktemp("runs")
    paths = {}
    with pytest.MonkeyPatch.context() as mp:
        clock = use_virtual_clock(mp)
        for name, step_s in (("fast", 0.002), ("slow", 0.006)):
            fit(root / name, [IterationTimer(warmup_steps=1, summary_path=str(root / name / "perf_summary.json"))],
                model=PacedModel(clock, step_s), max_epochs=5)
            paths[name] = str(root / name / "perf_summary.json")
    return paths


def cli(*args, check_rc=None):
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          timeout=120)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stderr
    return proc


def test_compare_text_shows_speedup_ci_and_time_saved(runs):
    out = cli("compare", runs["slow"], runs["fast"], "--iterations", "30000", check_rc=0).stdout
    assert "TRAINING TIME COMPARISON" in out
    assert "slow:" in out and "fast:" in out
    assert "95% CI" in out and "within each run (the change is past it); no verdict" in out
    # one run a side: the time saved is the range the within-run interval gives, not decided (issue 59)
    assert "Estimated time to 30,000 iterations" in out and re.search(r"Time change: +[\d.]+ \w+ saved \(not decided\)",
                                                                         out)


def test_compare_json_is_consistent_with_the_files(runs):
    result = json.loads(cli("compare", runs["slow"], runs["fast"], "--format", "json", check_rc=0).stdout)
    with open(runs["slow"]) as fh:
        slow = json.load(fh)["iteration_timer"]
    with open(runs["fast"]) as fh:
        fast = json.load(fh)["iteration_timer"]
    # the headline: wall time per measured iteration, total over count, straight from the files
    speedup = (slow["histogram_ms"]["sum"] / slow["measured_iterations"]) / (
        fast["histogram_ms"]["sum"] / fast["measured_iterations"])
    assert result["speedup"] == pytest.approx(speedup)
    assert result["speedup_basis"] == "it/s"
    assert speedup == pytest.approx(3.0, rel=1e-6)  # 6 ms against 2 ms a step
    lo, hi = result["speedup_ci95"]
    assert lo <= result["speedup"] <= hi
    warmup_extra = slow["warmup_time_s"] - slow["excluded"]["warmup"] * slow["ms_per_iter"]["mean"] / 1000
    assert result["time_to_iterations_s"]["base"] == pytest.approx(
        30000 * slow["ms_per_iter"]["mean"] / 1000 + max(0.0, warmup_extra))
    assert result["time_saved_s"] > 0


def test_compare_markdown(runs):
    out = cli("compare", runs["fast"], runs["slow"], "--format", "markdown", "--names", "A", "B", check_rc=0).stdout
    first, base, table = out.split("\n\n", 2)  # each run's diagnosis (tests/test_diagnosis.py), then the table
    assert first.startswith("**Diagnosis of B: not enough measured") and base == "**A: the same verdict**"
    assert table.startswith("| run | ms/iter (mean) | it/s | samples/s | min ms | median ms | p95 ms | p99 ms | max ms")
    # 2 ms against 6 ms a step; one run a side decides no direction (issue 59)
    assert "| A |" in out and "| B |" in out and "**Speed ratio:** candidate/base speed 0.333" in out


def test_fail_if_slower_exit_codes(runs):
    proc = cli("compare", runs["fast"], runs["slow"], "--fail-if-slower", "5")
    assert proc.returncode == 1 and "slower than base" in proc.stderr
    cli("compare", runs["slow"], runs["fast"], "--fail-if-slower", "5", check_rc=0)


@pytest.mark.parametrize("kind", ["missing", "not_json", "wrong_schema", "future_schema", "directory"])
def test_bad_files_exit_2_with_one_line(runs, tmp_path, kind):
    bad = tmp_path / "bad.json"
    if kind == "not_json":
        bad.write_text("{not json")
    elif kind == "wrong_schema":
        bad.write_text(json.dumps({"hello": 1}))
    elif kind == "future_schema":
        bad.write_text(json.dumps({"schema_version": 99, "status": "completed", "run": {}}))
    elif kind == "directory":
        bad = tmp_path
    proc = cli("compare", str(bad), runs["fast"])
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("lightning-perf: error:")


def test_bad_arguments_exit_2(runs):
    proc = cli("compare", runs["fast"], runs["slow"], "--iterations", "0")
    assert proc.returncode == 2 and "positive integer" in proc.stderr
    proc = cli("report", runs["fast"], runs["slow"], "--names", "only-one")
    assert proc.returncode == 2 and "--names got 1 names for 2 runs" in proc.stderr


def test_report_markdown_and_csv(runs):
    out = cli("report", runs["slow"], runs["fast"], "--notes", "reference", "4 ms less a step",
              check_rc=0).stdout.splitlines()
    assert out[0].startswith("| Run | Date | Speed (it/s) |")
    assert out[2].startswith("| slow |") and out[3].startswith("| fast |")
    cells = [c.strip() for c in out[2].split("|")]
    assert cells[7] == "baseline" and "%" in out[3].split("|")[7]  # change vs the first row
    with open(runs["slow"]) as fh:
        slow = json.load(fh)
    assert cells[2] == slow["run"]["started_at"][:16].replace("T", " ")
    assert cells[-2] == "reference" and out[3].split("|")[-2].strip() == "4 ms less a step"
    # the model logs val_loss: the report shows each run's last value with no extra set-up
    header = [c.strip() for c in out[0].split("|")]
    assert "val_loss" in header
    assert float(cells[header.index("val_loss")]) == pytest.approx(slow["logged"]["values"]["val_loss"], rel=1e-3)
    csv_out = cli("report", runs["slow"], runs["fast"], "--format", "csv", "--names", "base", "opt",
                  check_rc=0).stdout.splitlines()
    assert csv_out[0].startswith("run,date,notes,status,it_per_s")
    assert csv_out[1].startswith("base,20") and csv_out[2].startswith("opt,20")
    proc = cli("report", runs["slow"], runs["fast"], "--notes", "one")
    assert proc.returncode == 2 and "--notes got 1 notes for 2 runs" in proc.stderr


def test_compare_needs_no_torch(runs):
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['lightning'] = None\n"
        "from lightning_perf.cli import main\n"
        f"sys.exit(main(['compare', {runs['slow']!r}, {runs['fast']!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Speed ratio:" in proc.stdout  # one run a side: no direction decided (issue 59)


def test_console_script_is_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "lightning-perf")
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "compare" in proc.stdout and "report" in proc.stdout


@pytest.mark.parametrize("command", ["compare", "report"])
def test_a_schema_valid_file_with_a_wrong_field_type_exits_2(runs, tmp_path, command):
    with open(runs["slow"]) as fh:
        data = json.load(fh)
    data["iteration_timer"]["ms_per_iter"]["mean"] = "fast"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    proc = cli(command, str(bad), runs["fast"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "`iteration_timer.ms_per_iter.mean` must be a number or null, got 'fast'" in proc.stderr


def test_fail_if_slower_cannot_decide_on_a_broken_candidate_and_refuses_nan(runs, tmp_path):
    with open(runs["fast"]) as fh:
        data = json.load(fh)
    failed = dict(data, status="failed")
    (tmp_path / "failed.json").write_text(json.dumps(failed))
    no_timer = {k: v for k, v in data.items() if k != "iteration_timer"}
    (tmp_path / "no_timer.json").write_text(json.dumps(no_timer))
    for name, why in (("failed.json", "status is 'failed'"), ("no_timer.json", "no iteration_timer section")):
        proc = cli("compare", runs["slow"], str(tmp_path / name), "--fail-if-slower", "5")
        assert proc.returncode == 1 and "cannot decide" in proc.stderr and why in proc.stderr, proc.stderr
    proc = cli("compare", runs["slow"], runs["fast"], "--fail-if-slower", "nan")
    assert proc.returncode == 2 and "finite number" in proc.stderr


def test_unwritable_outputs_and_bad_timeouts_exit_2_before_any_work(runs):
    proc = cli("report", runs["slow"], runs["fast"], "--plot", "/proc/x/p.png")
    assert proc.returncode == 2 and "--plot '/proc/x/p.png' cannot be written" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = cli("bench", "--model", "nowhere:make", "--csv", "/proc/x/b.csv")
    assert proc.returncode == 2 and "--csv '/proc/x/b.csv' cannot be written" in proc.stderr
    proc = cli("matrix", "--script", "x.py", "--variant", "baseline", "--timeout", "-1")
    assert proc.returncode == 2 and "--timeout" in proc.stderr and "Traceback" not in proc.stderr


def cli_into_closed_pipe(*args, unbuffered=True, cwd=None):
    """The command with its stdout a pipe whose reader has gone (`| head -1` once head has read its line), the
    pipe closed before the command writes, so that every write to stdout meets EPIPE. Python buffers stdout into a
    pipe unless PYTHONUNBUFFERED is set: buffered, the error comes at the final flush; unbuffered, at the write."""
    env = dict(os.environ)
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120, env=env, cwd=cwd)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "buffered"])
def test_a_closed_stdout_ends_quietly_and_never_as_a_pass(runs, tmp_path, unbuffered):
    for args in (["compare", runs["slow"], runs["fast"]], ["report", runs["slow"], runs["fast"], runs["fast"],
                                                            runs["fast"]], ["--help"], ["compare", "--help"]):
        proc = cli_into_closed_pipe(*args, unbuffered=unbuffered)
        assert (proc.returncode, proc.stderr) == (141, ""), (args, proc.stderr)  # 128 + SIGPIPE, not a message
    # a gate fails closed: the candidate is slower, said on stderr, exit 1; a gate that passed is still no 0
    proc = cli_into_closed_pipe("compare", runs["fast"], runs["slow"], "--fail-if-slower", "5", unbuffered=unbuffered)
    assert proc.returncode == 1 and proc.stderr.startswith("lightning-perf: candidate is 200.0% slower than base")
    assert proc.stderr.count("\n") == 1
    proc = cli_into_closed_pipe("compare", runs["slow"], runs["fast"], "--fail-if-slower", "5", unbuffered=unbuffered)
    assert (proc.returncode, proc.stderr) == (141, "")


def cli_without(fd, *args):
    """The command started without stdout (fd 1) or stderr (fd 2), as a shell's ``>&-`` or ``2>&-`` starts it:
    Python's ``sys.stdout`` or ``sys.stderr`` is then None."""
    keep = {1: {"stderr": subprocess.PIPE}, 2: {"stdout": subprocess.PIPE}}[fd]
    return subprocess.run(["bash", "-c", f'"$0" -m lightning_perf.cli "$@" {fd}>&-', sys.executable, *args],
                          text=True, timeout=120, **keep)


def test_a_command_started_without_stdout_or_stderr_ends_as_a_closed_one(runs):
    """``>&-``: as a closed pipe, no traceback, no 'internal error', never 0; ``2>&-``: the gate's line and errors
    do not fall into stdout, which keeps exactly the JSON asked for."""
    for args in (["--help"], ["compare", runs["slow"], runs["fast"]]):
        proc = cli_without(1, *args)
        assert (proc.returncode, proc.stderr) == (141, ""), (args, proc.stderr)
    proc = cli_without(1, "compare", runs["fast"], runs["slow"], "--fail-if-slower", "5")
    assert proc.returncode == 1 and proc.stderr.startswith("lightning-perf: candidate is 200.0% slower than base")
    proc = cli_without(2, "compare", runs["fast"], runs["slow"], "--format", "json", "--fail-if-slower", "5")
    assert proc.returncode == 1 and json.loads(proc.stdout)["speedup"] < 1  # the gate's line went nowhere
    proc = cli_without(2, "compare", runs["fast"], "missing.json")
    assert proc.returncode == 2 and proc.stdout == ""


def test_a_closed_stdout_still_writes_the_files_asked_for(runs, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "report.png"
    proc = cli_into_closed_pipe("report", runs["slow"], runs["fast"], "--plot", str(png))
    assert proc.returncode == 141 and proc.stderr == f"plot written to {png}\n"
    with open(png, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_no_command_prints_the_usage_and_the_commands():
    proc = cli(check_rc=2)
    lines = proc.stderr.splitlines()
    assert lines[0] == "usage: lightning-perf [-h] [--version] COMMAND ..."
    assert lines[1] == "lightning-perf: error: no command given; the commands:"
    for name in ("compare", "report", "bench", "bench-compare", "matrix", "run"):
        assert any(line.split()[:1] == [name] for line in lines[2:]), (name, proc.stderr)
    assert "compare two runs: speedup with a 95% CI" in proc.stderr  # argparse's %% written as %
    assert lines[-1] == "Run 'lightning-perf COMMAND --help' for a command's options."
    assert proc.stdout == "" and "Traceback" not in proc.stderr


def _options_message(proc):
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    return proc.stderr


@pytest.mark.parametrize("value", ["-3", "0", "nan", "inf", "soon"])
def test_timeout_states_one_range_whatever_the_value(value):
    message = _options_message(cli("matrix", "--script", "x.py", "--variant", "baseline", "--timeout", value))
    assert message == (f"lightning-perf matrix: error: argument --timeout: expected a finite number > 0,"
                       f" got {value!r}\n")


@pytest.mark.parametrize("value", ["-1", "nan", "fast"])
def test_a_percentage_states_one_range_whatever_the_value(runs, value):
    message = _options_message(cli("compare", runs["slow"], runs["fast"], "--min-effect", value))
    assert message.endswith(f"argument --min-effect: expected a finite number >= 0, got {value!r}\n")


def test_bad_files_are_named_with_their_argument_and_what_they_are(runs, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    folder = tmp_path / "configs"
    folder.mkdir()
    message = _options_message(cli("matrix", "--script", str(script), "--config", str(folder), "--variant",
                                   "baseline"))
    assert message == f"lightning-perf: error: --config {str(folder)!r} is a directory; expected a YAML config file\n"
    message = _options_message(cli("matrix", "--script", str(folder), "--variant", "baseline"))
    assert f"--script {str(folder)!r} is a directory; expected a LightningCLI script" in message

    empty = tmp_path / "empty.json"
    empty.write_text("")
    for command in ("compare", "report"):
        message = _options_message(cli(command, str(empty), runs["fast"]))
        assert message == f"lightning-perf: error: {empty}: the file is empty; expected a perf_summary.json\n"

    marker = tmp_path / "ran"
    command = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    expected = "expected a perf_summary.json with a quality_gate section or a file written by record_baseline"
    message = _options_message(cli("run", "--baseline", str(empty), *command))
    assert message == f"lightning-perf: error: --baseline {str(empty)!r}: the file is empty; {expected}\n"
    for name, content in (("metrics.json", {"a": 1}), ("list.json", [1, 2]), ("other_kind.json", {"kind": "x"})):
        (tmp_path / name).write_text(json.dumps(content))
        message = _options_message(cli("run", "--baseline", str(tmp_path / name), *command))
        assert message.startswith(f"lightning-perf: error: --baseline {str(tmp_path / name)!r}: not a summary or"
                                  " baseline file (neither a schema_version nor kind"), message
        assert message.endswith(f"{expected}\n") and "direction" not in message
    assert not marker.exists()


def _default_text(default):
    if isinstance(default, (list, tuple)):
        return " ".join(str(v) for v in default)
    return f"{default:g}" if isinstance(default, float) else str(default)


def test_help_shows_every_default():
    from lightning_perf.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    checked = 0
    for name, sub in commands.items():
        for action in sub._actions:
            if not action.option_strings or action.default in (None, False, argparse.SUPPRESS):
                continue
            assert f"(default: {_default_text(action.default)})" in (action.help or ""), (name, action.dest)
            checked += 1
    assert checked >= 12
    # what the audit found missing, as `--help` prints it (lines joined: argparse wraps them)
    shown = {command: " ".join(cli(command, "--help", check_rc=0).stdout.split())
             for command in ("bench", "compare", "report", "matrix", "bench-compare")}
    for option, default in (("--input-sizes", "256 384"), ("--batch-sizes", "1 2 4"), ("--mode", "inference"),
                            ("--precision", "32"), ("--warmup", "10 inference, 5 train"),
                            ("--iters", "50 inference, 20 train"), ("--device", "cuda when available")):
        assert f"(default: {default}" in shown["bench"].split(option + " ", 2)[2].split(" --", 1)[0], option
    assert "(default: text)" in shown["compare"].split("--format ", 2)[2].split(" --", 1)[0]
    assert "(default: none, no limit)" in shown["matrix"].split("--timeout ", 2)[2].split(" --", 1)[0]
    assert "(default: markdown)" in shown["report"] and "(default: markdown)" in shown["bench-compare"]


def test_run_exits_with_the_commands_status_even_without_its_own_stderr(tmp_path):
    """``run`` writes a few lines of its own on stderr; without a stderr its exit status is still the command's."""
    for code in (0, 3):
        proc = subprocess.run(["bash", "-c", f'"$0" -m lightning_perf.cli run --out "$1" -- "$0" -c "raise'
                               f' SystemExit({code})" 2>&-', sys.executable, str(tmp_path / "out")],
                              stdout=subprocess.PIPE, text=True, timeout=120)
        assert proc.returncode == code, (code, proc.stdout)
