"""`lightning-perf bench` sweeps kept apart in one CSV, the analysis' wording, CPU out-of-memory, and bench-compare's
noise test, checked against figures recomputed from the CSV the tests write or read back."""

import csv
import os
import subprocess
import sys

import pytest

from lightning_perf.bench.sweep import CSV_COLUMNS

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
QUICK = ["--warmup", "1", "--iters", "2", "--no-progress", "--rounds", "1"]  # the rounds: tests/test_bench_rounds.py


def cli(*args, cwd=TESTS, timeout=300):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=env)


def read_back(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def row(size, batch, avg_ms, std_ms=0.0, peak_mb=100.0, **extra):
    """A successful row whose derived columns follow from ``avg_ms`` as a sweep computes them."""
    r = {k: "" for k in CSV_COLUMNS}
    samples = batch / (avg_ms / 1000.0)
    r.update(timestamp="2024-05-01T10:00:00+00:00", mode="inference", tile_size=size, batch_size=batch, device="cpu",
             precision="32", model_params=1000, model_size_mb=0.01, avg_time_ms=avg_ms, std_time_ms=std_ms,
             throughput_samples_per_sec=samples, pixels_per_sec=samples * size * size, memory_peak_mb=peak_mb,
             efficiency_pixels_per_sec_per_mb=samples * size * size / peak_mb, total_time_ms=avg_ms)
    r.update(extra)
    return r


def write(path, rows, columns=CSV_COLUMNS):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    return str(path)


def table_lines(stdout):
    """The printed table's configuration rows (those starting with a size and a batch)."""
    return [line for line in stdout.splitlines() if line.split()[:2] and all(t.isdigit() for t in line.split()[:2])]


@pytest.mark.parametrize("time_48_ms, words", [(15.0, "6.67x faster per sample"), (154.0, "1.54x slower per sample")])
def test_per_sample_wording_follows_the_ratio(tmp_path, time_48_ms, words):
    path = write(tmp_path / "b.csv", [row(32, 1, 100.0), row(48, 1, time_48_ms)])
    proc = cli("bench", "--from-csv", path)
    assert proc.returncode == 0, proc.stderr
    ratio = time_48_ms / 100.0
    factor = max(ratio, 1 / ratio)  # the printed factor is always the larger over the smaller time
    assert f"- 48 is {factor:.2f}x" in proc.stdout and words in proc.stdout
    assert "0.15x" not in proc.stdout


def test_small_inputs_keep_three_significant_digits_of_mpx(tmp_path):
    # 8x8 pixels at 20 samples/s: 1280 px/s = 0.00128 Mpx/s, which two decimals print as 0.00
    path = write(tmp_path / "b.csv", [row(8, 1, 50.0)])
    proc = cli("bench", "--from-csv", path)
    assert proc.returncode == 0, proc.stderr
    mpx = float(read_back(path)[0]["pixels_per_sec"]) / 1e6
    line, = table_lines(proc.stdout)
    assert f"{mpx:.3g}" == "0.00128" and " 0.00128 " in line


CPU_OOM_MODELS = '''
import torch
from torch import nn

MESSAGE = ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to"
           " allocate 85899345920 bytes. Error code 12 (Cannot allocate memory)")


class AllocFailsAtBatch4(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        if x.shape[0] >= 4:
            raise RuntimeError(MESSAGE)
        return self.conv(x)


def make():
    return AllocFailsAtBatch4()
'''


def test_a_cpu_allocation_failure_is_an_oom_row_and_exit_0(tmp_path):
    (tmp_path / "cpu_oom_models.py").write_text(CPU_OOM_MODELS)
    out_csv = tmp_path / "b.csv"
    proc = cli("bench", "--model", "cpu_oom_models:make", "--input-sizes", "8", "--batch-sizes", "1", "4", "8",
               "--device", "cpu", "--csv", str(out_csv), *QUICK, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    rows = read_back(out_csv)
    assert [(r["batch_size"], r["error"]) for r in rows] == [("1", ""), ("4", "OOM"), ("8", "OOM")]
    assert "alloc_cpu" not in out_csv.read_text()


def test_sweeps_appended_to_one_csv_stay_apart(tmp_path, monkeypatch):
    out_csv = tmp_path / "bench.csv"
    first = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "8", "--batch-sizes", "1", "2",
                "--device", "cpu", "--csv", str(out_csv), *QUICK)
    second = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "8", "16", "24", "--batch-sizes",
                 "1", "--device", "cpu", "--csv", str(out_csv), *QUICK)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    rows = read_back(out_csv)
    ids = list(dict.fromkeys(r["sweep_id"] for r in rows))
    assert len(rows) == 5 and len(ids) == 2 and list(rows[0])[-1] == "sweep_id"  # the new column is the last
    assert [r["sweep_id"] for r in rows] == [ids[0]] * 2 + [ids[1]] * 3
    assert f"(sweep {ids[1]})" in second.stderr

    # default: the latest sweep only, its best throughput recomputed from its own rows
    latest = cli("bench", "--from-csv", str(out_csv))
    assert latest.returncode == 0, latest.stderr
    lines = table_lines(latest.stdout)
    assert [tuple(line.split()[:2]) for line in lines] == [("8", "1"), ("16", "1"), ("24", "1")]
    best = max(rows[2:], key=lambda r: float(r["throughput_samples_per_sec"]))
    assert (f"best throughput: size {best['tile_size']} batch {best['batch_size']}"
            f" ({float(best['throughput_samples_per_sec']):.1f} samples/s)") in latest.stdout
    assert f"sweep {ids[1]}: 3 rows (sweep 2 of 2 in" in latest.stdout
    assert latest.stdout.count("Analysis (") == 1 and "- 16 is" in latest.stdout

    # --sweep all: every row, each saying its sweep; one analysis per sweep
    both = cli("bench", "--from-csv", str(out_csv), "--sweep", "all", "--plot", str(tmp_path / "all.png"))
    assert both.returncode == 0, both.stderr
    lines = [line for line in both.stdout.splitlines() if line.split()[:1] and line.split()[0] in ids]
    assert [line.split()[0] for line in lines] == [r["sweep_id"] for r in rows]
    assert [tuple(line.split()[1:3]) for line in lines] == [(r["tile_size"], r["batch_size"]) for r in rows]
    assert both.stdout.count(f"Analysis (sweep {ids[0]}, ") == 1 and both.stdout.count(f"Analysis (sweep {ids[1]}, ") == 1
    assert (tmp_path / "all.png").stat().st_size > 0

    # --sweep <first id>: the first sweep's two rows
    one = cli("bench", "--from-csv", str(out_csv), "--sweep", ids[0])
    assert one.returncode == 0, one.stderr
    assert [tuple(line.split()[:2]) for line in table_lines(one.stdout)] == [("8", "1"), ("8", "2")]
    bad = cli("bench", "--from-csv", str(out_csv), "--sweep", "nope")
    assert bad.returncode == 2 and "no such sweep" in bad.stderr and ids[1] in bad.stderr

    # the plot of all: one throughput line per sweep and batch size (2 batches in the first, 1 in the second)
    from lightning_perf.bench import analysis, plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig))
    plots.plot_sweep(analysis.read_csv(str(out_csv)), str(tmp_path / "x.png"))
    throughput_axes = figures[0].axes[1]
    assert len(throughput_axes.get_lines()) == 3
    assert sorted(len(line.get_xdata()) for line in throughput_axes.get_lines()) == [1, 1, 3]

    # bench-compare of the one file: the latest sweep against the one before (8/1 is in both)
    cmp = cli("bench-compare", str(out_csv), str(out_csv))
    assert cmp.returncode == 0, cmp.stderr
    assert "| inference | 8 | 2 |" in cmp.stdout and "only in the old sweep" in cmp.stdout
    assert cmp.stdout.count("only in the new sweep") == 2


