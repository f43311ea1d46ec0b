"""compare shows SectionProfiler's breakdown side by side, so a speed-up is traced to the section that moved.

Two real fits on the virtual clock: a user section ``render`` costs 6 ms in the base and 2 ms in the candidate, the
rest of ``training_step`` 3 ms in both. The CLI's section table is recomputed from the two summaries' section
blocks and checked against the injected costs."""

import json
import subprocess
import sys

import pytest

from helpers import TinyModel, fit, use_virtual_clock
from lightning_perf import IterationTimer, SectionProfiler, profile_section


class Rendering(TinyModel):
    def __init__(self, clock, render_ms):
        super().__init__()
        self.clock, self.render_ms = clock, render_ms

    def training_step(self, batch, batch_idx):
        self.clock.advance(0.003)
        with profile_section("render"):
            self.clock.advance(self.render_ms / 1000.0)
        return super().training_step(batch, batch_idx)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sections")
    paths = {}
    with pytest.MonkeyPatch.context() as mp:
        clock = use_virtual_clock(mp)
        for name, render_ms in (("base", 6.0), ("fast_render", 2.0)):
            path = str(root / name / "perf_summary.json")
            fit(root / name, [IterationTimer(warmup_steps=2, summary_path=path),
                              SectionProfiler(warmup_steps=2, summary_path=path)],
                model=Rendering(clock, render_ms), max_epochs=2, limit_val_batches=0)
            paths[name] = path
    return paths


def cli(*args):
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "compare", *args], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_section_table_is_the_two_summaries_section_blocks_side_by_side(runs):
    result = json.loads(cli(runs["base"], runs["fast_render"], "--format", "json"))
    sections = result["sections"]
    blocks = []
    for key in ("base", "fast_render"):
        with open(runs[key]) as fh:
            blocks.append(json.load(fh)["section_profiler"])
    names = list(blocks[0]["sections"]) + [n for n in blocks[1]["sections"] if n not in blocks[0]["sections"]]
    assert [r["name"] for r in sections["rows"]] == names
    for row in sections["rows"]:
        per_iter = [1000.0 * b["sections"][row["name"]]["total_s"] / b["iterations"] for b in blocks]
        assert row["base_ms_per_iter"] == pytest.approx(per_iter[0], rel=1e-9)
        assert row["candidate_ms_per_iter"] == pytest.approx(per_iter[1], rel=1e-9)
        assert row["base_share_pct"] == blocks[0]["sections"][row["name"]]["share_pct"]
        assert row["candidate_share_pct"] == blocks[1]["sections"][row["name"]]["share_pct"]
        assert row["delta_ms"] == pytest.approx(per_iter[1] - per_iter[0], abs=1e-9)
    render = next(r for r in sections["rows"] if r["name"] == "render")
    assert render["base_ms_per_iter"] == pytest.approx(6.0) and render["candidate_ms_per_iter"] == pytest.approx(2.0)
    assert render["delta_pct"] == pytest.approx(-100.0 * 4 / 6)
    assert render["base_share_pct"] == pytest.approx(100.0 * 6 / 9)  # 6 of the 9 ms the iteration costs
    assert sections["moved_most"] == "render"
    assert sections["iteration_delta_ms"] == pytest.approx(-4.0)
    assert result["speedup"] == pytest.approx(9.0 / 5.0, rel=1e-6)


def again(tmp_path, path, name):
    """A second run of ``path``'s setup (its copy, started later): each side with repeats decides the verdict."""
    with open(path) as fh:
        data = json.load(fh)
    data["run"]["started_at"] = "2026-01-01T00:01:00+00:00"
    out = tmp_path / name / "perf_summary.json"
    out.parent.mkdir(parents=True)
    out.write_text(json.dumps(data))
    return str(out)


def test_text_and_markdown_show_the_breakdown_and_the_section_that_moved(runs, tmp_path):
    repeats = ["--base-repeats", again(tmp_path, runs["base"], "base2"), "--candidate-repeats",
               again(tmp_path, runs["fast_render"], "fast_render2"), "--names", "base", "fast_render"]
    text = cli(runs["base"], runs["fast_render"], *repeats)
    block = text[text.index("Sections (SectionProfiler"):]
    assert "  Moved most: render, -4.00 ms/iter (-66.7%); the whole iteration -4.00 ms" in block
    line = next(x for x in block.splitlines() if x.strip().startswith("render"))
    assert line.split()[1:] == ["6.00", "(66.7%)", "2.00", "(40.0%)", "-4.00", "ms", "(-66.7%)"]
    md = cli(runs["base"], runs["fast_render"], "--format", "markdown", *repeats)
    assert "| section | base ms/iter | base share | fast_render ms/iter | fast_render share |" in md
    assert "| render | 6.00 | 66.7% | 2.00 | 40.0% | -4.00 | -66.7% |" in md
    assert "**Moved most:** render, -4.00 ms/iter (-66.7%)" in md
    # one run a side: the speed is not decided, and neither is the section behind it (issue 59)
    text = cli(runs["base"], runs["fast_render"])
    block = text[text.index("Sections (SectionProfiler"):]
    assert "  Moved most: not decided: the speed verdict decides no direction (past their noise within these" \
           " runs: render)" in block
    line = next(x for x in block.splitlines() if x.strip().startswith("render"))
    assert line.split()[1:] == ["6.00", "(66.7%)", "2.00", "(40.0%)", "-4.00", "ms", "(-66.7%,", "not", "decided)"]


def test_a_run_against_itself_names_no_section_that_moved(runs):
    """Nothing moved: no section is named for a change of +0.00 ms."""
    result = json.loads(cli(runs["base"], runs["base"], "--format", "json"))
    assert result["sections"]["moved_most"] is None
    assert all(row["delta_ms"] == 0 and not row["beyond_noise"] for row in result["sections"]["rows"])
    text = cli(runs["base"], runs["base"])
    assert "  Moved most: no section past its noise" in text and "+0.00 ms" not in text


def test_a_change_that_prints_as_zero_is_no_move(runs, tmp_path):
    """A section 0.001 ms or 0.01 ms slower per iteration is within its noise (2% of its 6 ms at least) and not
    named; 1 ms is."""
    from lightning_perf.summary.compare import compare_summaries

    with open(runs["base"]) as fh:
        base = json.load(fh)
    iterations = base["section_profiler"]["iterations"]
    for extra_ms, named in ((0.001, False), (0.01, False), (1.0, True)):
        cand = json.loads(json.dumps(base))
        cand["section_profiler"]["sections"]["render"]["total_s"] += extra_ms * iterations / 1000.0
        moved = compare_summaries(base, cand)["sections"]["moved_most"]
        assert moved == ("render" if named else None), (extra_ms, moved)


def test_no_section_table_where_a_run_has_no_profiler(runs, tmp_path):
    with open(runs["base"]) as fh:
        data = json.load(fh)
    del data["section_profiler"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(data))
    result = json.loads(cli(str(bare), runs["fast_render"], "--format", "json"))
    assert result["sections"] is None
    assert "Sections (SectionProfiler" not in cli(str(bare), runs["fast_render"])
