"""The straggler of a DDP run named in the diagnosis: the rank whose own section the others wait for (issue 60, part
4). Real 4-rank fits on CPU (gloo) with one rank's batches slowed by a known sleep, an A/A set of ranks, a single
device; the rule itself on closed-form per-rank figures; compare and report read from the real command."""

from __future__ import annotations

import json
import statistics
import time

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data._utils.collate import default_collate

from helpers import TinyModel, find_summary, fit
from lightning_perf import IterationTimer, SectionProfiler
from lightning_perf.cli import main
from lightning_perf.summary.diagnosis import diagnose, diagnosis_line
from lightning_perf.summary.straggler import STRAGGLER_LAG_PCT, straggler

RANKS = 4
SLOW_RANK = 3
SLEEP_S = 0.040  # rank 3's extra wait for each batch
STEPS = 30  # a rank's batches in the one epoch


class SleepOnRank:
    """A collate function that sleeps ``seconds`` for each batch on rank ``rank`` only (the others collate at once)."""

    def __init__(self, rank: int, seconds: float) -> None:
        self.rank, self.seconds = rank, seconds

    def __call__(self, items):
        import torch.distributed as dist

        if self.seconds and dist.is_available() and dist.is_initialized() and dist.get_rank() == self.rank:
            time.sleep(self.seconds)
        return default_collate(items)


class RankModel(TinyModel):
    def __init__(self, sleep_s: float = 0.0) -> None:
        super().__init__()
        self.sleep_s = sleep_s

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(RANKS * STEPS * 8, 16, generator=g)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=8,
                          collate_fn=SleepOnRank(SLOW_RANK, self.sleep_s))


def _ddp_fit(root, sleep_s):
    root.mkdir()
    fit(root, [IterationTimer(warmup_steps=3), SectionProfiler(warmup_steps=3, print_reports=False)],
        model=RankModel(sleep_s), strategy="ddp_spawn", devices=RANKS, max_epochs=1, limit_val_batches=0,
        num_sanity_val_steps=0, enable_checkpointing=False)
    paths = list(root.rglob("perf_summary.json"))
    assert len(paths) == 1, paths
    return paths[0], json.loads(paths[0].read_text())


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    """Two 4-rank fits: rank 3 sleeping 40 ms a batch, and an A/A set of ranks (none sleeps). Each rank on one
    thread (the spawned ranks read OMP_NUM_THREADS): 4 ranks of torch's default 2 threads on 2 cores, 8 threads."""
    root = tmp_path_factory.mktemp("stragglers")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        return {"slow": _ddp_fit(root / "slow", SLEEP_S), "same": _ddp_fit(root / "same", 0.0)}


@pytest.mark.slow
def test_the_rank_that_waits_for_data_is_named_with_its_section(ddp_runs):
    _, summary = ddp_runs["slow"]
    assert summary["run"]["world_size"] == RANKS
    found = summary["diagnosis"]["straggler"]
    assert found is not None, summary["section_profiler"]["ranks"]
    assert found["rank"] == SLOW_RANK and found["section"] == "data_loading", found
    assert found["ranks"] == RANKS
    # the figures against the sleep injected: rank 3's wait beyond the other ranks' median is about 20 ms
    per_rank = summary["section_profiler"]["ranks"]["data_loading"]["per_rank"]
    others = statistics.median(v for r, v in enumerate(per_rank) if r != SLOW_RANK)
    assert 0.7 * SLEEP_S * 1000 <= per_rank[SLOW_RANK] - others <= 2.0 * SLEEP_S * 1000, per_rank
    assert found["excess_ms"] == pytest.approx(per_rank[SLOW_RANK] - others)
    assert found["ratio"] >= 5  # its own wait against the others' collation of 8 rows
    assert found["lag_pct"] >= STRAGGLER_LAG_PCT
    # and the other ranks wait for it at the gradient all-reduce, inside their backward
    assert found["others_wait_ms"] is not None and found["others_wait_ms"] >= 0.5 * SLEEP_S * 1000, found
    assert f"rank {SLOW_RANK} waits" in found["line"] and "data" in found["line"]
    assert "wait for it" in found["line"]
    assert found["line"] in diagnosis_line(summary["diagnosis"])


@pytest.mark.slow
def test_an_a_a_set_of_ranks_names_no_straggler(ddp_runs):
    _, summary = ddp_runs["same"]
    assert summary["run"]["world_size"] == RANKS
    assert summary["section_profiler"]["ranks"]["data_loading"]["per_rank"][SLOW_RANK] is not None
    assert "straggler" in summary["diagnosis"] and summary["diagnosis"]["straggler"] is None, (
        summary["diagnosis"]["straggler"], summary["section_profiler"]["ranks"])


