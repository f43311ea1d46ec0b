"""Issue 61, the rest: a fixed ``--repeats N`` race or matrix that cannot decide says what would (the smallest change
its rounds could find, the rounds that would find 10%, and for a matrix variant that is one switch the exact
``lightning-perf run --trial`` line, runnable as printed)."""

import csv
import io
import json
import math
import os
import shlex
import subprocess
import sys

import pytest

from lightning_perf.bench.matrix_sequential import add_sequential_verdicts
from lightning_perf.bench.matrix_verdicts import add_verdicts, verdict_findings
from lightning_perf.bench.race import TOGETHER_HINT
from lightning_perf.bench.sequential import IN_RUN_HINT
from lightning_perf.bench.what_would_decide import (
    add_trial_lines,
    fixed_rounds_for,
    fixed_smallest_change,
    fixed_words,
    switch_of,
    trial_line,
    trial_line_findings,
    what_would_decide,
)
from lightning_perf.cli import build_parser
from lightning_perf.measure.stats.ratio_ci import t_quantile_at_least

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_smallest_change_and_the_rounds_for_10pct_from_the_spread():
    """The figures of a fixed design: a paired t test at 95% with 80% power on the rounds' log-ratios."""
    diffs = [0.10, -0.12, 0.05, 0.02, -0.08]
    found = what_would_decide(diffs + [None])  # a round without both rates is left out
    mean = sum(diffs) / 5
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 4)
    assert found["rounds"] == 5 and found["sd"] == pytest.approx(sd)
    small = (t_quantile_at_least(0.975, 4) + 0.8416212335729143) * sd / math.sqrt(5)
    assert found["smallest_change_pct"] == pytest.approx(100 * math.expm1(small))
    need = found["rounds_for_10pct"]
    assert fixed_smallest_change(sd, need) <= math.log(1.1) < fixed_smallest_change(sd, need - 1)
    assert fixed_rounds_for(10.0, sd) == need and fixed_rounds_for(20.0, sd) < need
    words = fixed_words(found)
    assert words.startswith(f"this machine's drift hides changes under ~{found['smallest_change_pct']:.0f}% at 5"
                            f" rounds; about {need} rounds (--repeats {need}) would find 10%"), words
    assert words.endswith(IN_RUN_HINT)
    assert "give no spread" in fixed_words(what_would_decide([0.1]))
    assert "more than 1000 rounds" in fixed_words(what_would_decide([1.0, -1.0, 1.2]))
    # under 4 rounds the verdict's interval is not paired by round: no paired figure is said of it, and the rounds
    # named are never fewer than the 4 from which it is paired
    few = what_would_decide([-0.26, -0.13, -0.21])
    assert fixed_words(few).startswith("at 3 round(s) the verdict cannot pair the runs by round (it does from 4)")
    assert what_would_decide([0.001, -0.001, 0.0005])["rounds_for_10pct"] == 4 == fixed_rounds_for(10.0, 0.0001) + 2


@pytest.mark.parametrize("overrides, base, change", [
    (["--trainer.precision=bf16-mixed"], [], "autocast_bf16"),
    (["--seed=1", "--trainer.precision=16-mixed"], ["--seed=1"], "autocast_fp16"),
    (["--trainer.benchmark=true"], [], "cudnn_benchmark"),
    (["--model.channels_last=true", "--data.x=2"], ["--data.x=2"], "channels_last"),
    (["--model.compile=true"], [], None),  # not a change ABTrial flips
    (["--trainer.precision=bf16-mixed", "--trainer.benchmark=true"], [], None),  # two changes: no one switch
    (["--trainer.precision=bf16-mixed"], ["--seed=1"], None),  # the baseline's override dropped
])
def test_a_variant_is_a_switch_only_where_it_adds_one_known_switch(overrides, base, change):
    assert switch_of(overrides, base) == change


def test_the_trial_line_parses_with_the_cli_as_printed():
    """Quoted for a shell: a script and a config with spaces come back whole through the CLI's own parser."""
    line = trial_line("autocast_bf16", sys.executable, "my dir/train.py", "cfg with space.yaml", ["--seed=1"])
    words = shlex.split(line)
    assert words[:4] == ["lightning-perf", "run", "--trial", "autocast_bf16"]
    args = build_parser().parse_args(words[1:])
    assert args.command == "run" and args.trial == "autocast_bf16"
    assert args.program == ["--", sys.executable, "my dir/train.py", "fit", "--config", "cfg with space.yaml",
                            "--seed=1"]