def test_a_csv_without_sweep_ids_is_read_as_one_legacy_sweep_and_never_appended(tmp_path):
    from lightning_perf.bench.sweep import LEGACY_COLUMNS

    path = write(tmp_path / "old.csv", [row(32, 1, 100.0), row(32, 2, 150.0)], columns=LEGACY_COLUMNS)
    before = (tmp_path / "old.csv").read_text()
    proc = cli("bench", "--from-csv", path)
    assert proc.returncode == 0, proc.stderr
    assert "sweep legacy: 2 rows" in proc.stdout and len(table_lines(proc.stdout)) == 2
    cmp = cli("bench-compare", path, path, "--old-sweep", "legacy")
    assert cmp.returncode == 0 and cmp.stdout.count("| inference | 32 |") == 2
    proc = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "8", "--batch-sizes", "1",
               "--device", "cpu", "--csv", path, *QUICK)
    assert proc.returncode == 2 and "before sweeps had ids" in proc.stderr and "another --csv" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and (tmp_path / "old.csv").read_text() == before


def test_bench_compare_marks_changes_within_noise_and_noisy_rows(tmp_path):
    old = write(tmp_path / "old.csv", [row(32, 1, 100.0, std_ms=2.0), row(32, 2, 100.0, std_ms=1.0),
                                       row(48, 1, 100.0, std_ms=40.0)])
    new = write(tmp_path / "new.csv", [row(32, 1, 97.0, std_ms=3.0), row(32, 2, 50.0, std_ms=1.0),
                                       row(48, 1, 16.0, std_ms=1.0)])
    proc = cli("bench-compare", old, new)
    assert proc.returncode == 0, proc.stderr
    printed = {tuple(line.split("|")[2:4]): line for line in proc.stdout.splitlines() if line.startswith("| inference")}
    olds, news = read_back(old), read_back(new)
    for a, b in zip(olds, news):
        change = 100 * (float(b["throughput_samples_per_sec"]) / float(a["throughput_samples_per_sec"]) - 1)
        noise = 2 * 100 * max(float(r["std_time_ms"]) / float(r["avg_time_ms"]) for r in (a, b))
        line = printed[(f" {a['tile_size']} ", f" {a['batch_size']} ")]
        assert f"| ±{noise:.1f}% |" in line
        if abs(change) < noise:
            assert f"| within noise ({change:+.1f}%) |" in line
        else:
            assert f"| {change:+.1f}% |" in line
        spread = 100 * float(a["std_time_ms"]) / float(a["avg_time_ms"])
        assert ("old noisy (std 40% of mean)" in line) == (spread > 25)
    # the cases the rows were built for: +3.1% inside ±6%, +100% outside ±4%, a noisy old row's +525% outside ±80%
    assert "within noise (+3.1%)" in printed[(" 32 ", " 1 ")] and "| +100.0% |" in printed[(" 32 ", " 2 ")]
    assert "| +525.0% |" in printed[(" 48 ", " 1 ")]
    rows = cli("bench-compare", old, new, "--format", "csv").stdout
    assert rows.splitlines()[0].count("within_noise") == 1 and "True" in rows and "False" in rows

    table = cli("bench", "--from-csv", old)
    assert table.returncode == 0, table.stderr
    flagged = [line.split()[:2] for line in table_lines(table.stdout) if "noisy (std 40% of mean)" in line]
    assert flagged == [["48", "1"]]


