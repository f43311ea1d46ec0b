"""The readers of perf_summary.json: one typed definition, verdicts that fail closed, one line for a bad file.

Issue 22, items 2 (the speed gate never passes on NaN, negative, zero or infinite figures), 6 (no traceback, ever:
exit 2 and one line naming the file and the field) and 14 (free text cannot break a markdown row), and the design
step: the model, the JSON Schema and the docs' field table derived from it.
"""

import contextlib
import io
import json
import os
import re
import subprocess
import sys

import pytest

from summary_files import read, write_two_runs
from lightning_perf.bench.matrix import format_matrix, matrix_rows
from lightning_perf.cli import main
from lightning_perf.summary import load_summary
from lightning_perf.summary.compare import compare_summaries, headline
from lightning_perf.summary.derived import TABLE_END, TABLE_START, field_rows, json_schema_text, summary_doc_with_table
from lightning_perf.summary.model import PerfSummary, parse
from lightning_perf.summary.report import format_report, report_rows
from lightning_perf.summary.schema import SummaryError

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base, cand = write_two_runs(tmp_path_factory.mktemp("readers"))
    return {"base": base, "cand": cand}


def edited(runs, tmp_path, name="cand", text=None, **changes):
    """A copy of a real summary with ``changes`` ({"a.b.c": value}) applied, or with its text replaced."""
    data = read(runs[name])
    for dotted, value in changes.items():
        keys = dotted.split(".")
        node = data
        for key in keys:
            if key is keys[-1]:
                node[int(key) if isinstance(node, list) else key] = value
            else:
                node = node[int(key)] if isinstance(node, list) else node[key]
    path = tmp_path / f"{name}-edited" / "edited.json"  # not perf_summary*.json: broken on purpose
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text is not None else json.dumps(data, allow_nan=True), encoding="utf-8",
                    errors="surrogatepass")
    return str(path)


def cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          errors="replace", timeout=120, env=dict(os.environ, **(env or {})))


def in_process(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(args))
    return rc, out.getvalue(), err.getvalue()


def one_error_line(err, *needles):
    assert err.count("\n") == 1 and err.startswith("lightning-perf: error:"), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, err


# -- item 2: the speed gate fails closed -----------------------------------------------------------------------------

@pytest.mark.parametrize("value, shown", [(float("nan"), "NaN"), (-12.5, "-12.5"), (1e999, "Infinity")])
def test_gate_refuses_a_nan_negative_or_infinite_mean_naming_the_field(runs, tmp_path, value, shown):
    """Before: `Speedup: nanx` and exit 0. A figure no run can have is a bad file: exit 2, the field named."""
    for name in ("base", "cand"):
        bad = edited(runs, tmp_path, name, **{"iteration_timer.ms_per_iter.mean": value})
        args = (bad, runs["cand"]) if name == "base" else (runs["base"], bad)
        proc = cli("compare", *args, "--fail-if-slower", "5")
        assert proc.returncode == 2, proc.stdout
        one_error_line(proc.stderr, bad, f"`iteration_timer.ms_per_iter.mean` must be a finite number >= 0, got {shown}")
        assert "nan" not in proc.stdout.lower() and "inf" not in proc.stdout.lower()


def test_gate_cannot_decide_on_a_zero_mean_or_a_speedup_that_overflows(runs, tmp_path):
    zero = edited(runs, tmp_path, "cand", **{"iteration_timer.ms_per_iter.mean": 0})
    proc = cli("compare", runs["base"], zero, "--fail-if-slower", "5")
    assert proc.returncode == 1 and "cannot decide" in proc.stderr and "not a positive finite time" in proc.stderr
    assert re.search(r"Speed ratio:\s+n/a", proc.stdout)
    huge = edited(runs, tmp_path, "base", **{"iteration_timer.ms_per_iter.mean": 1e300})
    tiny = edited(runs, tmp_path, "cand", **{"iteration_timer.ms_per_iter.mean": 1e-300})
    for pair in ((huge, tiny), (tiny, huge)):  # 1e600x and 1e-600x: no finite speedup either way
        proc = cli("compare", *pair, "--fail-if-slower", "5")
        assert proc.returncode == 1 and "cannot decide" in proc.stderr, proc.stderr
        assert "nan" not in proc.stdout.lower() and "inf" not in proc.stdout.lower(), proc.stdout


