"""data_loading is the training loop's wait for the next batch, checked against the DataLoader's own clock around
its ``__next__`` in the same fit (real time, CPU, progress bar on, 0 and 2 workers); the loop's other work between
two batches is ``between_batches``; with workers, what they spend per batch is measured inside them."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from helpers import TinyModel, find_summary, fit
from lightning_perf import IterationTimer, SectionProfiler
from lightning_perf.measure.sections.loader import computing_pct

WARMUP = 5


class ClockedIterator:
    """The DataLoader's iterator with its own clock around each ``__next__`` (what the loop waits for)."""

    def __init__(self, iterator, spent):
        self.iterator, self.spent = iterator, spent

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            return next(self.iterator)
        finally:
            self.spent.append(time.perf_counter() - start)

    def __len__(self):
        return len(self.iterator)


class ClockedLoader(DataLoader):
    """A DataLoader whose iterators time their own ``__next__`` into ``spent``."""

    def __init__(self, *args, spent, **kwargs):
        super().__init__(*args, **kwargs)
        self.spent = spent

    def __iter__(self):
        return ClockedIterator(super().__iter__(), self.spent)


class SelfTimedItems(Dataset):
    """Items that each cost ``item_s`` (``time.sleep``), timing themselves into memory shared with forked workers:
    the workers' own reference (seconds, items)."""

    def __init__(self, n, item_s, shared):
        self.x = torch.randn(n, 64)
        self.item_s, self.shared = item_s, shared

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        start = time.perf_counter()
        if self.item_s:
            time.sleep(self.item_s)
        x = self.x[i]
        out = x, x.sum(dim=0, keepdim=True)
        with self.shared.get_lock():
            self.shared[0] += time.perf_counter() - start
            self.shared[1] += 1
        return out


class StepModel(TinyModel):
    """A step of a few ms on the CPU (so that a cheap fetch is a small share), fed by ``loader``."""

    loader = None  # (set on the instance: an argument would go into the hyperparameters, which are copied)

    def __init__(self):
        super().__init__(features=64)
        self.net = nn.Sequential(nn.Linear(64, 768), nn.ReLU(), nn.Linear(768, 768), nn.ReLU(), nn.Linear(768, 1))

    def train_dataloader(self):
        return self.loader


def clocked_fit(tmp_path, loader, spent, **overrides):
    sp = SectionProfiler(warmup_steps=WARMUP, print_reports=False)
    kwargs = dict(max_epochs=1, enable_progress_bar=True, limit_val_batches=0, num_sanity_val_steps=0,
                  enable_checkpointing=False, log_every_n_steps=1)
    kwargs.update(overrides)
    model = StepModel()
    model.loader = loader
    fit(tmp_path, [sp, IterationTimer(warmup_steps=WARMUP), TQDMProgressBar(refresh_rate=1)], model=model, **kwargs)
    summary = find_summary(tmp_path)
    section = summary["section_profiler"]
    waits = spent[WARMUP:]  # the fetch of iteration k is the k-th __next__: the counted ones
    assert section["sections"]["data_loading"]["count"] == len(waits) > 0
    return summary, section, 1000.0 * sum(waits) / len(waits)


def assert_close_to_the_loaders_clock(data_ms, loader_ms):
    """Within 15% plus 0.1 ms. The loop's wait also holds Lightning's fetcher code around the DataLoader's
    ``__next__`` (its prefetch bookkeeping and profiler action), which slows with the machine: 89 µs a batch in a CI
    run with the other test process on the second core, where a 0.05 ms allowance failed once in three runs, and
    0.154 ms on a 0.98 ms ``__next__`` at a load average of 5, past "15% or 0.1 ms". The defect this guards against
    read 0.70 ms against a 0.28 ms ``__next__``."""
    assert abs(data_ms - loader_ms) <= 0.15 * loader_ms + 0.10, (data_ms, loader_ms)


