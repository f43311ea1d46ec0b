"""What a hunt beside the readers' fuzzers found (each number of a real summary set to an extreme, one field and one
section at a time, through compare, report and the gate; the fuzzers' fresh draws, tests/test_cli_fuzz.py with
FUZZ_RANDOM=1 and tests/test_cli_fuzz_commands.py with other FUZZ_SEEDs, found none), each a small deterministic
case: real summaries with a few figures made absurd but finite (a file may hold them), through the real CLI. Each is
read, or refused with one line naming the file and field; never an internal error, and never a figure of hundreds of
digits."""

import copy
import json
import math
import re

import pytest

from summary_files import read, write_two_runs
from test_cli_fuzz import check_answer, run_cli


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    base, cand = write_two_runs(tmp_path_factory.mktemp("finds"))
    return {"base": read(base), "cand": read(cand)}


def _edit(summary, edits):
    """A copy of ``summary`` with ``{"a.b.c": value}`` set; an edit under a block the run left null (a sampler that
    took no sample, no slow tail: a short fit's summary differs from machine to machine) is skipped."""
    out = copy.deepcopy(summary)
    for dotted, value in edits.items():
        node = out
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.get(key)
            if node is None:
                break
        else:
            node[int(last) if isinstance(node, list) else last] = value
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


# -- a figure of 1e300 printed as 301 digits: every printed figure goes through one formatter, which turns to an
# exponent (1.00e+300) from 1e15 on, as fmt_energy does for joules
def _huge_timer(cand):
    timer = cand["iteration_timer"]
    edits = {f"iteration_timer.ms_per_iter.{k}": 1e300 for k in timer["ms_per_iter"]}
    edits.update({f"iteration_timer.{k}": 1e300 for k in ("it_per_s", "samples_per_s", "warmup_time_s",
                                                          "startup_time_s", "eval_time_s")})
    edits.update({"iteration_timer.tail.share_pct": 1e300, "iteration_timer.tail.median_ms": 1e300,
                  "iteration_timer.histogram_ms.max": 1e300})
    edits.update({f"iteration_timer.tail.slowest.{i}.ms": 1e300
                  for i in range(len((timer.get("tail") or {}).get("slowest") or ()))})
    return edits


def _huge_sections(cand, fields=("total_s", "p95_ms", "share_pct")):
    return {f"section_profiler.sections.{name}.{field}": 1e300
            for name in cand["section_profiler"]["sections"] for field in fields}


def _huge_others(cand):
    edits = {f"vram.phases.{phase}.host_rss_peak_mb": 1e300 for phase in cand["vram"]["phases"]}
    edits.update({f"quality_gate.metrics.{name}.value": 1e300 for name in cand["quality_gate"]["metrics"]})
    edits.update({f"logged.values.{name}": 1e300 for name in cand["logged"]["values"]})
    edits.update({"diagnosis.value": 1e300, "vram.activity.phases.train.process_cpu_cores.mean": 1e300})
    edits.update({f"diagnosis.ceilings.{name}.at_most": 1e300 for name in cand["diagnosis"].get("ceilings") or ()})
    return edits


HUGE = {"timer": _huge_timer, "sections": _huge_sections, "section_noise": lambda c: _huge_sections(c, ["p95_ms"]),
        "others": _huge_others}


@pytest.mark.parametrize("side", ["base", "cand"])
@pytest.mark.parametrize("group", sorted(HUGE))
def test_a_figure_of_1e300_prints_with_an_exponent_not_301_digits(real, tmp_path, group, side):
    files = _files(tmp_path, real, **{side: HUGE[group](real["cand"])})
    html = str(tmp_path / "page.html")
    for argv in (["compare", *files], ["compare", *files, "--format", "markdown"], ["report", *files],
                 ["report", *files, "--html", html], ["compare", *files, "--base-repeats", files[0],
                                                      "--candidate-repeats", files[1]]):
        rc, out, _ = _answer(argv, files + [html])
        assert rc == 0, argv
        _readable(out)
    page = open(html, encoding="utf-8").read()
    _readable(page)
    assert re.search(r"\d\.\d+e\+\d{3}", out + page), "no figure of 1e300 shown at all"


def test_the_slower_gate_says_a_slowdown_of_1e300_percent_with_an_exponent(real, tmp_path):
    timer = real["cand"]["iteration_timer"]
    files = _files(tmp_path, real, cand={"iteration_timer.ms_per_iter.mean": 1e300, "iteration_timer.it_per_s": 1e-297,
                                         "iteration_timer.samples_per_s": 1e-297 * timer["samples_per_s"]
                                         / timer["it_per_s"]})
    rc, out, err = _answer(["compare", *files, "--fail-if-slower", "5"], files)
    assert rc == 1 and "% slower than base" in err, err
    _readable(out + err)