def _rows(rates, rule="fixed"):
    """Synthetic matrix rows, as matrix_rows leaves them for the verdicts: name -> per-round rates (it/s)."""
    rounds = {"done": len(next(iter(rates.values()))), "planned": 5, "rule": rule, "round_s": [1.0] * 5}
    return [{"variant": name, "baseline": i == 0, "speedup_basis": "it/s", "_steady_rates": list(values),
             "_end_to_end_rates": list(values), "_rounds": rounds, "status": "completed"}
            for i, (name, values) in enumerate(rates.items())]


RATES = {"baseline": [10.0, 12.5, 9.0, 11.0, 13.0], "amp": [11.0, 10.0, 10.5, 13.5, 11.0],
         "slow": [7.0, 8.6, 6.3, 7.8, 9.0], "custom": [12.0, 10.0, 10.0, 12.0, 12.0]}
OVERRIDES = {"baseline": ["--seed=1"], "amp": ["--seed=1", "--trainer.precision=bf16-mixed"],
             "slow": ["--seed=1", "--trainer.benchmark=true"], "custom": ["--seed=1", "--model.extra_step_ms=3"]}


def test_matrix_rows_within_noise_say_what_would_decide_and_a_switch_gets_its_trial_line():
    rows = _rows(RATES)
    add_verdicts(rows, None, 2.0)
    by = {r["variant"]: r for r in rows}
    assert by["slow"]["steady_verdict"] == "slower" and "_steady_what_would_decide" not in by["slow"]
    for name in ("amp", "custom"):
        assert by[name]["steady_verdict"] == "within noise", by[name]
        found = by[name]["_steady_what_would_decide"]
        ratios = [math.log(r / b) for r, b in zip(RATES[name], RATES["baseline"])]
        assert found == pytest.approx(what_would_decide(ratios))
        assert fixed_words(found) in by[name]["steady_verdict_why"]
    add_trial_lines(rows, [{"overrides": OVERRIDES[r["variant"]]} for r in rows], "python", "train.py", "c.yaml")
    line = "lightning-perf run --trial autocast_bf16 -- python train.py fit --config c.yaml --seed=1"
    assert by["amp"]["_trial_line"] == line
    assert f"(or an in-run trial, which pairs the change inside one fit, would: `{line}`)" in (
        by["amp"]["end_to_end_verdict_why"])
    assert IN_RUN_HINT in by["custom"]["end_to_end_verdict_why"] and "_trial_line" not in by["custom"]
    # decided: a switch, but nothing to try
    assert by["slow"]["_trial_line"].startswith("lightning-perf run --trial cudnn_benchmark")
    lines = trial_line_findings(rows, "end-to-end")
    assert lines == [f"Try amp inside one run, where the drift between runs cannot reach it (its change is a switch"
                     f" ABTrial flips in alternating blocks): `{line}`."]
    within = next(f for f in verdict_findings(rows, "end-to-end") if f.startswith("Within noise of baseline"))
    assert "hides changes under" in within and line in within


def test_matrix_auto_rounds_name_the_trial_line_in_place_of_the_hint():
    """``--repeats auto``: the sequential verdict's undecided words get the exact line too; the fixed-design words are
    not added there."""
    rows = _rows(RATES, rule="sequential")
    add_verdicts(rows, None, 2.0)
    add_sequential_verdicts(rows, None, 2.0)
    amp = next(r for r in rows if r["variant"] == "amp")
    assert "_steady_what_would_decide" not in amp
    assert IN_RUN_HINT in amp["steady_verdict_why"] and "(--repeats" not in amp["steady_verdict_why"]
    add_trial_lines(rows, [{"overrides": OVERRIDES[r["variant"]]} for r in rows], "python", "train.py", None)
    assert amp["steady_verdict_why"].endswith(
        "would: `lightning-perf run --trial autocast_bf16 -- python train.py fit --seed=1`)"), amp["steady_verdict_why"]


