"""One voice: every line of `compare` and `report` (text, markdown, CSV, JSON, HTML) says what the speed verdict
decides, and no more.

A/A: real summaries of one configuration run twice, and synthetic copies of them with noise on every figure, must
give no line that claims a change (a claim word) unless the line says it is within noise or not decided. A known
change (a step 30% longer, three runs a side) must be claimed, with its sign, in every view. The fits are timed on a
:class:`helpers.VirtualClock` (each step costs what the model spends, with a seeded 2% jitter): on a shared machine two
real-clock runs of one setup differ by more than an A/A test could hold.
"""

from __future__ import annotations

import copy
import csv
import html
import io
import json
import random
import re

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import TinyModel, claims, fit, use_virtual_clock
from lightning_perf import IterationTimer, SectionProfiler, VRAMMonitor
from lightning_perf.cli import main
from lightning_perf.summary.compare import compare_summaries, format_markdown, format_text
from lightning_perf.summary.comparison import Comparison
from lightning_perf.summary.html_report import compare_html, report_html
from lightning_perf.summary.report import format_report, report_rows

#: Words that claim a difference. A line holding one must say it is within noise or not decided, unless the pair
class PacedModel(TinyModel):
    """Each training step costs ``step_s`` of the virtual clock, with a seeded 2% jitter."""

    def __init__(self, clock, step_s=0.010, batch_size=8, seed=0):
        super().__init__()
        self.clock, self.step_s, self.batch_size = clock, step_s, batch_size
        self.jitter = random.Random(seed)

    def training_step(self, batch, batch_idx):
        self.clock.advance(self.step_s * (1.0 + 0.02 * self.jitter.uniform(-1.0, 1.0)))
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(256, 16, generator=g)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=self.batch_size)


def _run(root, name, clock, **model):
    path = root / name / "perf_summary.json"
    fit(root / name, [IterationTimer(warmup_steps=2, summary_path=str(path)),
                      SectionProfiler(warmup_steps=2, print_reports=False), VRAMMonitor(nvml_interval_s=0.05)],
        model=PacedModel(clock, **model), max_epochs=None, max_steps=60, limit_val_batches=0, num_sanity_val_steps=0)
    with open(path) as fh:
        return json.load(fh), str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``aa``: one setup run twice; ``slow``: three runs of 10 ms steps and three of 13 ms (a sleep worth 30% of the
    step); ``batch``: two runs at batch 32 of 39.268 ms and two at batch 16 of 30 ms (faster per iteration, 1.53x
    slower per sample: the case of issue 59)."""
    root = tmp_path_factory.mktemp("one_voice")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        clock = use_virtual_clock(mp)
        out["aa"] = [_run(root, f"aa{i}", clock, seed=i) for i in range(2)]
        out["fast"] = [_run(root, f"fast{i}", clock, seed=10 + i) for i in range(3)]
        out["slow"] = [_run(root, f"slow{i}", clock, step_s=0.013, seed=20 + i) for i in range(3)]
        out["b32"] = [_run(root, f"b32_{i}", clock, step_s=0.039268, batch_size=32, seed=30 + i) for i in range(2)]
        out["b16"] = [_run(root, f"b16_{i}", clock, step_s=0.030, batch_size=16, seed=40 + i) for i in range(2)]
    return out


#: Keys whose figures are identities or counts, left as they are by :func:`noisy`.
_KEEP = {"schema_version", "block_len", "max_blocks", "open_count", "bin_keys", "fits", "world_size"}


def noisy(summary, seed, scale=0.01):
    """A copy of ``summary`` with every float figure moved by a seeded factor within +-``scale`` (1%: half the
    smallest effect a verdict may call)."""
    rng = random.Random(seed)

    def walk(value, key="", path=""):
        if key in _KEEP:
            return value
        if isinstance(value, dict):
            return {k: walk(v, k, f"{path}.{k}") for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, key, path) for v in value]
        if isinstance(value, float):
            moved = value * (1.0 + scale * rng.uniform(-1.0, 1.0))
            return min(moved, 100.0) if "pct" in path and value <= 100.0 else moved  # a share stays a share
        return value

    out = walk(copy.deepcopy(summary))
    out["run"]["started_at"] = f"2026-01-01T00:00:{seed % 60:02d}+00:00"
    return out


def html_lines(page):
    """The page's text, one line per block or table cell row: tags dropped, entities read."""
    text = re.sub(r"<(br|/p|/tr|/h\d|/li|/pre|/text|svg[^>]*)>", "\n", page)
    text = re.sub(r"<[^>]+>", " ", text)
    return [line.strip() for line in html.unescape(text).splitlines() if line.strip()]


