"""`lightning-perf bench --rounds`: every configuration measured in interleaved rounds, one CSV row each; the noise of
the verdict sentences comes from the spread between rounds, so a sentence is said only where the intervals separate.
Checked against figures recomputed here from the CSV."""

import csv
import math

import pytest

from test_bench_sweeps import cli, row, write


def _rounds(size, batch, times_ms, std_ms=0.0, peak_mb=10):
    return [row(size, batch, t, std_ms=std_ms, peak_mb=peak_mb, sweep_id="s1") for t in times_ms]


def _interleaved(by_config):
    """The CSV rows of a sweep run in rounds: round k runs the configurations forward (odd k) or reversed."""
    configs = list(by_config)
    n = len(next(iter(by_config.values())))
    out = []
    for k in range(n):
        for c in (configs if k % 2 == 0 else configs[::-1]):
            out.append(by_config[c][k])
    return out


def test_a_sweep_runs_its_configurations_in_interleaved_rounds_and_shows_one_row_each(tmp_path):
    out_csv = tmp_path / "b.csv"
    proc = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "8", "16", "--batch-sizes", "1",
               "--device", "cpu", "--csv", str(out_csv), "--warmup", "1", "--iters", "2", "--no-progress",
               "--rounds", "3")
    assert proc.returncode == 0, proc.stderr
    with open(out_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["tile_size"]) for r in rows] == [8, 16, 16, 8, 8, 16]  # A B, B A, A B
    assert "(2 configurations x 3 interleaved rounds)" in proc.stdout
    for size in (8, 16):
        times = [float(r["avg_time_ms"]) for r in rows if int(r["tile_size"]) == size]
        geo = math.exp(sum(map(math.log, times)) / 3)
        spread = 100 * math.sqrt(sum((math.log(t) - math.log(geo)) ** 2 for t in times) / 2)
        line = next(line for line in proc.stdout.splitlines() if line.split()[:2] == [str(size), "1"])
        assert line.split()[2] == f"{geo:.2f}" and f"3 rounds, ±{spread:.1f}% between them" in line, line


def test_rounds_that_disagree_keep_the_verdicts_unsaid(tmp_path):
    """Each round's rows are steady inside (no spread over iterations: one round alone decides everything), but the
    rounds disagree: 48 is 30% ahead of 32 in one round and behind in the next. Between rounds nothing separates, so
    neither "more efficient" nor "benefits more/less from batching" is said; the rows are reported within noise."""
    px = {1: [1.3, 0.8, 1.1], 4: [1.25, 0.85, 1.0]}  # 48's pixels/s over 32's, round by round
    t32 = {1: 10.0, 4: 25.0}
    rows = _interleaved({(s, b): _rounds(s, b, [t32[b] * (2.25 if s == 48 else 1.0) / (px[b][k] if s == 48 else 1.0)
                                                 for k in range(3)]) for s in (32, 48) for b in (1, 4)})
    proc = cli("bench", "--from-csv", write(tmp_path / "b.csv", rows))
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.split("Verdicts:")[1]
    for claim in ("is more efficient per pixel", "benefit less from batching", "benefit more from batching"):
        assert claim not in said, said
    assert "- 48 against 32 per pixel: no verdict (not beyond the noise at every batch size)" in said
    assert "(within noise, 95% CI" in said and "between 3 rounds)" in said
    assert "- Noise: the spread between 3 interleaved rounds of every configuration" in said
    # one round of the same rows decides: the old rule, blind to the drift between rounds, would have said it
    first = [r for r in rows[:4]]
    proc = cli("bench", "--from-csv", write(tmp_path / "one.csv", first))
    assert "is more efficient per pixel" in proc.stdout and "drift between rounds was not measured" in proc.stdout


def test_rounds_that_agree_decide_with_the_interval_between_rounds(tmp_path):
    """48's pixels/s 20% above 32's in every round (+-1%), at both batches: said, with the change recomputed from
    the rounds' geometric means."""
    px = {1: [1.2, 1.21, 1.19], 4: [1.2, 1.19, 1.21]}
    t32 = {1: [10.0, 10.3, 9.8], 4: [25.0, 25.4, 24.7]}
    times = {(s, b): [t32[b][k] * (2.25 / px[b][k] if s == 48 else 1.0) for k in range(3)]
             for s in (32, 48) for b in (1, 4)}
    proc = cli("bench", "--from-csv", write(tmp_path / "b.csv",
                                            _interleaved({c: _rounds(*c, t) for c, t in times.items()})))
    assert proc.returncode == 0, proc.stderr
    gains = []
    for b in (1, 4):
        geo = {s: math.exp(sum(math.log(t) for t in times[(s, b)]) / 3) for s in (32, 48)}
        gains.append(100 * (geo[32] * 2.25 / geo[48] - 1))
    assert (f"- 48 is more efficient per pixel than 32: more pixels per second at every batch size both ran"
            f" ({gains[0]:+.0f}% at batch 1, {gains[1]:+.0f}% at batch 4).") in proc.stdout, proc.stdout


def test_bench_compare_decides_between_rounds_where_both_sweeps_ran_them(tmp_path):
    old = [r for t in (10.0, 10.2, 9.9) for r in _rounds(32, 1, [t])]
    noisy = [r for t in (8.0, 12.5, 9.0) for r in _rounds(32, 1, [t])]  # -13% on the means, rounds all over
    proc = cli("bench-compare", write(tmp_path / "old.csv", old), write(tmp_path / "new.csv", noisy),
               "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    (result,) = list(csv.DictReader(proc.stdout.splitlines()))
    assert result["within_noise"] == "True" and "between 3 rounds" in result["note"], result
    faster = [r for t in (8.0, 8.1, 7.9) for r in _rounds(32, 1, [t])]
    proc = cli("bench-compare", write(tmp_path / "old.csv", old), write(tmp_path / "new2.csv", faster),
               "--format", "csv")
    (result,) = list(csv.DictReader(proc.stdout.splitlines()))
    assert result["within_noise"] == "False" and float(result["speed_change_pct"]) == pytest.approx(
        100 * (math.exp(sum(map(math.log, (10.0, 10.2, 9.9))) / 3 - sum(map(math.log, (8.0, 8.1, 7.9))) / 3) - 1),
        rel=1e-3)
