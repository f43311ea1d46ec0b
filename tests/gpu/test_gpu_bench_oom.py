"""bench on a real GPU: a configuration that runs out of memory links a snapshot whose largest live allocation is the
tensor the model kept and whose failed request is the one that did not fit, each with its line. Skipped without
CUDA."""

import json
import os
import pickle

import pytest
import torch
from snapshot_checks import check_oom_snapshot
from torch import nn

from lightning_perf.bench.sweep import run_sweep

pytestmark = pytest.mark.gpu
HERE = os.path.abspath(__file__)
#: Floats kept per sample: 256 MiB.
KEPT_PER_SAMPLE = 64 * 1024 * 1024


class KeepsThenAsksTooMuch(nn.Module):
    """Keeps 256 MiB a sample, then from batch 2 on asks for twice the card's memory: that request fails."""

    def __init__(self, sizes):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.sizes = sizes

    def forward(self, x):
        kept = torch.empty(x.shape[0] * KEPT_PER_SAMPLE, dtype=torch.float32, device=x.device)  # KEPT
        self.sizes.setdefault(x.shape[0], {})["kept"] = kept.numel() * kept.element_size()
        if x.shape[0] >= 2:
            too_big_n = 2 * torch.cuda.get_device_properties(x.device).total_memory // 4
            self.sizes[x.shape[0]]["too_big"] = too_big_n * 4
            torch.empty(too_big_n, dtype=torch.float32, device=x.device)  # TOO_BIG
        return self.conv(x)


def test_an_oom_row_of_bench_links_a_snapshot_of_the_tensors_that_held_the_memory(tmp_path, record):
    sizes = {}
    rows = run_sweep(lambda: KeepsThenAsksTooMuch(sizes), [8], [1, 2], device="cuda", warmup=1, iters=2,
                     progress=False, rounds=2, oom_snapshot_dir=str(tmp_path))
    torch.cuda.empty_cache()
    assert [(r["batch_size"], r["error"]) for r in rows] == [(1, ""), (2, "OOM"), (2, "OOM"), (1, "")]
    assert all(r["oom_snapshot"] is None and r["oom_snapshot_unavailable"] is None for r in rows if not r["error"])
    path = rows[1]["oom_snapshot"]
    assert path and rows[2]["oom_snapshot"] == path and rows[1]["oom_snapshot_unavailable"] is None
    with open(path, "rb") as fh:
        assert pickle.load(fh)["device_traces"], "a snapshot without the recorded history"
    with open(path[: -len(".pickle")] + ".json") as fh:
        entry = json.load(fh)
    assert entry["path"] == path
    check_oom_snapshot(record, "bench OOM snapshot", entry, (sizes[2]["kept"], HERE, "# KEPT", "forward"),
                       (sizes[2]["too_big"], HERE, "# TOO_BIG", "forward"))