def views(bases, candidates, names=("base", "candidate")):
    """Every view of compare (text, markdown, HTML) and report (markdown, CSV, HTML) of the first runs, with the
    rest as repeats: name -> list of lines."""
    result = compare_summaries(bases[0], candidates[0], base_repeats=bases[1:], candidate_repeats=candidates[1:],
                               base_name=names[0], candidate_name=names[1])
    rows = report_rows([bases[0], candidates[0]], list(names))
    return result, {
        "compare text": format_text(result).splitlines(),
        "compare markdown": format_markdown(result).splitlines(),
        "compare html": html_lines(compare_html(bases[0], candidates[0], result)),
        "report markdown": format_report(rows, "markdown").splitlines(),
        "report csv": format_report(rows, "csv").splitlines(),
        "report html": html_lines(report_html([bases[0], candidates[0]], list(names))),
    }


@pytest.mark.parametrize("repeats", [1, 3])
@pytest.mark.parametrize("source", ["real", "noisy"])
def test_an_aa_pair_claims_nothing_in_any_view(runs, source, repeats):
    (a, _), (b, _) = runs["aa"]
    if source == "noisy":
        a, b = noisy(a, 1), noisy(a, 2)
    bases = [a] + [noisy(a, 100 + i) for i in range(repeats - 1)]
    candidates = [b] + [noisy(b, 200 + i) for i in range(repeats - 1)]
    result, outputs = views(bases, candidates)
    assert result["comparison"]["decided"] is False and result["comparison"]["direction"] is None
    for view, lines in outputs.items():
        assert claims(lines) == [], f"{view} claims a change of an A/A pair"
    text = "\n".join(outputs["compare text"])
    assert "Speed ratio:" in text and "Time change:" in text and "Typical:" in text
    assert "Break-even:" in text and "not decided" in text.split("Break-even:")[1].splitlines()[0]


def _assert_slower_everywhere(result, outputs):
    assert result["comparison"]["decided"] and result["comparison"]["direction"] == "slower"
    text = "\n".join(outputs["compare text"])
    line = {label: next(l for l in outputs["compare text"] if l.strip().startswith(label))
            for label in ("Slowdown:", "Typical:", "Time lost:", "Break-even:")}
    assert "x slower" in line["Slowdown:"] and "significant" in line["Slowdown:"]
    assert "x slower" in line["Typical:"] and "faster" not in line["Typical:"]
    assert "longer" in line["Time lost:"] and "not decided" not in text
    assert "not faster" in line["Break-even:"] or "slower" in line["Break-even:"]
    md = "\n".join(outputs["compare markdown"])
    assert "**Slowdown:**" in md and "**Time lost:**" in md and "x slower" in md
    assert any("Slowdown:" in l and "x slower" in l for l in outputs["compare html"])
    change = next(l for l in outputs["report markdown"] if l.startswith("| candidate"))
    assert re.search(r"\| -\d+\.\d%", change) and "within noise" not in change
    row = list(csv.DictReader(io.StringIO("\n".join(outputs["report csv"]))))[1]
    assert float(row["change_pct"]) < 0 and row["change_beyond_noise"] == "True"


def test_a_known_change_is_claimed_with_its_sign_in_every_view(runs):
    fast, slow = [s for s, _ in runs["fast"]], [s for s, _ in runs["slow"]]
    result, outputs = views(fast, slow)
    _assert_slower_everywhere(result, outputs)
    assert result["speedup"] == pytest.approx(10 / 13, rel=0.03)
    # one run a side: the same change, not decided between runs, and said so in every derived line
    one, one_outputs = views(fast[:1], slow[:1])
    assert one["comparison"]["decided"] is False
    assert claims(one_outputs["compare text"]) == [] and claims(one_outputs["compare markdown"]) == []
    time_line = next(l for l in one_outputs["compare text"] if l.strip().startswith("Time change:"))
    assert "lost" in time_line and "saved" not in time_line and "not decided" in time_line


def test_the_cli_says_the_known_change_with_repeats(runs, capsys):
    paths = {k: [p for _, p in runs[k]] for k in ("fast", "slow")}
    code = main(["compare", paths["fast"][0], paths["slow"][0], "--base-repeats", *paths["fast"][1:],
                 "--candidate-repeats", *paths["slow"][1:], "--names", "fast", "slow"])
    out = capsys.readouterr().out
    assert code == 0 and "Slowdown:" in out and "Time lost:" in out and "slow takes" in out


