"""bench's OOM rows link a memory snapshot taken in a second run with the allocator's history on (CUDA's allocator
simulated; off CUDA the rows say why there is none)."""

import csv
import json
import os
import pickle

import pytest
import torch
from test_bench import QUICK, TESTS, cli
from test_memory_snapshot import SimulatedAllocator, recorded_snapshot
from torch import nn

from lightning_perf.bench import oom_snapshot
from lightning_perf.bench.sweep import CSV_COLUMNS, BenchError, run_sweep
from lightning_perf.cli import main
from lightning_perf.measure.memory import snapshot as snapshots

#: What the models below saw: (batch size, whether the allocator's history was on) per forward.
FORWARDS = []
ALLOCATOR = SimulatedAllocator([])


class OomFromBatch4(nn.Module):
    """Runs out of memory (the real error type) from batch 4 on, as a GPU would; logs each forward."""

    def __init__(self, only_without_history=False):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.only_without_history = only_without_history

    def forward(self, x):
        FORWARDS.append((x.shape[0], ALLOCATOR.recording))
        if x.shape[0] >= 4 and not (self.only_without_history and ALLOCATOR.recording):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.conv(x)


def oom_from_batch_4():
    return OomFromBatch4()


def oom_only_without_history():
    return OomFromBatch4(only_without_history=True)


@pytest.fixture
def simulated_cuda(monkeypatch):
    """The hardware stood in for: a device with CUDA's allocator, and its history switch and snapshot."""
    FORWARDS.clear()
    ALLOCATOR.log.clear()
    ALLOCATOR.recording = False
    monkeypatch.setattr(snapshots, "memory_backend", lambda: ALLOCATOR)
    monkeypatch.setattr(oom_snapshot, "history_unavailable", lambda device: None)
    monkeypatch.chdir(TESTS)  # --model imports from the current folder: this module, with its log
    return ALLOCATOR.log