def assert_the_verdict_follows_the_loaders_clock(summary, loader_ms, workers):
    """The verdict agrees with the DataLoader's own clock. With workers the loop's wait is the hand-over of each batch
    from a worker (pickled through shared memory), which beside a 1 ms step can be a quarter of the iteration; without
    them a cheap in-memory loader's ``__next__`` read 23% of the iteration on a loaded machine. So the verdict follows
    the loader's clock (clearly under the threshold: not
    input-bound; clearly over: input-bound, with advice from the workers' own time), never with the loop's other
    work."""
    section, diagnosis = summary["section_profiler"], summary["diagnosis"]
    wait_pct = 100.0 * loader_ms / section["iteration_ms"]["mean"]
    transfer_pct = section["sections"]["transfer"]["share_pct"]
    if wait_pct + transfer_pct < 20.0:
        assert diagnosis["verdict"] != "input-bound", (wait_pct, diagnosis)
    elif wait_pct + transfer_pct > 30.0 and diagnosis["verdict"] == "input-bound":
        assert "workers" in diagnosis["advice"], (wait_pct, diagnosis)
    elif wait_pct + transfer_pct > 30.0:  # a busy machine's tail can outweigh it: input-bound is then named beside it
        assert diagnosis["verdict"] == "tail-heavy" and "input-bound" in diagnosis["also"], (wait_pct, diagnosis)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_cheap_loader_is_its_own_next_and_not_input_bound(tmp_path, workers):
    """An in-memory dataset with the progress bar on (refreshed every batch) and Lightning logging every step: the
    loop's wait for a batch (``data_loading``) is the DataLoader's own ``__next__`` time, within 15% plus 0.1 ms; the
    progress bar, logging and the loop's bookkeeping are ``between_batches`` (before, all of it was data loading:
    0.70 ms against a 0.28 ms ``__next__`` in the finding). Without workers the verdict is not input-bound; with
    them it follows the DataLoader's own clock (as the verdict, or beside a busy machine's tail); the sections still add up to the iteration."""
    spent, shared = [], multiprocessing.Array("d", 2)
    loader = ClockedLoader(SelfTimedItems(2048, 0.0, shared), batch_size=32, num_workers=workers, spent=spent,
                           persistent_workers=workers > 0)
    summary, section, loader_ms = clocked_fit(tmp_path, loader, spent)
    table = section["sections"]
    assert_close_to_the_loaders_clock(table["data_loading"]["mean_ms"], loader_ms)
    assert section["data_loading_boundary"] == "fetch" and "data_loading_fetch" not in section["unavailable"]
    assert table["between_batches"]["count"] == table["data_loading"]["count"]
    assert table["between_batches"]["mean_ms"] > 0
    total = sum(r["total_s"] for r in table.values() if r["kind"] == "auto")
    assert 1000.0 * total == pytest.approx(section["iteration_ms"]["mean"] * section["iterations"], rel=1e-6)
    assert_the_verdict_follows_the_loaders_clock(summary, loader_ms, workers)
    if workers:  # what the workers spent, beside the wait: every batch of the epoch, timed inside them
        row = section["workers"]
        assert row["num_workers"] == 2 and row["batches"] == len(loader)
        assert row["busy_ms_per_batch"] > 0 and 0 < row["busy_pct"] <= 100
        assert "workers" not in section["unavailable"]
    else:
        assert section["workers"]["num_workers"] == 0 and section["workers"]["busy_ms_per_batch"] is None
        assert "num_workers=0" in section["unavailable"]["workers"]


def test_a_sleeping_dataset_is_still_input_bound(tmp_path):
    """30 ms a batch in the dataset (num_workers=0): the wait is the DataLoader's own ``__next__``, and the verdict
    is input-bound, with the advice for a loader without workers."""
    spent, shared = [], multiprocessing.Array("d", 2)
    loader = ClockedLoader(SelfTimedItems(160, 0.030 / 8, shared), batch_size=8, spent=spent)
    summary, section, loader_ms = clocked_fit(tmp_path, loader, spent)
    assert loader_ms >= 30.0
    assert_close_to_the_loaders_clock(section["sections"]["data_loading"]["mean_ms"], loader_ms)
    diagnosis = summary["diagnosis"]
    assert diagnosis["verdict"] == "input-bound", diagnosis
    assert "num_workers=0" in diagnosis["advice"]