#: A command that reports a recorded fit's summary with its ms/iter scaled by a factor per run: ``factors.json`` in
#: the working folder maps the run's name to one factor per round (the round and the name read from the folder the
#: race or the matrix gives the run), so every rate is known exactly.
PACED = '''
import json, os

path = os.environ.get("LIGHTNING_PERF_SUMMARY_PATH") or os.path.join(os.environ["LIGHTNING_PERF_RUN_OUT"],
                                                                     "perf_summary.json")
folder = os.path.dirname(os.path.abspath(path))
k = 1
if os.path.basename(folder).startswith("repeat_"):
    k, folder = int(os.path.basename(folder).split("_")[1]), os.path.dirname(folder)
factor = json.load(open("factors.json"))[os.path.basename(folder)][k - 1]
summary = json.load(open(os.environ["RECORDED"]))
timer = summary["iteration_timer"]
timer["ms_per_iter"] = {key: v * factor if isinstance(v, (int, float)) else v
                       for key, v in timer["ms_per_iter"].items()}
for key in ("it_per_s", "batches_per_s", "samples_per_s"):
    timer[key] = timer[key] / factor
json.dump(summary, open(path, "w"))
'''

#: ms/iter factors per round: the two setups overlap, so three rounds leave them within noise.
FACTORS = {"base": [1.0, 1.2, 0.9], "b": [1.1, 0.95, 1.15], "baseline": [1.0, 1.2, 0.9], "amp": [1.1, 0.95, 1.15]}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A summary of a real fit that completed."""
    from helpers import fit

    from lightning_perf import IterationTimer

    root = tmp_path_factory.mktemp("recorded")
    done = root / "completed.json"
    fit(root / "done", [IterationTimer(warmup_steps=2, summary_path=str(done))], max_steps=20, max_epochs=None,
        num_sanity_val_steps=0, limit_val_batches=0)
    return str(done)


def _cli(tmp_path, recorded, *args):
    (tmp_path / "paced.py").write_text(PACED.lstrip())
    (tmp_path / "factors.json").write_text(json.dumps(FACTORS))
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args, "--threads", "keep"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env=dict(os.environ, PYTHONPATH=ROOT, RECORDED=recorded))


def _expected(mine, base):
    return what_would_decide([math.log(b / m) for m, b in zip(mine, base)])  # rates are 1 / the ms factors


def test_race_with_fixed_repeats_says_what_would_decide(tmp_path, recorded):
    py = sys.executable
    proc = _cli(tmp_path, recorded, "race", "--cmd", f"base={py} paced.py", "--cmd", f"b={py} paced.py",
                "--repeats", "3", "--noise-floor", "off", "--out", "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "race.json").read_text())
    assert result["rounds"]["rule"] == "fixed"
    cmp = result["comparisons"]["b"]
    assert cmp["verdict"]["verdict"] == "within noise", cmp["verdict"]
    expected = _expected(FACTORS["b"], FACTORS["base"])
    assert cmp["what_would_decide"]["rounds"] == 3
    assert cmp["what_would_decide"]["sd"] == pytest.approx(expected["sd"])
    assert cmp["what_would_decide"]["rounds_for_10pct"] == expected["rounds_for_10pct"]
    # a race of CPU training run one command after the other names --together beside the in-run trial
    words = fixed_words(expected).replace(IN_RUN_HINT, TOGETHER_HINT)
    assert cmp["verdict"]["why"].endswith(words) and words.endswith(TOGETHER_HINT), cmp["verdict"]["why"]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("  b against base: "))
    assert f"--repeats {expected['rounds_for_10pct']}) would find 10%" in line, line


def test_matrix_with_fixed_repeats_prints_a_trial_line_the_cli_parses(tmp_path, recorded):
    proc = _cli(tmp_path, recorded, "matrix", "--script", "paced.py", "--variant", "baseline", "--variant", "amp",
                "--repeats", "3", "--noise-floor", "off", "--out", "runs", "--csv", "rows.csv")
    assert proc.returncode == 0, proc.stderr[-3000:]
    finding = next(x for x in proc.stdout.splitlines() if x.startswith("- Try amp inside one run"))
    line = finding.split("`")[1]
    words = shlex.split(line)
    args = build_parser().parse_args(words[1:])
    assert words[0] == "lightning-perf" and args.command == "run" and args.trial == "autocast_bf16"
    assert args.program == ["--", sys.executable, "paced.py", "fit"]
    rows = {r["variant"]: r for r in csv.DictReader(io.StringIO((tmp_path / "rows.csv").read_text()))}
    why = rows["amp"]["end_to_end_verdict_why"]
    assert rows["amp"]["end_to_end_verdict"] == "within noise", rows["amp"]
    # 3 rounds: the verdict's interval was not paired by round, and the why says so before the rounds that would
    assert "at 3 round(s) the verdict cannot pair the runs by round" in why and "would find 10%" in why, why
    assert f"would: `{line}`" in why, why