def test_headline_report_and_matrix_show_no_speedup_for_the_same_figures(runs, tmp_path):
    base = read(runs["base"])
    for bad_mean in (0, float("nan"), -1.0, float("inf")):
        cand = read(runs["cand"])
        cand["iteration_timer"]["ms_per_iter"]["mean"] = bad_mean
        if bad_mean == 0:
            head = headline(base, cand)
            assert head["speedup"] is None and "not a positive finite time" in head["reason"]
            rows = report_rows([base, cand], ["base", "cand"])
            assert rows[1]["speedup"] is None and rows[1]["change_pct"] is None
            assert "| n/a |" in format_report(rows)
            results = [{"name": n, "overrides": [], "exit_code": 0, "wall_s": 1.0, "summary": s, "log": ""}
                       for n, s in (("base", base), ("cand", cand))]
            mrows = matrix_rows(results)
            assert mrows[1]["speedup"] is None and "nan" not in format_matrix(mrows).lower()
        else:  # the Python API refuses them like the CLI: the model names the field
            with pytest.raises(SummaryError, match=r"`iteration_timer.ms_per_iter.mean` must be a finite number"):
                headline(base, cand)
            with pytest.raises(SummaryError, match=r"ms_per_iter.mean"):
                report_rows([base, cand], ["base", "cand"])


# -- item 6: one line, exit 2, the file and the field named -----------------------------------------------------------

BAD_FIELDS = {
    "passed_yes": ({"quality_gate.passed": "yes"}, "`quality_gate.passed` must be true or false or null, got 'yes'"),
    "metric_passed": ({"quality_gate.metrics.psnr.passed": "yes"}, "`quality_gate.metrics.psnr.passed`"),
    "metric_value": ({"quality_gate.metrics.psnr.value": "high"}, "`quality_gate.metrics.psnr.value`"),
    "values_list": ({"logged.values": [1, 2]}, "`logged.values` must be an object or null, got a list"),
    "value_text": ({"logged.values.train_loss": "low"}, "`logged.values.train_loss` must be a number or null"),
    "notes_int": ({"run.notes": 5}, "`run.notes` must be a string or null, got 5"),
    "name_list": ({"run.name": ["a"]}, "`run.name` must be a string or null, got a list"),
    "blocks_text": ({"iteration_timer.blocks_ms.sums": "x"}, "`iteration_timer.blocks_ms.sums` must be a list"),
    "blocks_item": ({"iteration_timer.blocks_ms.sums.0": None}, "`iteration_timer.blocks_ms.sums[0]` must be a number"),
    "block_len_0": ({"iteration_timer.blocks_ms.block_len": 0}, "`iteration_timer.blocks_ms.block_len` must be an"
                                                                 " integer >= 1, got 0"),
    "open_count": ({"iteration_timer.blocks_ms.open_count": 5}, "`iteration_timer.blocks_ms.open_count` must be at"
                                                                 " most block_len"),
    "error_message": ({"error": {"type": "RuntimeError", "message": 3}}, "`error.message` must be a string or null"),
    "large_int": ({"iteration_timer.iterations": 10**400}, "`iteration_timer.iterations` must be an integer >= 0,"
                                                           " got an integer of more than 50 digits"),
    "epoch_time": ({"iteration_timer.epochs.0.time_s": -1}, "`iteration_timer.epochs[0].time_s` must be a finite"
                                                            " number >= 0, got -1"),
    "phase_list": ({"vram.phases.train": []}, "`vram.phases.train` must be an object or null, got a list"),
    "mode": ({"quality_gate.metrics.psnr.mode": "up"}, "`quality_gate.metrics.psnr.mode` must be one of"),
    "count_bool": ({"iteration_timer.measured_iterations": True}, "`iteration_timer.measured_iterations` must be an"
                                                                  " integer or null, got true"),
}


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(runs, tmp_path, case):
    changes, message = BAD_FIELDS[case]
    bad = edited(runs, tmp_path, **changes)
    proc = cli("compare", runs["base"], bad, "--fail-if-slower", "5")  # the gate, as CI runs it
    assert proc.returncode == 2
    one_error_line(proc.stderr, bad, message)
    for args in (("compare", runs["base"], bad), ("report", runs["base"], bad),
                 ("report", bad, runs["base"], "--plot", str(tmp_path / "p.png"))):
        rc, _, err = in_process(*args)
        assert rc == 2
        one_error_line(err, bad, message)