FACTORIES = '''
def text():
    return "a string"


def number():
    return 3


def nothing():
    return None


def raises():
    raise TypeError("needs a config path")
'''


@pytest.mark.parametrize("factory, said", [
    ("text", "the factory returned a str, not a torch.nn.Module"),
    ("number", "the factory returned an int, not a torch.nn.Module"),
    ("nothing", "the factory returned None, not a torch.nn.Module"),
    ("raises", "the factory raised TypeError: needs a config path"),
])
def test_a_factory_that_cannot_build_a_model_writes_nothing(tmp_path, factory, said):
    """Exit 2 with one clean line, the progress bar on: no CSV (not even its header), no folder for it, no bar."""
    (tmp_path / "factories.py").write_text(FACTORIES)
    proc = cli("bench", "--model", f"factories:{factory}", "--input-sizes", "8", "--batch-sizes", "1", "2",
               "--device", "cpu", "--csv", "runs/new.csv", "--warmup", "1", "--iters", "2", cwd=str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr == f"lightning-perf: error: --model 'factories:{factory}': {said}\n"
    assert not (tmp_path / "runs").exists() and proc.stdout == ""
    existing = write(tmp_path / "kept.csv", [row(8, 1, 10.0, sweep_id="s1")])  # an existing CSV: untouched
    before = (tmp_path / "kept.csv").read_text()
    proc = cli("bench", "--model", f"factories:{factory}", "--input-sizes", "8", "--batch-sizes", "1",
               "--device", "cpu", "--csv", existing, *QUICK, cwd=str(tmp_path))
    assert proc.returncode == 2 and (tmp_path / "kept.csv").read_text() == before


def test_bench_options_and_files_are_named_as_typed(tmp_path):
    proc = cli("bench", "--model", "bench_models:small_conv", "--warmup", "-5", "--no-csv")
    assert proc.returncode == 2
    assert proc.stderr == "lightning-perf bench: error: argument --warmup: expected an integer >= 0, got '-5'\n"
    good = write(tmp_path / "good.csv", [row(8, 1, 10.0, sweep_id="s1")])
    missing = str(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("")
    for args, said in (
        (["bench", "--from-csv", missing], f"--from-csv {missing!r}: no such file"),
        (["bench", "--from-csv", str(tmp_path)], f"--from-csv {str(tmp_path)!r} is a directory; expected a bench CSV"
                                                 " file"),
        (["bench", "--from-csv", str(tmp_path / "empty.csv")],
         f"--from-csv {str(tmp_path / 'empty.csv')!r}: the file is empty; expected a CSV written by lightning-perf"
         " bench"),
        (["bench-compare", missing, good], f"OLD {missing!r}: no such file"),
        (["bench-compare", good, missing], f"NEW {missing!r}: no such file"),
    ):
        proc = cli(*args)
        assert (proc.returncode, proc.stderr) == (2, f"lightning-perf: error: {said}\n"), args


def test_the_sweep_function_names_its_bad_iteration_counts():
    from bench_models import small_conv

    from lightning_perf.bench.sweep import BenchError, run_sweep

    with pytest.raises(BenchError, match=r"^warmup must be an integer >= 0, got -5$"):
        run_sweep(small_conv, [8], [1], warmup=-5, progress=False)
    with pytest.raises(BenchError, match=r"^iters must be an integer >= 1, got 0$"):
        run_sweep(small_conv, [8], [1], iters=0, progress=False)


@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "buffered"])
def test_bench_compare_into_a_closed_pipe_ends_quietly(tmp_path, unbuffered):
    old = write(tmp_path / "old.csv", [row(32, 1, 100.0), row(32, 2, 100.0)])
    new = write(tmp_path / "new.csv", [row(32, 1, 90.0), row(32, 2, 50.0)])
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    for args in (["bench-compare", old, new], ["bench", "--from-csv", old]):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader went before the first line (`| head -1` once it has its line)
        try:
            proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], stdout=write_end,
                                  stderr=subprocess.PIPE, text=True, timeout=120, env=env)
        finally:
            os.close(write_end)
        assert (proc.returncode, proc.stderr) == (141, ""), (args, proc.stderr)
