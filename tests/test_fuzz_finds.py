"""What the readers' fuzzers found (tests/test_cli_fuzz.py with FUZZ_RANDOM=1, tests/test_cli_fuzz_commands.py with
other FUZZ_SEEDs), each as a small deterministic case: real summaries with a few figures made absurd but finite
(a file may hold them), through the real CLI. Each is read, or refused with one line naming the file and field;
never an internal error, and never a figure of hundreds of digits."""

import copy
import json
import re

import pytest

from summary_files import read, write_two_runs
from test_cli_fuzz import check_answer, run_cli


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    base, cand = write_two_runs(tmp_path_factory.mktemp("finds"))
    return {"base": read(base), "cand": read(cand)}


def _edit(summary, edits):
    """A copy of ``summary`` with ``{"a.b.c": value}`` set."""
    out = copy.deepcopy(summary)
    for dotted, value in edits.items():
        node = out
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    return out


def _files(tmp_path, real, base=None, cand=None):
    paths = []
    for name, edits in (("base", base), ("cand", cand)):
        path = tmp_path / name / "perf_summary.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_edit(real[name], edits or {})))
        paths.append(str(path))
    return paths


def _answer(argv, files):
    rc, out, err = run_cli(argv)
    check_answer(rc, out, err, files)
    return rc, out, err


#: A run of digits no figure of a real run prints (30 digits: 1e30 ms is beyond the age of the universe).
LONG_NUMBER = re.compile(r"\d{30,}")


def _readable(text):
    found = LONG_NUMBER.search(text)
    assert found is None, text[max(0, found.start() - 200):found.end()]


# -- batch sizes that differ by a factor of 1e305: the like-for-like time to N iterations overflowed ----------------
def test_samples_per_iteration_1e305_apart_read_without_an_overflow(real, tmp_path):
    """The samples/s headline is finite (the ms/iter ratio makes up the samples ratio), but N x the samples ratio is
    infinite: `round(inf)` raised OverflowError, reported as an internal error."""
    files = _files(tmp_path, real,
                   base={"iteration_timer.samples_per_s": 1.0, "iteration_timer.it_per_s": 1.0,
                         "iteration_timer.ms_per_iter.mean": 1e-300},
                   cand={"iteration_timer.samples_per_s": 1e305, "iteration_timer.it_per_s": 1.0,
                         "iteration_timer.ms_per_iter.mean": 1e5})
    for fmt in ("text", "json"):
        rc, out, _ = _answer(["compare", *files, "--format", fmt], files)
        assert rc == 0
    result = json.loads(out)
    assert result["speedup_basis"] == "samples/s"
    assert result["time_saved_s"] is None  # no finite like-for-like time: said as n/a, not made up


# -- the HTML histogram: an accuracy out of range made gamma negative (complex powers) or 1/0; a key of 1e6 overflowed
@pytest.mark.parametrize("edit", [{"relative_accuracy": 1e300}, {"relative_accuracy": 1.0},
                                  {"bin_keys": [10**6] * 11}, {"bin_keys": [-(10**6)] * 11}],
                         ids=["accuracy_1e300", "accuracy_1", "key_1e6", "key_minus_1e6"])
def test_html_reports_draw_or_skip_a_histogram_whose_figures_are_out_of_range(real, tmp_path, edit):
    files = _files(tmp_path, real, cand={f"iteration_timer.histogram_ms.{k}": v for k, v in edit.items()})
    for command in ("compare", "report"):
        html = tmp_path / f"{command}.html"
        rc, _, _ = _answer([command, *files, "--html", str(html)], files + [str(html)])
        assert rc == 0
        page = html.read_text(encoding="utf-8")
        assert page.count('class="bin"') in (30, 60)  # the base's histogram drawn; the candidate's drawn or not
        _readable(page)