def test_with_workers_their_own_time_is_reported_beside_the_wait(tmp_path):
    """Two workers, 8 items of 2 ms a batch: the workers' fetch and collate per batch (timed inside them) is the
    dataset's own clock per batch (taken in the same workers), plus collation; every batch is counted once; the
    loop's wait is still the DataLoader's ``__next__``. ``busy_pct`` is what making an iteration's batch takes of the
    two workers' time at the loop's measured pace, and the advice follows it: saturated workers (the loop goes at
    their pace) get "add workers" where there are more cores than workers, else "make loading cheaper"; workers
    busy a small part of the time while the loop waits get "more workers will not help"; busy workers that mostly
    wait (these items sleep) get "more workers can help" (on a loaded machine the step may be the slower part: which
    case a run is in is not asserted, only that the words fit the figures)."""
    spent, shared = [], multiprocessing.Array("d", 2)
    loader = ClockedLoader(SelfTimedItems(256, 0.002, shared), batch_size=8, num_workers=2, spent=spent)
    summary, section, loader_ms = clocked_fit(tmp_path, loader, spent)
    row = section["workers"]
    dataset_s, items = shared[0], int(shared[1])
    assert items == 256 and row["batches"] == len(loader) == 32
    own_ms = 1000.0 * dataset_s / row["batches"]
    assert own_ms <= row["busy_ms_per_batch"] <= 1.15 * own_ms + 0.5, (row, own_ms)
    assert row["busy_pct"] == pytest.approx(100.0 * row["busy_ms_per_batch"] / (2 * section["iteration_ms"]["mean"]))
    assert_close_to_the_loaders_clock(section["sections"]["data_loading"]["mean_ms"], loader_ms)
    waits = section["sections"]["data_loading"]["share_pct"] > 15
    insight = next(i for i in section["insights"] if i.startswith("Data loading"))
    if not waits:
        assert "more workers would gain nothing" in insight
    elif row["busy_pct"] >= 80 and computing_pct(row["cpu_pct"], row["core_wait_pct"]) < 50:  # (sleeping items)
        assert "more workers can help" in insight, insight
    elif row["busy_pct"] >= 80:
        assert "saturated" in insight and ("add workers" in insight) == (row["cpu_count"] > 2), insight
    else:
        assert "more workers will not help" in insight
    if summary["diagnosis"]["verdict"] == "input-bound" and summary["diagnosis"]["advice"].startswith("the loop"):
        assert "workers" in summary["diagnosis"]["advice"] and f"{row['busy_pct']:.0f}%" in summary["diagnosis"][
            "advice"]


def test_without_the_fetch_announcement_the_gap_is_data_loading_and_says_so(tmp_path, monkeypatch):
    """A Lightning whose training loop has no fetch marks under the names the profiler knows (a release that renames
    them): after 3 steps the profiler warns, times data loading as the whole gap between batches (`batch_gap`, an
    upper bound, so it holds the loop's work too and no `between_batches` is counted after), and says why."""
    from lightning_perf.callbacks.section_profiler import callback as module

    monkeypatch.setattr(module, "_FETCH_MARKS", ("_on_before_fetch_renamed", "_on_after_fetch_renamed"))
    spent = []
    loader = ClockedLoader(TensorDataset(torch.randn(256, 64), torch.randn(256, 1)), batch_size=8, spent=spent)
    with pytest.warns(UserWarning, match="announced no dataloader fetch"):
        summary, section, loader_ms = clocked_fit(tmp_path, loader, spent)
    assert section["data_loading_boundary"] == "batch_gap"
    assert "upper bound" in section["unavailable"]["data_loading_fetch"]
    assert section["sections"]["data_loading"]["mean_ms"] >= loader_ms
    assert section["sections"]["between_batches"]["count"] == 0  # (the first steps were warm-up)