@pytest.mark.parametrize("text, message", [
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ('{"schema_version": 2, "status": "completed", "run": {}, "x": ' + "9" * 5000 + "}", "4300 digits"),
    ('{"schema_version": 2, "status": "completed", "run": {"notes": ' + "[" * 900 + "]" * 900 + "}}",
     "`run.notes` must be a string or null, got a list"),
])
def test_deep_nesting_and_huge_integers_are_one_line(runs, tmp_path, text, message):
    bad = edited(runs, tmp_path, text=text)
    for args in (("compare", bad, runs["cand"], "--fail-if-slower", "5"), ("report", runs["base"], bad)):
        proc = cli(*args)
        assert proc.returncode == 2
        one_error_line(proc.stderr, bad, message)


def test_iterations_with_400_digits_is_a_clear_error():
    proc = cli("compare", "a.json", "b.json", "--iterations", "9" * 400)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "--iterations" in proc.stderr and "up to 1e+15" in proc.stderr


def test_a_run_name_that_is_matplotlib_math_text_plots(runs, tmp_path):
    pytest.importorskip("matplotlib")
    named = edited(runs, tmp_path, **{"run.name": "$\\macro$ and $x_"})
    png = tmp_path / "report.png"
    proc = cli("report", runs["base"], named, "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    assert png.stat().st_size > 0 and "macro$ and $x_" in proc.stdout


def test_a_run_name_with_a_lone_surrogate_prints_under_utf8(runs, tmp_path):
    named = edited(runs, tmp_path, **{"run.name": "amp \udc80 run", "run.notes": "\udcff"})
    for args in (("compare", runs["base"], named), ("report", runs["base"], named),
                 ("report", runs["base"], named, "--plot", str(tmp_path / "s.png"))):
        proc = cli(*args, env={"PYTHONIOENCODING": "utf-8"})
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr and "amp ? run" in proc.stdout


# -- item 14: free text cannot break a markdown row ---------------------------------------------------------------

def _cells(line):
    """The cells of a markdown table row, splitting on unescaped pipes only."""
    cells, cell, escaped = [], "", False
    for ch in line.strip()[1:-1]:
        if ch == "|" and not escaped:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
        escaped = ch == "\\" and not escaped
    return cells + [cell.strip()]


def test_pipes_and_newlines_in_notes_and_names_stay_in_their_cell(runs, tmp_path):
    named = edited(runs, tmp_path, **{"run.name": "amp | bf16\nfast"})
    proc = cli("report", runs["base"], named, "--notes", "a | b", "line one\nline two")
    assert proc.returncode == 0, proc.stderr
    # The table is header, rule and two rows; notes may follow it (e.g. a run measured on a busy machine).
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("|")]
    assert len(lines) == 4
    header = _cells(lines[0])
    for row in lines[2:]:
        assert len(_cells(row)) == len(header), row
    assert _cells(lines[2])[-1] == "a \\| b" and _cells(lines[3])[-1] == "line one line two"
    assert _cells(lines[3])[0] == "amp \\| bf16 fast"
    proc = cli("compare", runs["base"], named, "--format", "markdown")
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| amp")]
    header = next(ln for ln in proc.stdout.splitlines() if ln.startswith("| run"))  # after the diagnosis line
    assert len(rows) == 1 and len(_cells(rows[0])) == len(_cells(header))


# -- the typed definition and what is derived from it -------------------------------------------------------------

def test_the_committed_json_schema_is_the_models():
    with open(os.path.join(DOCS, "perf_summary.schema.json"), encoding="utf-8") as fh:
        committed = fh.read()
    assert committed == json_schema_text(), "run: python -m lightning_perf.summary.derived --write"


