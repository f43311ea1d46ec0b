"""bench on a real GPU: a configuration that runs out of memory links a snapshot whose largest live allocation is the
tensor the model kept and whose failed request is the one that did not fit, each with its line. Skipped without
CUDA."""

import json
import os
import pickle

import pytest
import torch
from torch import nn

from lightning_perf.bench.sweep import run_sweep

pytestmark = pytest.mark.gpu
MB = 1024.0 * 1024.0
HERE = os.path.abspath(__file__)
#: Floats kept per sample: 256 MiB.
KEPT_PER_SAMPLE = 64 * 1024 * 1024


def line_of(marker):
    with open(HERE) as fh:
        return next(i for i, text in enumerate(fh, 1) if text.rstrip().endswith(marker))


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
    top, failed = entry["top_allocations"][0], entry["failed_request"]
    kept_mb, too_big_mb = sizes[2]["kept"] / MB, sizes[2]["too_big"] / MB
    record("bench OOM snapshot: largest live allocation", top["size_mb"], kept_mb, "MB", "within 1%")
    record("bench OOM snapshot: failed request", failed["size_mb"], too_big_mb, "MB", "within 2 MB")
    assert abs(top["size_mb"] - kept_mb) <= 0.01 * kept_mb
    assert top["frame"] == f"{HERE}:{line_of('# KEPT')} in forward"
    assert abs(failed["size_mb"] - too_big_mb) <= 2.0
    assert failed["frame"] == f"{HERE}:{line_of('# TOO_BIG')} in forward"
    for view, html in entry["html"].items():
        assert os.path.getsize(html) > os.path.getsize(path), view  # the pickle, base64, in the page