def test_an_oom_row_links_the_snapshot_of_a_second_run_with_the_history_on(tmp_path, simulated_cuda, capsys):
    out_csv = tmp_path / "bench.csv"
    code = main(["bench", "--model", "test_bench_oom_snapshot:oom_from_batch_4", "--input-sizes", "8",
                 "--batch-sizes", "1", "4", "--device", "cpu", "--csv", str(out_csv), *QUICK[:-2], "--rounds", "2"])
    out = capsys.readouterr().out
    assert code == 0
    with open(out_csv, newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == CSV_COLUMNS  # the header stays: the link is the file's name
        rows = list(reader)
    assert [(r["batch_size"], r["error"]) for r in rows] == [("1", ""), ("4", "OOM"), ("4", "OOM"), ("1", "")]
    base = oom_snapshot.snapshot_base(str(tmp_path / "bench_oom_snapshots"), rows[1]["sweep_id"], 8, 4)
    with open(base + ".pickle", "rb") as fh:
        assert pickle.load(fh) == recorded_snapshot()
    for view in ("trace_plot", "segment_plot"):
        assert os.path.getsize(f"{base}.{view}.html") > 0
    with open(base + ".json") as fh:
        entry = json.load(fh)
    assert entry["path"] == os.path.abspath(base + ".pickle") and (entry["tile_size"], entry["batch_size"]) == (8, 4)
    assert [round(a["size_mb"]) for a in entry["top_allocations"]] == [500, 64]
    assert entry["failed_request"]["size_mb"] == 2048 and entry["max_entries"] == oom_snapshot.MAX_ENTRIES
    # once for the configuration (two rounds ran out of memory): history on, one snapshot, history off
    assert simulated_cuda == [("record", "all", "python", oom_snapshot.MAX_ENTRIES), ("snapshot",),
                              ("record", None, "all", None)]
    # every forward of the sweep's rows ran with the history off; the one with it on is the second run of batch 4
    assert [f for f in FORWARDS if f[1]] == [(4, True)]
    assert FORWARDS.count((4, False)) == 2  # its rows: one a round
    line = f"OOM at size 8 batch 4: see memory snapshot {entry['path']} (HTML: "
    assert out.count(line) == 1 and "it asked for 2048.0 MiB at" in out
    assert main(["bench", "--from-csv", str(out_csv)]) == 0  # read back: the row's own file, by its name
    assert capsys.readouterr().out.count(line) == 1


def test_the_rows_of_the_sweep_function_say_which_link_and_why_not(tmp_path, simulated_cuda, monkeypatch):
    monkeypatch.setattr(oom_snapshot, "MAX_PER_SWEEP", 1)
    rows = run_sweep(oom_from_batch_4, [8, 16], [1, 4], device="cpu", warmup=0, iters=1, progress=False,
                     oom_snapshot_dir=str(tmp_path / "snaps"))
    by_config = {(r["tile_size"], r["batch_size"]): r for r in rows}
    assert by_config[8, 1]["oom_snapshot"] is None and by_config[8, 1]["oom_snapshot_unavailable"] is None
    assert os.path.isfile(by_config[8, 4]["oom_snapshot"]) and by_config[8, 4]["oom_snapshot_unavailable"] is None
    assert by_config[16, 4]["oom_snapshot"] is None
    assert by_config[16, 4]["oom_snapshot_unavailable"] == ("the sweep took its 1 snapshots (the first configurations"
                                                            " to run out of memory)")
    assert sorted(os.listdir(tmp_path / "snaps" / rows[0]["sweep_id"])) == [
        "size8_batch4.json", "size8_batch4.pickle", "size8_batch4.segment_plot.html", "size8_batch4.trace_plot.html"]


def test_a_configuration_that_runs_out_of_memory_only_without_the_history_says_so(tmp_path, simulated_cuda):
    (row,) = run_sweep(oom_only_without_history, [8], [4], device="cpu", warmup=0, iters=1, progress=False,
                       oom_snapshot_dir=str(tmp_path / "snaps"))
    assert row["error"] == "OOM" and row["oom_snapshot"] is None
    assert row["oom_snapshot_unavailable"] == "run again with the allocator's history on, it did not run out of memory"
    assert simulated_cuda[-1][:2] == ("record", None) and not (tmp_path / "snaps").exists()


def test_no_oom_snapshot_records_nothing(tmp_path, simulated_cuda, capsys):
    code = main(["bench", "--model", "test_bench_oom_snapshot:oom_from_batch_4", "--input-sizes", "8",
                 "--batch-sizes", "4", "--device", "cpu", "--csv", str(tmp_path / "b.csv"), "--no-oom-snapshot",
                 *QUICK])
    assert code == 0 and simulated_cuda == [] and not (tmp_path / "b_oom_snapshots").exists()
    assert ("no memory snapshot for the OOM rows (size 8 batch 4): off (--no-oom-snapshot)"
            in capsys.readouterr().out)


def test_on_cpu_the_oom_rows_say_why_there_is_no_snapshot(tmp_path):
    proc = cli("bench", "--model", "bench_models:oom_above_32", "--input-sizes", "16", "48", "--batch-sizes", "1",
               "--csv", str(tmp_path / "b.csv"), "--device", "cpu", *QUICK)
    assert proc.returncode == 0, proc.stderr
    assert ("no memory snapshot for the OOM rows (size 48 batch 1): the allocator's history is CUDA's; this sweep"
            " ran on cpu") in proc.stdout
    assert sorted(os.listdir(tmp_path)) == ["b.csv"]


def test_bad_oom_snapshot_values_are_refused_before_anything_is_written(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    proc = cli("bench", "--model", "bench_models:small_conv", "--input-sizes", "16", "--batch-sizes", "1",
               "--csv", str(tmp_path / "b.csv"), "--device", "cpu", "--oom-snapshot-dir", str(not_a_folder), *QUICK)
    assert proc.returncode == 2 and proc.stderr.strip() == (f"lightning-perf: error: --oom-snapshot-dir"
                                                           f" {str(not_a_folder)!r} is not a folder")
    assert not (tmp_path / "b.csv").exists()
    proc = cli("bench", "--model", "bench_models:small_conv", "--oom-snapshot=yes", "--no-csv", *QUICK)
    assert proc.returncode == 2 and "--no-oom-snapshot: ignored explicit argument 'yes'" in proc.stderr
    with pytest.raises(BenchError, match="oom_snapshot must be True or False, got 'yes'"):
        run_sweep(oom_from_batch_4, [8], [1], progress=False, oom_snapshot="yes")