def test_the_field_table_of_the_docs_is_the_models():
    with open(os.path.join(DOCS, "summary.md"), encoding="utf-8") as fh:
        doc = fh.read()
    assert TABLE_START in doc and TABLE_END in doc
    assert doc == summary_doc_with_table(doc), "run: python -m lightning_perf.summary.derived --write"
    for path, _, _, _ in field_rows():
        assert f"| `{path}` |" in doc


#: Every path compare, report and matrix read (grep the readers for new ones): each is declared, so checked.
READ_PATHS = [
    "schema_version", "status", "run", "run.name", "run.notes", "run.started_at", "run.device", "run.host",
    "run.platform", "run.precision", "run.max_steps", "run.max_epochs", "run.versions.torch", "run.versions.cuda",
    "run.versions.lightning", "run.versions.lightning_perf", "run.versions.python", "error.message",
    "logged.values", "logged.monitor", "iteration_timer.ms_per_iter.mean", "iteration_timer.ms_per_iter.median",
    "iteration_timer.ms_per_iter.min", "iteration_timer.ms_per_iter.max", "iteration_timer.ms_per_iter.p95",
    "iteration_timer.ms_per_iter.p99", "iteration_timer.it_per_s", "iteration_timer.samples_per_s",
    "iteration_timer.measured_iterations", "iteration_timer.warmup_time_s", "iteration_timer.excluded",
    "iteration_timer.fits", "iteration_timer.validation_runs", "iteration_timer.iterations",
    "iteration_timer.eval_time_s", "iteration_timer.train_time_s", "iteration_timer.epochs[i].time_s",
    "iteration_timer.blocks_ms.block_len", "iteration_timer.blocks_ms.sums", "iteration_timer.blocks_ms.open_sum",
    "iteration_timer.blocks_ms.open_count", "iteration_timer.blocks_ms.max_blocks",
    "vram.phases.<name>.peak_allocated_mb", "vram.phases.<name>.peak_reserved_mb",
    "vram.phases.<name>.nvml_peak_used_mb", "vram.phases.<name>.host_rss_peak_mb", "quality_gate.passed",
    "quality_gate.metrics.<name>.value", "quality_gate.metrics.<name>.mode", "quality_gate.metrics.<name>.passed",
]


def test_every_field_the_readers_use_is_declared():
    declared = {path for path, _, _, _ in field_rows()}
    assert [p for p in READ_PATHS if p not in declared] == []


def test_real_summaries_read_as_typed_objects_and_keep_unknown_fields(runs, tmp_path):
    summary = parse(read(runs["base"]), runs["base"])
    assert isinstance(summary, PerfSummary) and summary.status == "completed"
    assert summary.iteration_timer.ms_per_iter.mean > 0 and summary.quality_gate.metrics["psnr"].mode == "max"
    assert summary.logged.values["train_loss"] >= 0 and summary.run.notes == "base notes"
    newer = edited(runs, tmp_path, "base", **{"future_section": {"x": [1, {"y": None}]},
                                              "iteration_timer.future_figure": "kept"})
    data = load_summary(newer)
    assert data["future_section"] == {"x": [1, {"y": None}]}
    assert parse(data).iteration_timer.model_extra["future_figure"] == "kept"
    minimal = {"schema_version": 1, "status": "failed", "run": {}}  # every section is optional
    assert parse(minimal).iteration_timer is None
    assert compare_summaries(minimal, read(runs["cand"]))["speedup"] is None


def test_load_summary_names_the_file_the_field_the_value_and_the_rule(runs, tmp_path):
    bad = edited(runs, tmp_path, **{"iteration_timer.ms_per_iter.mean": float("nan")})
    with pytest.raises(SummaryError) as err:
        load_summary(bad)
    assert str(err.value) == f"{bad}: `iteration_timer.ms_per_iter.mean` must be a finite number >= 0, got NaN"


