"""`lightning-perf bench`'s frontier line, trade-off list and seed 003's verdict sentences, each checked against figures
recomputed here from the raw CSV the test writes (a second frontier algorithm, the ratios by hand), and the sentences
that must stay unsaid where the rows do not decide them."""

import csv

import pytest

from test_bench_sweeps import cli, row, write


def read_back(path):
    """The CSV's successful rows as numbers, keyed by (size, batch)."""
    with open(path, newline="") as fh:
        out = {}
        for r in csv.DictReader(fh):
            if r["error"]:
                continue
            out[(int(r["tile_size"]), int(r["batch_size"]))] = {
                k: float(r[k]) for k in ("avg_time_ms", "std_time_ms", "throughput_samples_per_sec", "pixels_per_sec",
                                         "memory_peak_mb")}
        return out


def pareto(cells):
    """The frontier by a sweep: most pixels/s first within equal memory, least memory first; a configuration is on
    it when it has more pixels/s than every one with less memory (the values below are all distinct)."""
    best, on = float("-inf"), []
    for key, r in sorted(cells.items(), key=lambda kv: (kv[1]["memory_peak_mb"], -kv[1]["pixels_per_sec"])):
        if r["pixels_per_sec"] > best:
            on.append(key)
            best = r["pixels_per_sec"]
    return on


def name(key):
    return f"{key[0]}/b{key[1]}"


def pct(new, old):
    return 100.0 * (new / old - 1.0)


def oom(size, batch):
    r = row(size, batch, 1.0)
    for k in ("avg_time_ms", "std_time_ms", "throughput_samples_per_sec", "pixels_per_sec", "memory_peak_mb",
              "efficiency_pixels_per_sec_per_mb", "total_time_ms"):
        r[k] = ""
    r["error"] = "OOM"
    return r


# seed 003's shape: the larger input processes more pixels per second at every batch, gains less from batching, and
# runs out of memory at batch 8; 48/b2 is beaten by 32/b4 (more pixels/s for less memory), so it is off the frontier
# (on CUDA, as seed 003 ran: allocator peaks, whose noise floor is 2 MiB; an RSS rise of 10 to 75 MiB on CPU is noise)
SEED_LIKE = [dict(r, device="cuda") for r in (
    row(32, 1, 10.0, peak_mb=10), row(32, 2, 14.0, peak_mb=18), row(32, 4, 22.0, peak_mb=34),
    row(32, 8, 42.0, peak_mb=66), row(48, 1, 15.4, peak_mb=22), row(48, 2, 25.0, peak_mb=40),
    row(48, 4, 45.0, peak_mb=75), oom(48, 8))]


def test_frontier_trade_offs_and_verdicts_recomputed_from_the_csv(tmp_path, monkeypatch):
    path = write(tmp_path / "b.csv", SEED_LIKE)
    proc = cli("bench", "--from-csv", path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    cells = read_back(path)
    on = pareto(cells)
    assert ("least memory first: " + ", ".join(name(k) for k in on) + "\n") in out
    assert "48/b2" not in out.split("least memory first: ")[1].splitlines()[0] and len(on) == 6

    # the trade-off list: each step's pixels/s gain and memory cost, from the CSV's columns
    first, last = cells[on[0]], cells[on[-1]]
    assert f"- {name(on[0])}: the least peak memory ({first['memory_peak_mb']:.0f} MiB)," in out
    assert f"- {name(on[-1])}: the most pixels/s ({last['pixels_per_sec'] / 1e6:.3f} Mpx/s)," in out
    for a, b in zip(on, on[1:]):
        ra, rb = cells[a], cells[b]
        line = next(line for line in out.splitlines() if line.startswith(f"- {name(a)} -> {name(b)}: "))
        assert f"{pct(rb['pixels_per_sec'], ra['pixels_per_sec']):+.0f}% pixels/s" in line
        assert f"({ra['pixels_per_sec'] / 1e6:.3f} -> {rb['pixels_per_sec'] / 1e6:.3f} Mpx/s)" in line
        assert f"for {pct(rb['memory_peak_mb'], ra['memory_peak_mb']):+.0f}% peak memory" in line
        assert "within noise" not in line  # no spread in these rows: every step counts

    # "384 more efficient": 48's pixels/s over 32's at each batch both ran (not 8: 48 ran out of memory)
    gains = ", ".join(f"{pct(cells[(48, b)]['pixels_per_sec'], cells[(32, b)]['pixels_per_sec']):+.0f}% at batch {b}"
                      for b in (1, 2, 4))
    assert (f"- 48 is more efficient per pixel than 32: more pixels per second at every batch size both ran ({gains})."
            in out)
    # "larger tiles benefit less from batching": batch 1 -> 4, the largest batch both sizes ran
    batching = [pct(cells[(s, 4)]["throughput_samples_per_sec"], cells[(s, 1)]["throughput_samples_per_sec"])
                for s in (32, 48)]
    assert batching[1] < batching[0]
    assert (f"- Larger inputs benefit less from batching: samples/s from batch 1 to 4: {batching[0]:+.0f}% at 32,"
            f" {batching[1]:+.0f}% at 48." in out)
    assert "no verdict" not in out and "Noisy rows" not in out

    # the plot's frontier is one line through the same configurations, in the same order
    pytest.importorskip("matplotlib")
    from lightning_perf.bench import analysis, plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig))
    plots.plot_sweep(analysis.read_csv(path), str(tmp_path / "x.png"))
    line, = figures[0].axes[3].get_lines()
    assert line.get_label() == "frontier"
    assert list(line.get_xdata()) == [cells[k]["memory_peak_mb"] for k in on]
    assert list(line.get_ydata()) == pytest.approx([cells[k]["pixels_per_sec"] / 1e6 for k in on], rel=1e-12)