#: A user's script, unchanged by any measuring tool: Lightning's defaults (progress bar on), an in-memory dataset,
#: and its own clock around the DataLoader's ``__next__``, written to ``waits.json`` in the folder it runs in.
SCRIPT = '''
import json
import sys
import time

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

WAITS = []


class Clocked:
    def __init__(self, iterator):
        self.iterator = iterator

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            return next(self.iterator)
        finally:
            WAITS.append(time.perf_counter() - start)


class Loader(DataLoader):
    def __iter__(self):
        return Clocked(super().__iter__())


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 768), torch.nn.ReLU(), torch.nn.Linear(768, 768),
                                       torch.nn.ReLU(), torch.nn.Linear(768, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


g = torch.Generator().manual_seed(0)
x = torch.randn(2048, 64, generator=g)
loader = Loader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=32, num_workers=int(sys.argv[1]),
                persistent_workers=int(sys.argv[1]) > 0)
Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        log_every_n_steps=1).fit(Net(), loader)
with open("waits.json", "w") as fh:
    json.dump(WAITS, fh)
'''


@pytest.mark.parametrize("workers", [0, 2])
def test_lightning_perf_run_on_a_script_with_a_progress_bar_reports_the_loaders_own_wait(tmp_path, workers):
    """``lightning-perf run`` on an unchanged script (Lightning's progress bar and a logged metric on every step, an
    in-memory dataset): ``data_loading`` is the DataLoader's own ``__next__`` time within 15% plus 0.1 ms, the run is
    not input-bound (with workers: as the DataLoader's own clock says), and with workers their own time is in the
    summary."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT).lstrip())
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", "run", "--out", str(out), "--name", "cheap",
                           "--", sys.executable, str(script), str(workers)], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "cheap" / "perf_summary.json").read_text())
    waits = json.loads((tmp_path / "waits.json").read_text())
    section = summary["section_profiler"]
    warmup = section["warmup_steps"]
    counted = waits[warmup:]
    assert section["sections"]["data_loading"]["count"] == len(counted) == 64 - warmup
    loader_ms = 1000.0 * sum(counted) / len(counted)
    assert_close_to_the_loaders_clock(section["sections"]["data_loading"]["mean_ms"], loader_ms)
    assert section["sections"]["between_batches"]["mean_ms"] > 0  # the progress bar and the logging are there
    assert_the_verdict_follows_the_loaders_clock(summary, loader_ms, workers)
    if workers:
        assert section["workers"]["num_workers"] == 2 and section["workers"]["batches"] == 64
        assert section["workers"]["busy_ms_per_batch"] > 0


def test_the_default_boundary_is_the_fetch():
    assert SectionProfiler().data_loading_boundary == "fetch"


def test_without_torchs_fetchers_the_workers_figures_are_null_with_the_reason(tmp_path, monkeypatch):
    """The workers' time comes from wrapping torch's DataLoader fetchers (private names): a torch without one gives
    null figures and says why, and training and the rest of the sections go on as before."""
    from torch.utils.data._utils import fetch as fetch_module

    monkeypatch.delattr(fetch_module, "_IterableDatasetFetcher")
    spent, shared = [], multiprocessing.Array("d", 2)
    loader = ClockedLoader(SelfTimedItems(256, 0.0, shared), batch_size=32, num_workers=2, spent=spent)
    summary, section, loader_ms = clocked_fit(tmp_path, loader, spent)
    assert section["workers"]["num_workers"] == 2 and section["workers"]["busy_ms_per_batch"] is None
    assert "_IterableDatasetFetcher" in section["unavailable"]["workers"]
    assert fetch_module._MapDatasetFetcher.fetch.__name__ == "fetch" and not hasattr(
        fetch_module._MapDatasetFetcher.fetch, "__wrapped__")  # nothing of the wrapper left behind
    assert_close_to_the_loaders_clock(section["sections"]["data_loading"]["mean_ms"], loader_ms)