#: tail.by_cause's keys that the model once passed through unchecked: each wrongly typed one is refused like any other.
BAD_TAIL_CAUSE = {
    "gc_pause_s": ("gc", {"gc_pause_s": "3.5"}, "`iteration_timer.tail.by_cause.gc.gc_pause_s` must be a number or"
                                                " null, got '3.5'"),
    "also": ("gc", {"also": {"checkpoint": "2"}}, "`iteration_timer.tail.by_cause.gc.also.checkpoint` must be an"
                                                  " integer or null, got '2'"),
    "flagged_iterations": ("gc", {"flagged_iterations": "4"}, "`iteration_timer.tail.by_cause.gc.flagged_iterations`"
                                                              " must be an integer or null, got '4'"),
    "own_s": ("lightning_perf", {"own_s": "0.2"}, "`iteration_timer.tail.by_cause.lightning_perf.own_s` must be a"
                                                  " number or null, got '0.2'"),
}


@pytest.mark.parametrize("case", sorted(BAD_TAIL_CAUSE))
def test_a_wrongly_typed_tail_cause_field_is_refused_naming_it(runs, tmp_path, case):
    cause, entry, message = BAD_TAIL_CAUSE[case]
    good = {"iterations": 1, "time_s": 0.06, "excess_s": 0.05, "mean_ms": 60.0, "share_pct": 5.0,
            "flagged_iterations": 4, "also": {"checkpoint": 2}, "gc_pause_s": 0.03, "own_s": 0.01}
    fine = edited(runs, tmp_path, **{f"iteration_timer.tail.by_cause.{cause}": good})
    assert parse(load_summary(fine)).iteration_timer.tail.by_cause[cause].model_extra == {}  # all typed, none extra
    bad = edited(runs, tmp_path, **{f"iteration_timer.tail.by_cause.{cause}": dict(good, **entry)})
    with pytest.raises(SummaryError) as err:
        load_summary(bad)
    assert str(err.value) == f"{bad}: {message}"
    rc, _, err_text = in_process("compare", runs["base"], bad, "--fail-if-slower", "5")  # the gate, as CI runs it
    assert rc == 2
    one_error_line(err_text, bad, message)


def test_a_path_with_a_nul_byte_is_one_line(runs):
    rc, _, err = in_process("compare", "runs/a\x00b.json", runs["cand"])
    assert rc == 2
    one_error_line(err, "'runs/a\\x00b.json': cannot read")


def test_matrix_names_a_variant_whose_summary_breaks_the_definition(runs, tmp_path):
    from lightning_perf.summary.io import load_summary as load

    bad = edited(runs, tmp_path, **{"quality_gate.passed": "yes"})
    try:
        load(bad)
    except SummaryError as err:
        problem = str(err)
    results = [{"name": "base", "overrides": [], "exit_code": 0, "wall_s": 1.0, "summary": read(runs["base"]),
                "log": ""},
               {"name": "amp", "overrides": [], "exit_code": 0, "wall_s": 1.0, "summary": None, "log": "",
                "problem": problem}]
    rows = matrix_rows(results)
    assert rows[1]["status"] == f"summary unreadable: {problem}" and "`quality_gate.passed`" in rows[1]["status"]


def test_compare_says_when_the_runs_trained_different_models(runs, tmp_path):
    """Two runs of different LightningModule classes: the comparison says so (a like-for-like speedup only when that
    was the change); the same class, or a class not recorded, says nothing of it."""
    base = read(runs["base"])
    assert base["run"]["model_class"]  # the callbacks record it
    other = edited(runs, tmp_path, **{"run.model_class": "elsewhere.OtherNet"})
    notes = compare_summaries(base, read(other))["notes"]
    said = [n for n in notes if n.startswith("runs trained different models")]
    assert said == [f"runs trained different models ({base['run']['model_class']} vs elsewhere.OtherNet): an iteration"
                    " is not the same work unless that was the change"], notes
    rc, out, _ = in_process("compare", runs["base"], other)
    assert rc == 0 and said[0] in out
    for same in (read(runs["cand"]), read(edited(runs, tmp_path, **{"run.model_class": None}))):
        assert not any("different models" in n for n in compare_summaries(base, same)["notes"])
