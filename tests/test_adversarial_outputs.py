"""Adversarial inputs to what the suite writes and draws: a huge run name in `report --plot`, a `javascript:` path in
`report --html`, a CSV field past the csv module's limit in `bench --from-csv` and `bench-compare`, and a StepTrace
trace that a file-size limit cuts short (issue 63)."""

import csv
import json
import os
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from helpers import fit
from lightning_perf import IterationTimer
from lightning_perf.bench.sweep import CSV_COLUMNS

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def cli(*args, timeout=60):
    """The real command in a subprocess; ``timeout`` is a hang guard, not a measurement."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          cwd=TESTS, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    """One real summary (a short fit with IterationTimer), as a dict to change and write again."""
    root = tmp_path_factory.mktemp("fit")
    path = os.path.join(str(root), "perf_summary.json")
    fit(root, [IterationTimer(warmup_steps=1, summary_path=path)], max_epochs=1, logger=False,
        enable_checkpointing=False)
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def write(data, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    return path


# -- 6: report --plot with a 100,000-character run name -------------------------------------------------------------

def test_report_plot_shortens_a_huge_run_name_in_the_plot_and_keeps_it_in_the_table(summary, tmp_path, monkeypatch,
                                                                                       capsys):
    pytest.importorskip("matplotlib")
    from lightning_perf import cli as cli_module
    from lightning_perf.bench import plots

    long_a, long_b = "a" * 99_990 + "-base$fp32", "a" * 99_990 + "-cand$amp!"  # alike but for their ends
    paths = []
    for name, long in (("base", long_a), ("cand", long_b)):
        data = json.loads(json.dumps(summary))
        data["run"]["name"] = long
        paths.append(write(data, os.path.join(str(tmp_path), name, "perf_summary.json")))
    drawn = []
    real = plots.plot_report

    def spy(rows, path):  # what the plot is given to draw: the bars' labels and the first panel's title
        drawn.extend(row["run"] for row in rows)
        return real(rows, path)

    monkeypatch.setattr(plots, "plot_report", spy)
    png = os.path.join(str(tmp_path), "report.png")
    assert cli_module.main(["report", *paths, "--plot", png]) == 0
    out = capsys.readouterr().out
    assert long_a in out and long_b in out  # the table keeps the full names
    with open(png, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    # short labels, still told apart by their ends, `$` still escaped for matplotlib
    assert len(drawn) == 2 and all(len(label.replace("\\$", "$")) <= 40 for label in drawn)
    assert drawn == [plots.plot_label(long_a), plots.plot_label(long_b)]
    assert drawn[0].startswith("aaaa") and drawn[0].endswith("-base\\$fp32") and "\u2026" in drawn[0]
    assert drawn[1].endswith("-cand\\$amp!") and len(set(drawn)) == 2


def test_plot_label_leaves_a_short_name_as_it_is():
    from lightning_perf.bench.plots import plot_label

    assert plot_label("amp $x") == "amp \\$x"
    assert plot_label("x" * 40) == "x" * 40
    assert len(plot_label("x" * 41)) == 40


# -- 14: report --html and a path that is a javascript: (or other scheme's) URL --------------------------------------

class Links(HTMLParser):
    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.links, self.code = [], []
        self._in_code = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.links.append(dict(attrs).get("href"))
        self._in_code = tag == "code"

    def handle_endtag(self, tag):
        self._in_code = False

    def handle_data(self, data):
        if self._in_code:
            self.code.append(data)


def test_report_html_shows_a_path_with_a_scheme_as_text_not_as_a_link(summary, tmp_path):
    bad = ["javascript:alert(document.domain)", " JavaScript:alert(1)", "java\tscript:alert(2)",
           "\x01javascript:alert(3)", "data:text/html,<script>alert(4)</script>", "vbscript:msgbox(5)",
           "https://example.com/x.json", "\\\\host\\share\\trace.json", "C:\\traces\\step.json"]
    good = ["traces/step5.json", "/tmp/oom/snapshot.pickle", "traces/step:5.json"]
    data = json.loads(json.dumps(summary))
    data["iteration_timer"]["evidence"] = {"paths": bad + good}
    path = write(data, os.path.join(str(tmp_path), "run", "perf_summary.json"))
    page_path = os.path.join(str(tmp_path), "report.html")
    proc = cli("report", path, "--html", page_path)
    assert proc.returncode == 0, proc.stderr
    with open(page_path, encoding="utf-8") as fh:
        page = Links(fh.read())
    assert page.links == ["traces/step5.json", "file:///tmp/oom/snapshot.pickle", "traces/step:5.json"]
    shown = "".join(page.code)
    for value in bad:
        assert value in shown


# -- 16: a CSV field over the csv module's 131,072 characters -----------------------------------------------------

def huge_field_csv(path):
    row = {key: "" for key in CSV_COLUMNS}
    row.update(timestamp="2026-01-01T00:00:00", mode="inference", tile_size="64", batch_size="1", device="cpu",
               precision="32", avg_time_ms="1.0", std_time_ms="0.1", throughput_samples_per_sec="1000",
               pixels_per_sec="4096000", sweep_id="s1", error="x" * 200_000)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerow(row)
    return path


@pytest.mark.parametrize("command", [["bench", "--from-csv", "{csv}"], ["bench-compare", "{csv}", "{csv}"]])
def test_a_csv_field_over_the_csv_limit_is_one_line_and_exit_2(tmp_path, command):
    path = huge_field_csv(os.path.join(str(tmp_path), "huge.csv"))
    proc = cli(*[arg.format(csv=path) for arg in command])
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    what = "--from-csv" if command[0] == "bench" else "OLD"
    assert lines[0].startswith(f"lightning-perf: error: {what} {path!r} line 2: ")
    assert "131072" in lines[0] and len(lines[0]) < 400


def test_bench_appending_to_a_csv_whose_header_is_past_the_csv_limit_is_one_line_and_exit_2(tmp_path):
    path = os.path.join(str(tmp_path), "huge.csv")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("x" * 200_000 + ",y\n")
    proc = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "16", "--batch-sizes", "1",
               "--warmup", "0", "--iters", "1", "--device", "cpu", "--no-progress", "--csv", path, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"lightning-perf: error: --csv {path!r} is not a lightning-perf bench CSV (")
    assert "131072" in lines[0] and os.path.getsize(path) == 200_003  # nothing appended


# -- 12: StepTrace under a file-size limit ---------------------------------------------------------------------------

LIMITED_FIT = """
import os, resource, signal, sys
sys.path.insert(0, {tests!r})
from helpers import fit
from lightning_perf import IterationTimer, StepTrace

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of ending the process
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))
fit({root!r}, [IterationTimer(warmup_steps=1), StepTrace(steps=[2, 3], trace_dir={traces!r})], max_epochs=1,
    logger=False, enable_checkpointing=False)