def _undecided(tmp_path, rows):
    path = write(tmp_path / "b.csv", rows)
    proc = cli("bench", "--from-csv", path)
    assert proc.returncode == 0, proc.stderr
    for said in ("is more efficient per pixel", "benefit less from batching", "benefit more from batching"):
        assert said not in proc.stdout, said
    return proc.stdout, read_back(path)


def test_no_verdict_where_the_batch_sizes_disagree(tmp_path):
    # 48 processes more pixels per second than 32 at batch 1 and fewer at batch 4; 32 gains from batching, 48 loses,
    # and 64 loses less: the batching gain neither falls nor rises with size (64 against 32 disagrees too)
    out, cells = _undecided(tmp_path, [row(32, 1, 10.0, peak_mb=10), row(32, 4, 20.0, peak_mb=30),
                                       row(48, 1, 15.0, peak_mb=20), row(48, 4, 100.0, peak_mb=60),
                                       row(64, 1, 30.0, peak_mb=40), row(64, 4, 150.0, peak_mb=120)])
    px = {b: pct(cells[(48, b)]["pixels_per_sec"], cells[(32, b)]["pixels_per_sec"]) for b in (1, 4)}
    assert px[1] > 0 > px[4]
    assert (f"- 48 against 32 per pixel: no verdict (the batch sizes disagree): pixels/s {px[1]:+.0f}% at batch 1,"
            f" {px[4]:+.0f}% at batch 4." in out)
    gains = [pct(cells[(s, 4)]["throughput_samples_per_sec"], cells[(s, 1)]["throughput_samples_per_sec"])
             for s in (32, 48, 64)]
    assert gains[0] > gains[1] < gains[2]
    assert (f"samples/s from batch 1 to 4: {gains[0]:+.0f}% at 32, {gains[1]:+.0f}% at 48, {gains[2]:+.0f}% at 64;"
            " no verdict on input size: the gain neither falls nor rises steadily with size." in out)


def test_no_verdict_within_noise_and_noisy_rows_named(tmp_path):
    # every row's std is 10% of its mean (noise 2 x 10% = 20%), one row's 30% (noise 60%): 48's +10% and +4% more
    # pixels per second and the batching gains' 6% difference are inside it
    rows = [dict(r, device="cuda") for r in (  # allocator peaks: 10 to 60 MiB apart is beyond their floor
        row(32, 1, 10.0, std_ms=1.0, peak_mb=10), row(32, 4, 4 / 1.8 * 10, std_ms=4 / 1.8, peak_mb=30),
        row(48, 1, 10.0 * 2.25 / 1.1, std_ms=2.25 / 1.1 * 3, peak_mb=20),
        row(48, 4, 4 / 1.7 * 10 * 2.25 / 1.1, std_ms=4 / 1.7 * 2.25 / 1.1, peak_mb=60))]
    out, cells = _undecided(tmp_path, rows)
    spread = {k: 100 * r["std_time_ms"] / r["avg_time_ms"] for k, r in cells.items()}
    assert spread[(48, 1)] == pytest.approx(30) and spread[(32, 1)] == pytest.approx(10)
    px = {b: pct(cells[(48, b)]["pixels_per_sec"], cells[(32, b)]["pixels_per_sec"]) for b in (1, 4)}
    noise = {b: 2 * max(spread[(48, b)], spread[(32, b)]) for b in (1, 4)}
    assert all(abs(px[b]) < noise[b] for b in (1, 4))
    assert ("- 48 against 32 per pixel: no verdict (not beyond the noise at every batch size): pixels/s"
            f" {px[1]:+.0f}% at batch 1 (within noise, ±{noise[1]:.0f}%), {px[4]:+.0f}% at batch 4 (within noise,"
            f" ±{noise[4]:.0f}%)." in out)
    gains = [cells[(s, 4)]["throughput_samples_per_sec"] / cells[(s, 1)]["throughput_samples_per_sec"]
             for s in (32, 48)]
    assert abs(pct(gains[1], gains[0])) < 2 * max(spread.values())
    assert (f"no verdict on input size: the gains differ by less than the noise (±{2 * max(spread.values()):.0f}%)."
            in out)
    assert "- Noisy rows: 48/b1 (std 30% of mean); their spread counts as noise above" in out
    # the frontier still says which of its configurations are noisy, and which step is inside the noise
    frontier = out.split("least memory first: ")[1].splitlines()[0]
    assert "48/b1 (noisy)" in frontier
    step = next(line for line in out.splitlines() if line.startswith("- 32/b1 -> 48/b1: "))
    assert f", within noise (±{2 * spread[(48, 1)]:.0f}%)," in step


def test_one_configuration_beating_all_is_the_whole_frontier(tmp_path):
    # 48 at batch 1 has fewer pixels per second than 32 and more memory: 32 wins on both, at the one batch size
    path = write(tmp_path / "b.csv", [row(32, 1, 10.0, peak_mb=10), row(48, 1, 30.0, peak_mb=25)])
    proc = cli("bench", "--from-csv", path)
    assert proc.returncode == 0, proc.stderr
    cells = read_back(path)
    assert pareto(cells) == [(32, 1)]
    assert "least memory first: 32/b1\n" in proc.stdout
    assert "Trade-offs: none; 32/b1 has the most pixels/s" in proc.stdout
    px = pct(cells[(48, 1)]["pixels_per_sec"], cells[(32, 1)]["pixels_per_sec"])
    assert (f"- 32 is more efficient per pixel than 48: 48 processes fewer pixels per second at every batch size both"
            f" ran ({px:+.0f}% at batch 1)." in proc.stdout)
    assert "batching" not in proc.stdout  # one batch size: nothing to say about batching