@pytest.mark.slow
def test_compare_and_report_show_the_straggler(ddp_runs, capsys):
    (same, _), (slow, _) = ddp_runs["same"], ddp_runs["slow"]
    assert main(["compare", str(same), str(slow)]) == 0
    text = capsys.readouterr().out
    block = text[text.index("Stragglers (DDP"):].splitlines()
    assert block[1].split() == ["same:", "no", "straggler", "among", str(RANKS), "ranks"], text
    assert block[2].lstrip().startswith("slow:") and f"rank {SLOW_RANK} waits" in block[2], text
    assert "[straggler: rank 3 waits" in " ".join(text.split())  # the candidate's diagnosis line names it too
    assert main(["compare", str(same), str(slow), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["stragglers"]["candidate"]["rank"] == SLOW_RANK and result["stragglers"]["base"] is None
    assert main(["report", str(same), str(slow)]) == 0
    table = capsys.readouterr().out
    note = [line for line in table.splitlines() if "straggler" in line]
    assert len(note) == 1 and f"rank {SLOW_RANK} waits" in note[0] and "data" in note[0], table
    assert main(["report", str(same), str(slow), "--format", "csv"]) == 0
    csv = capsys.readouterr().out
    assert "straggler" in csv.splitlines()[0] and f"rank {SLOW_RANK} waits" in csv


def test_a_single_device_run_has_a_null_straggler_and_no_line(tmp_path, capsys):
    fit(tmp_path, [IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, print_reports=False)],
        max_epochs=1)
    summary = find_summary(tmp_path)
    assert "straggler" in summary["diagnosis"] and summary["diagnosis"]["straggler"] is None
    path = str(next(tmp_path.rglob("perf_summary.json")))
    assert main(["compare", path, path]) == 0
    assert "straggler" not in capsys.readouterr().out.lower()
    assert main(["report", path]) == 0
    assert "straggler" not in capsys.readouterr().out.lower()


# -- the rule on closed-form per-rank figures ------------------------------------------------------------------------

def _summary(iteration_ms, **sections):
    """A 4-section DDP summary: section -> per-rank means (ms)."""
    ranks = {name: {"per_rank": values, "min": min(values), "median": statistics.median(values), "max": max(values),
                    "worst_rank": values.index(max(values))} for name, values in sections.items()}
    return {"schema_version": 2, "status": "completed", "run": {"world_size": len(next(iter(sections.values())))},
            "section_profiler": {"enabled": True, "iterations": 50, "iteration_ms": {"mean": iteration_ms},
                                 "sections": {}, "ranks": ranks}}


def test_time_moved_between_a_rank_s_sections_is_no_straggler_and_a_small_lag_neither():
    # rank 0 spends 7 ms more between batches and 7 ms less in its optimizer step (as an A/A set of 4 ranks on 2
    # cores measured): its own time is the others', nobody waits for it
    assert straggler(_summary(30.0, between_batches=[12.5, 5.5, 3.8, 6.1], optimizer_step=[1.5, 7.9, 8.3, 8.5],
                              backward=[13, 13, 15, 12])) is None
    # 4 ms more a rank's own time, of a 30 ms iteration (13.3%): under the 15% of the rule
    assert straggler(_summary(30.0, data_loading=[1, 1, 1, 5], backward=[20, 20, 20, 16])) is None
    # 5 ms (16.7%): named, with its figures
    found = straggler(_summary(30.0, data_loading=[1.0, 1.2, 0.8, 6.0], forward=[5, 5, 5, 5],
                               backward=[20, 19, 21, 15.5]))
    assert found["rank"] == 3 and found["section"] == "data_loading" and found["ranks"] == 4
    assert found["others_median_ms"] == pytest.approx(1.0) and found["excess_ms"] == pytest.approx(5.0)
    assert found["ratio"] == pytest.approx(6.0) and found["lag_ms"] == pytest.approx(5.0)
    assert found["lag_pct"] == pytest.approx(100.0 * 5.0 / 30.0)
    assert found["others_wait_ms"] == pytest.approx(4.5)  # the others' backward median (20) less rank 3's (15.5)
    assert STRAGGLER_LAG_PCT == 15.0


def test_backward_where_the_others_wait_is_never_the_straggler_s_section():
    # two ranks: rank 1 loads slowly, rank 0 waits for it in backward (all-reduce); backward's outlier is rank 0's
    found = straggler(_summary(30.0, data_loading=[1.0, 21.0], backward=[25.0, 5.0]))
    assert found["rank"] == 1 and found["section"] == "data_loading"
    assert straggler(_summary(30.0, data_loading=[1.0, 1.0], backward=[25.0, 5.0])) is None


def test_the_largest_excess_names_the_section_and_a_slow_forward_is_said_in_its_words():
    found = straggler(_summary(50.0, data_loading=[1, 1, 1, 8], forward=[10, 10, 30, 10]))
    assert (found["rank"], found["section"]) == (2, "forward")
    assert found["line"].startswith("rank 2 takes 3.0x longer in `forward` than the other ranks' median (30.0 ms"
                                    " against 10.0 ms an iteration); the other 3 ranks wait for it 20.0 ms")
    assert "all-reduce" not in found["line"]  # no backward figures: the wait is not located


def test_a_section_rank_0_alone_runs_is_left_out_of_the_ranks_own_time():
    # checkpoint writes on rank 0 only: per-write means, null on the others
    summary = _summary(30.0, data_loading=[1.0, 1.0, 1.0, 1.0])
    summary["section_profiler"]["ranks"]["checkpointing"] = {"per_rank": [40.0, None, None, None]}
    assert straggler(summary) is None


def test_single_device_or_no_ranks_is_null_and_the_line_is_unchanged():
    summary = _summary(30.0, data_loading=[1.0], backward=[5.0])
    assert straggler(summary) is None
    del summary["section_profiler"]["ranks"]
    assert straggler(summary) is None
    diagnosis = diagnose(summary)
    assert diagnosis["straggler"] is None and "straggler" not in diagnosis_line(diagnosis)