# -- the speedup's intervals: a square of a batch's deviation past 1e308, a mean of 1e-300 squared to 0, exp(1381) ---
# (the real runs above have 11 iterations: below the 32 a batch-means interval needs, so the fuzz never reached it)
def _blocks(sums):
    return {"iteration_timer.blocks_ms": {"block_len": 1, "sums": sums, "open_sum": 0.0, "open_count": 0,
                                          "max_blocks": 256}}


STEADY = [10.0, 11.0] * 20


@pytest.mark.parametrize("sums", [[1e200] * 20 + [1e-200] * 20, [1e-300] * 40, [1e300] * 20 + [1e299] * 20],
                         ids=["deviation_1e200", "mean_1e-300", "mean_1e300"])
@pytest.mark.parametrize("side", ["base", "cand"])
def test_iteration_blocks_of_absurd_sizes_give_no_interval_rather_than_an_error(real, tmp_path, sums, side):
    edits = {"base": _blocks(STEADY), "cand": _blocks(STEADY)}
    edits[side] = _blocks(sums)
    files = _files(tmp_path, real, **edits)
    for fmt in ("text", "json"):
        rc, out, _ = _answer(["compare", *files, "--format", fmt], files)
        assert rc == 0
    _readable(run_cli(["compare", *files])[1])
    ci = json.loads(out)["speedup_ci95"]
    assert ci is None or all(math.isfinite(v) and v > 0 for v in ci), ci
    steady = _files(tmp_path / "steady", real, base=_blocks(STEADY), cand=_blocks(STEADY))
    assert json.loads(run_cli(["compare", *steady, "--format", "json"])[1])["speedup_ci95"] is not None


@pytest.mark.parametrize("order", ["fast_base", "fast_candidate"])
def test_repeats_whose_speeds_are_1e450_apart_give_no_interval_rather_than_an_error(real, tmp_path, order):
    """The first pair's speeds are 1e300 apart (a finite ratio), the second pair's 1e600: the geometric means are
    1e450 apart and the between-runs ratio, exp of a difference of logs, was exp(1036): an OverflowError."""
    def ms(value):
        return {"iteration_timer.ms_per_iter.mean": value}

    pairs = [(1e150, 1e-150), (1e300, 1e-300)]
    if order == "fast_base":
        pairs = [(c, b) for b, c in pairs]
    files = _files(tmp_path / "a", real, base=ms(pairs[0][0]), cand=ms(pairs[0][1]))
    again = _files(tmp_path / "b", real, base=dict(ms(pairs[1][0]), **{"run.name": "base again"}),
                   cand=dict(ms(pairs[1][1]), **{"run.name": "cand again"}))
    argv = ["compare", *files, "--base-repeats", again[0], "--candidate-repeats", again[1]]
    for fmt in ("text", "json"):
        rc, out, _ = _answer(argv + ["--format", fmt], files + again)
        assert rc == 0
    result = json.loads(out)
    assert result["speedup"] is None or math.isfinite(result["speedup"]) and result["speedup"] > 0, result["speedup"]
    _readable(run_cli(argv)[1])
    rc, _, err = _answer(argv + ["--fail-if-slower", "5"], files + again)
    assert rc in (0, 1), err


# -- the HTML bar charts: a bar of 1.7e308 was drawn `width="inf"` (420 x 1.7e308 before the division by the top)
@pytest.mark.parametrize("command", ["compare", "report"])
def test_html_bars_of_1e308_are_drawn_full_width_not_inf(real, tmp_path, command):
    sections = {f"section_profiler.sections.{name}.share_pct": 1.7e308
                for name in real["cand"]["section_profiler"]["sections"]}
    files = _files(tmp_path, real, cand={"iteration_timer.samples_per_s": 1.7e308, **sections})
    html = tmp_path / "page.html"
    rc, _, _ = _answer([command, *files, "--html", str(html)], files + [str(html)])
    assert rc == 0
    page = html.read_text(encoding="utf-8")
    assert not re.search(r'="-?(inf|nan)"', page), re.search(r'.{200}="-?(inf|nan)".{50}', page).group(0)
    _readable(page)


def test_race_ratios_of_runs_1e600_apart_are_inf_not_an_overflow():
    """race's and matrix's ratios between runs (the geometric means' ratio, the always-valid interval) read figures
    a program's summary gave: rates 1e600 apart give an infinite ratio, never an OverflowError."""
    from lightning_perf.bench.noise_floor import ratio_between
    from lightning_perf.bench.sequential import decide_rounds

    assert ratio_between([1e300], [1e-300])["ratio"] == math.inf
    found = decide_rounds([1400.0, 1401.0, 1399.0, 1400.5, 1399.5, 1400.0])
    assert found["ratio"] == math.inf and found["verdict"] == "faster", found