"""


def test_a_trace_cut_by_a_file_size_limit_is_not_claimed(tmp_path):
    # 40 kB: the summary (~11 kB) fits, the trace of two steps (~100 kB on CPU) does not
    root, traces = str(tmp_path / "run"), str(tmp_path / "traces")
    os.makedirs(traces)
    stale = os.path.join(traces, "step_2-3.pt.trace.json")  # an earlier run's trace must not pass for this one's
    with open(stale, "w") as fh:
        fh.write('{"traceEvents": []}')
    script = LIMITED_FIT.format(tests=TESTS, limit=40_000, root=root, traces=traces)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=TESTS, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(os.path.join(root, "perf_summary.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    (capture,) = data["step_trace"]["captures"]
    assert capture["complete"] is False and capture["path"] is None
    assert (capture["first_step"], capture["last_step"]) == (2, 3)
    assert "step_2-3.pt.trace.json" in capture["write_error"]
    assert capture["top_ops"]  # what the profiler saw is still told
    assert os.listdir(traces) == []  # no truncated .tmp, no stale file left
    output = proc.stdout + proc.stderr
    assert "traced to" not in output and "see trace" not in output
    assert output.count("StepTrace: the trace of steps 2-3 could not be written") == 1
    assert not any("see trace" in line for line in data["diagnosis"]["evidence"])
    assert not any("trace" in entry for entry in data["iteration_timer"]["tail"]["slowest"])