def test_batch_sizes_that_differ_give_every_line_per_sample(runs):
    """Batch 32 at 39.268 ms against batch 16 at 30 ms: per iteration the candidate is faster (1.31x), per sample it
    is 1.53x slower; every derived line says per sample, slower, and agrees with the headline."""
    b32, b16 = [s for s, _ in runs["b32"]], [s for s, _ in runs["b16"]]
    result, outputs = views(b32, b16, ("b32", "b16"))
    assert result["speedup_basis"] == "samples/s" and result["comparison"]["unit"] == "per sample"
    assert result["speedup"] == pytest.approx((16 / 30) / (32 / 39.268), rel=0.03)
    assert result["comparison"]["direction"] == "slower"
    lines = {label: next(l for l in outputs["compare text"] if l.strip().startswith(label))
             for label in ("Slowdown:", "Typical:", "Time lost:", "Break-even:")}
    assert "1.53x slower" in lines["Slowdown:"]
    assert re.search(r"1\.5\dx slower per sample in the median iteration", lines["Typical:"])
    assert "same samples" in lines["Time lost:"]
    assert "per sample" in lines["Break-even:"] and "per iteration" not in lines["Break-even:"]
    # the like-for-like time: b16's 30000 iterations against b32's 15000, warm-up aside
    assert result["time_saved_s"] == pytest.approx(15000 * 0.039268 - 30000 * 0.030, rel=0.05)
    # the HTML page's speed bars are in samples/s: the slower-per-sample run has the shorter bar
    page = report_html([b32[0], b16[0]], ["b32", "b16"])
    bars = re.search(r'<svg id="speed-bars".*?</svg>', page).group(0)
    widths = [float(w) for w in re.findall(r'<rect x="\d+" y="[\d.]+" width="([\d.]+)"', bars)]
    assert "Speed (samples/s)" in page and widths[0] > widths[1]


def test_memory_below_its_floor_is_the_same_and_labelled_mib(runs):
    (a, _), (b, _) = runs["aa"]
    a, b = copy.deepcopy(a), copy.deepcopy(b)
    a["vram"]["phases"]["train"]["host_rss_peak_mb"] = 1347.0
    b["vram"]["phases"]["train"]["host_rss_peak_mb"] = 1185.0  # -162 MiB, -12%: what two runs of one GAN read
    result = compare_summaries(a, b)
    entry = result["memory_mb"]["train peak host RSS"]
    assert entry["beyond_floor"] is False and entry["floor_from"] == "documented"
    line = next(l for l in format_text(result).splitlines() if "train peak host RSS" in l)
    assert "same within the noise floor" in line and "MiB" in line and " MB" not in line
    b["vram"]["phases"]["train"]["host_rss_peak_mb"] = 2700.0  # twice the memory: past any floor
    line = next(l for l in format_text(compare_summaries(a, b)).splitlines() if "train peak host RSS" in l)
    assert "+1353 MiB" in line and "within" not in line
    # with repeats, the floor is the spread of the runs of a side
    reps_a = [noisy(a, 7, scale=0.0)] + [copy.deepcopy(a) for _ in range(2)]
    for i, rss in enumerate((1347.0, 1400.0, 1300.0)):
        reps_a[i]["vram"]["phases"]["train"]["host_rss_peak_mb"] = rss
    reps_b = [copy.deepcopy(b) for _ in range(3)]
    for i, rss in enumerate((1390.0, 1360.0, 1330.0)):
        reps_b[i]["vram"]["phases"]["train"]["host_rss_peak_mb"] = rss
    for i, r in enumerate(reps_b):
        r["run"]["started_at"] = f"2026-01-02T00:00:0{i}+00:00"
    result = compare_summaries(reps_a[0], reps_b[0], base_repeats=reps_a[1:], candidate_repeats=reps_b[1:])
    entry = result["memory_mb"]["train peak host RSS"]
    assert entry["floor_from"] == "repeats" and entry["floor_mb"] == pytest.approx(100.0)
    assert entry["beyond_floor"] is False


def test_a_gate_on_different_validation_sets_is_not_checked(runs):
    (a, _), (b, _) = runs["aa"]
    a, b = copy.deepcopy(a), copy.deepcopy(b)
    for summary, images in ((a, 32), (b, 16)):
        summary["quality_gate"] = {"passed": True, "images_scored": images, "baseline_images": 32,
                                   "metrics": {"psnr": {"value": 30.0, "mode": "max", "passed": True}}}
    result = compare_summaries(a, b)
    line = next(l for l in format_text(result).splitlines() if l.strip().startswith("psnr"))
    assert "not checked" in line and "different validation sets" in line and "passed" not in line
    assert "not checked" in format_markdown(result)


def test_the_comparison_decides_once():
    undecided = Comparison(speedup=1.03, ci95=(0.96, 1.10), decided=False)
    assert undecided.direction is None and "not decided" in undecided.typical_text(1.05)
    result = {"time_saved_s": 24.3, "time_saved_pct": 3.2, "steady_time_s": {"base": 750.0, "candidate": 726.0},
              "candidate": {"name": "c"}}
    label, text = undecided.time_saved(result)
    assert label == "Time change" and text.startswith("between") and "saved" in text and "lost" in text
    assert "not decided" in text
    decided = Comparison(speedup=0.5, ci95=(0.45, 0.55), decided=True, basis="samples/s")
    assert decided.direction == "slower" and decided.unit == "per sample"
    assert decided.typical_text(0.5) == ("2.00x slower per sample in the median iteration (stalls and slow steps"
                                         " left out)")
    assert "does not follow the verdict" in decided.typical_text(1.2)
