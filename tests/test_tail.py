"""The tail of IterationTimer: every slow iteration explained, against stalls injected at known places and costs.

Each fit runs on a virtual clock (helpers.VirtualClock): a training step costs STEP_S, and each stall advances the
clock by a known amount where it happens (a sampler starting an epoch, a garbage collection's finalizer, a checkpoint
writer), so the causes, counts and times are known exactly on a loaded machine too.
"""

import gc

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import DataLoader, Sampler, TensorDataset

from helpers import TinyModel, find_summary, fit, read_scalars, use_virtual_clock
from lightning_perf import IterationTimer, PerfSuite, SectionProfiler, profile_section
from lightning_perf.measure.timing import tail as tail_module
from lightning_perf.measure.timing import tail_advice
from lightning_perf.measure.timing.tail_advice import tail_insights

STEP_S = 0.010
CLOCK = {}


class SlowStartSampler(Sampler):
    """Costs ``stall_s`` each time an epoch starts iterating it (as DataLoader workers starting would)."""

    def __init__(self, n, stall_s):
        self.n, self.stall_s = n, stall_s

    def __iter__(self):
        CLOCK["clock"].advance(self.stall_s)
        return iter(range(self.n))

    def __len__(self):
        return self.n


class Paced(TinyModel):
    def __init__(self, n=64, epoch_stall_s=0.0):
        super().__init__()
        self.n, self.epoch_stall_s = n, epoch_stall_s

    def training_step(self, batch, batch_idx):
        CLOCK["clock"].advance(STEP_S)
        return super().training_step(batch, batch_idx)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(self.n, 16, generator=g)
        data = TensorDataset(x, x.sum(dim=1, keepdim=True))
        return DataLoader(data, batch_size=8, sampler=SlowStartSampler(self.n, self.epoch_stall_s))


@pytest.fixture
def clock(monkeypatch):
    c = use_virtual_clock(monkeypatch)
    CLOCK["clock"] = c
    yield c
    CLOCK.clear()


def run(tmp_path, model, callbacks=(), timer=None, **kwargs):
    timer = timer or IterationTimer(warmup_steps=2, log_every_n_steps=5)
    for key, value in dict(max_epochs=None, limit_val_batches=0, num_sanity_val_steps=0).items():
        kwargs.setdefault(key, value)
    fit(tmp_path, [timer, *callbacks], model=model, **kwargs)
    return find_summary(tmp_path)["iteration_timer"], timer


def test_epoch_starts_that_cost_100_ms_are_named_with_count_and_time(tmp_path, clock):
    t, timer = run(tmp_path, Paced(epoch_stall_s=0.100), max_epochs=6)
    tail = t["tail"]
    # 6 epochs of 8 batches; the first epoch's first iteration is warm-up: 5 epoch starts measured, 110 ms each
    cause = tail["by_cause"]["epoch_start"]
    assert cause["iterations"] == 5 and cause["flagged_iterations"] == 5
    assert cause["time_s"] == pytest.approx(5 * (0.100 + STEP_S), rel=0.10)
    assert cause["excess_s"] == pytest.approx(5 * 0.100, rel=0.10)
    assert tail["iterations"] == 5 and tail["by_cause"]["unexplained"]["iterations"] == 0
    measured_s = t["histogram_ms"]["sum"] / 1000.0
    assert tail["share_pct"] == pytest.approx(100 * 5 * 0.110 / measured_s, rel=0.01)
    # the Trainer's default ModelCheckpoint saves at each epoch end: it coincided, and is said, but the epoch start
    # is named first
    assert [s["causes"] for s in tail["slowest"][:5]] == [["epoch_start", "checkpoint"]] * 5
    assert cause["also"] == {"checkpoint": 5}
    assert all(s["step"] % 8 == 1 for s in tail["slowest"][:5])  # the first iteration of each epoch
    insight = next(i for i in tail["insights"] if "epoch starts" in i)
    assert "5 iterations at epoch starts" in insight and "num_workers=0" in insight and "0.10 s per epoch" in insight
    assert "5 of the epoch starts followed a checkpoint save" in insight
    line = timer.verdict().splitlines()[-1]
    assert "tail:" in line and "epoch_start 5" in line


class CollectEvery(Callback):
    """Runs a full garbage collection inside every ``every``-th iteration, over a heap of cyclic garbage whose
    finalizer costs ``pause_s``."""

    def __init__(self, every, pause_s):
        self.every, self.pause_s = every, pause_s
        self.steps = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        step = trainer.global_step + 1  # the iteration that starts here ends at this global step
        if step % self.every:
            return
        pause = self.pause_s

        class Node:
            def __del__(self):
                if getattr(self, "costly", False):
                    CLOCK["clock"].advance(pause)

        nodes = [Node() for _ in range(2000)]
        for a, b in zip(nodes, nodes[1:] + nodes[:1]):
            a.next = b
        nodes[0].costly = True
        del nodes, a, b
        gc.collect()
        self.steps.append(step)


def test_a_gc_collect_every_37_steps_flags_exactly_those_iterations(tmp_path, clock):
    collector = CollectEvery(37, pause_s=0.020)
    gc.disable()  # only the collections this test makes: an automatic one could land anywhere
    try:
        t, _ = run(tmp_path, Paced(n=256), callbacks=[collector], max_steps=200,
                   timer=IterationTimer(warmup_steps=2, keep_slowest=10))
    finally:
        gc.enable()
    assert collector.steps == [37, 74, 111, 148, 185]
    tail = t["tail"]
    cause = tail["by_cause"]["gc"]
    assert cause["flagged_iterations"] == 5 and cause["iterations"] == 5
    assert cause["time_s"] == pytest.approx(5 * (STEP_S + 0.020), rel=0.10)
    assert cause["gc_pause_s"] == pytest.approx(5 * 0.020, rel=0.10)
    flagged = sorted(s["step"] for s in tail["slowest"] if "gc" in s["causes"])
    assert flagged == collector.steps
    assert all(s["gc_pause_ms"] == pytest.approx(20.0, rel=0.10) for s in tail["slowest"] if "gc" in s["causes"])
    assert tail["gc"]["full_collections"] >= 5
    assert any("garbage collection" in i for i in tail["insights"])


class SlowWriter(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint, path, storage_options=None):
        CLOCK["clock"].advance(0.050)
        super().save_checkpoint(checkpoint, path, storage_options)


def test_a_checkpoint_every_10_steps_is_named_with_count_and_time(tmp_path, clock):
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=10, save_top_k=-1)
    t, _ = run(tmp_path, Paced(n=256), callbacks=[saver], max_steps=60, plugins=[SlowWriter()])
    cause = t["tail"]["by_cause"]["checkpoint"]
    # saves after steps 10..60; each lands in the next iteration, and the save after the last step in none
    assert cause["flagged_iterations"] == 5 and cause["iterations"] == 5
    assert cause["time_s"] == pytest.approx(5 * (STEP_S + 0.050), rel=0.10)
    assert sorted(s["step"] for s in t["tail"]["slowest"] if s["causes"] == ["checkpoint"]) == [11, 21, 31, 41, 51]
    assert any("wrote a checkpoint" in i for i in t["tail"]["insights"])


class Stalls(Paced):
    """Every ``every``-th step costs ``stall_s`` more, with no cause the suite knows."""

    def __init__(self, every, stall_s, **kwargs):
        super().__init__(**kwargs)
        self.every, self.stall_s, self.steps = every, stall_s, 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        if self.steps % self.every == 0:
            CLOCK["clock"].advance(self.stall_s)
        return super().training_step(batch, batch_idx)


def slow_reports(monkeypatch, cost_s, timer):
    """SectionProfiler's window report costs ``cost_s`` more on the virtual clock; returns the iteration numbers of
    IterationTimer that each report falls in (a report closes its window where the next batch is transferred: in
    the iteration after the last one IterationTimer ended)."""
    falls_in = []
    report = SectionProfiler._report_window

    def costly(self, trainer):
        report(self, trainer)
        CLOCK["clock"].advance(cost_s)
        falls_in.append(timer.iterations + 1)

    monkeypatch.setattr(SectionProfiler, "_report_window", costly)
    return falls_in


@pytest.mark.parametrize("in_suite", [False, True])
def test_slow_iterations_of_lightning_perfs_own_reports_are_named_for_them(tmp_path, clock, monkeypatch, in_suite):
    """A window report that costs 40 ms (4x the 10 ms step): each iteration it runs in is in the tail under
    ``lightning_perf`` (not unexplained), with its time; the slowest kept are those iterations; the insight names
    the remedy."""
    timer = IterationTimer(warmup_steps=2, keep_slowest=3, log_every_n_steps=10)
    falls_in = slow_reports(monkeypatch, 0.040, timer)
    profiler = SectionProfiler(warmup_steps=2, report_every_n_steps=10, print_reports=False)
    callbacks = [PerfSuite([timer, profiler])] if in_suite else [timer, profiler]
    fit(tmp_path, callbacks, model=Paced(n=256), max_steps=100, max_epochs=None, limit_val_batches=0,
        num_sanity_val_steps=0)
    tail = find_summary(tmp_path)["iteration_timer"]["tail"]
    # the windows of iterations 10 to 90 close in the next one; the 100th closes at the fit's end, after the last
    assert falls_in == list(range(11, 102, 10))
    falls_in = falls_in[:-1]
    ours = tail["by_cause"]["lightning_perf"]
    assert ours["iterations"] == ours["flagged_iterations"] == 9
    assert ours["time_s"] == pytest.approx(9 * (STEP_S + 0.040), rel=0.01)
    assert tail["by_cause"]["unexplained"]["iterations"] == 0
    assert len(tail["slowest"]) == 3 and all(s["iteration"] in falls_in and s["causes"] == ["lightning_perf"]
                                             and s["ms"] == pytest.approx(50.0, rel=0.01) for s in tail["slowest"])
    assert any("lightning_perf's own periodic work ran" in i and "print_reports=False" in i for i in tail["insights"])


@pytest.mark.parametrize("place", ["IterationTimer._log_window", "VRAMMonitor._leak_sample", "logger"])
def test_each_place_of_lightning_perfs_own_work_names_the_iteration_it_falls_in(tmp_path, clock, monkeypatch, place):
    """IterationTimer's window log (after its iteration's end: the next one's), VRAMMonitor's memory reading (a batch
    end after IterationTimer's) and the scalars handed to a logger, each made to cost 40 ms: exactly the iterations
    they fall in are named ``lightning_perf``, none unexplained (one epoch, so no epoch start comes first)."""
    from lightning.pytorch.loggers import CSVLogger

    from lightning_perf import VRAMMonitor

    timer = IterationTimer(warmup_steps=2, log_every_n_steps=10, keep_slowest=3)
    falls_in = []

    def cost():
        CLOCK["clock"].advance(0.040)
        falls_in.append(timer.iterations + 1)

    class SlowLogger(CSVLogger):
        def log_metrics(self, metrics, step=None):
            super().log_metrics(metrics, step)
            if any(key.startswith(("perf/", "time/", "time_share/", "vram/")) for key in metrics):  # lightning_perf's
                cost()

    if place != "logger":
        owner_name, method = place.split(".")
        owner = {"IterationTimer": IterationTimer, "VRAMMonitor": VRAMMonitor}[owner_name]
        original = getattr(owner, method)

        def costly(*args, **kwargs):
            out = original(*args, **kwargs)
            cost()
            return out

        monkeypatch.setattr(owner, method, costly)
    t, _ = run(tmp_path, Paced(n=1024), [VRAMMonitor(activity=False),
                                         SectionProfiler(report_every_n_steps=1000, print_reports=False)],
               timer=timer, max_steps=100, logger=SlowLogger(tmp_path) if place == "logger" else True)
    tail = t["tail"]
    measured = sorted({i for i in falls_in if 2 < i <= 100})  # after the warm-up, before the fit's end
    assert len(measured) >= 5, falls_in
    # every iteration it fell in is flagged for it (a logger gets 4 scalars a batch end: half of the iterations,
    # so not all of them are slow); the slow ones are in the tail under it, none unexplained
    assert tail["by_cause"]["lightning_perf"]["flagged_iterations"] == len(measured), (falls_in, tail["by_cause"])
    assert tail["by_cause"]["lightning_perf"]["iterations"] >= 1
    assert tail["by_cause"]["unexplained"]["iterations"] == 0
    assert all(s["iteration"] in measured for s in tail["slowest"]), (measured, tail["slowest"])


@pytest.mark.parametrize("log_every, report_every, after_fold", [(10, 10, None), (1000, 11, 67)])
def test_a_stall_beside_lightning_perfs_own_work_stays_unexplained(tmp_path, clock, monkeypatch, log_every,
                                                                   report_every, after_fold):
    """A 40 ms stall in the iterations where a 2 ms report runs: without the report the iteration is still over 2x
    the median, so the report is not its cause (no fewer reports would make it fast): unexplained, not flagged.
    Also with no log window in the run (log_every_n_steps=1000) and reports every 11 iterations: IterationTimer has
    no window median, so it judges by the iterations so far (the unfolded ones, or the histogram right after a
    fold), the iteration after the fold at 64 included."""
    timer = IterationTimer(warmup_steps=2, log_every_n_steps=log_every)
    falls_in = slow_reports(monkeypatch, 0.002, timer)

    class StallAfterReports(Paced):
        def training_step(self, batch, batch_idx):
            if timer.iterations + 1 in falls_in:  # the iteration a report fell in: its step stalls too
                CLOCK["clock"].advance(0.040)
            return super().training_step(batch, batch_idx)

    t, _ = run(tmp_path, StallAfterReports(n=1024),
               [SectionProfiler(warmup_steps=2, report_every_n_steps=report_every, print_reports=False)],
               timer=timer, max_steps=100)
    if after_fold is not None:  # the first iteration after IterationTimer's fold (64 measured after 2 of warm-up)
        assert after_fold in falls_in
    by = t["tail"]["by_cause"]
    assert by["unexplained"]["iterations"] == 9 and "lightning_perf" not in by, by


def test_a_fit_that_fails_leaves_no_watch_on_lightning_perfs_own_work(tmp_path, clock):
    class Fails(Paced):
        def training_step(self, batch, batch_idx):
            if batch_idx == 5:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match="boom"):
        run(tmp_path, Fails(), max_steps=20)
    assert not tail_module.OWN_WORK.sinks


@pytest.mark.parametrize("cost, flagged", [(0.0009, 0), (0.0011, 9)])
def test_lightning_perfs_own_work_under_a_millisecond_names_no_iteration(tmp_path, clock, monkeypatch, cost, flagged):
    """Own work shorter than 1 ms (and than half the median iteration) flags nothing: a 0.9 ms report leaves the
    tail empty; a 1.1 ms one flags its 9 iterations, which are not slow (not in the tail). One fit each: the report
    patched once (patched twice in one test, the second cost would come on top of the first)."""
    timer = IterationTimer(warmup_steps=2, log_every_n_steps=10)
    slow_reports(monkeypatch, cost, timer)
    t, _ = run(tmp_path, Paced(n=256), [SectionProfiler(warmup_steps=2, report_every_n_steps=10, print_reports=False)],
               timer=timer, max_steps=100)
    tail = t["tail"]
    ours = tail["by_cause"].get("lightning_perf")
    assert (ours["flagged_iterations"] if ours else 0) == flagged, (cost, tail["by_cause"])
    assert tail["iterations"] == 0
    assert not any("lightning_perf's own" in i for i in tail["insights"])  # the rule fires on the tail only


def test_unexplained_stalls_and_the_k_slowest_kept(tmp_path, clock):
    t, _ = run(tmp_path, Stalls(every=10, stall_s=0.040, n=256), max_steps=100,
               timer=IterationTimer(warmup_steps=2, keep_slowest=3, log_every_n_steps=10))
    tail = t["tail"]
    rest = tail["by_cause"]["unexplained"]
    assert rest["iterations"] == 10 and rest["time_s"] == pytest.approx(10 * 0.050, rel=0.01)
    assert len(tail["slowest"]) == 3 and all(s["ms"] == pytest.approx(50.0, rel=0.01) for s in tail["slowest"])
    assert any("no epoch start, validation, checkpoint, allocator retry, garbage collection or lightning_perf's own work explains" in i for i in tail["insights"])
    # per log window: the share of its time above 2x the median so far (one 50 ms stall in ten iterations)
    shares = [v for _, v in read_scalars(tmp_path)["perf/tail_time_pct"]]
    assert shares and max(shares) == pytest.approx(100 * 0.050 / (9 * STEP_S + 0.050), rel=0.01)


class Allocator:
    """The CUDA caching allocator's ``num_alloc_retries``, simulated: the only hardware stand-in of the test below."""

    def __init__(self):
        self.retries = 0

    def read(self, trainer):
        return self.retries


class Retries(Paced):
    """At the given fit iterations the allocator retries: ``stall`` ones cost 30 ms more (a cudaFree and a sync),
    ``quiet`` ones nothing; ``unexplained`` iterations cost 30 ms with no retry."""

    def __init__(self, allocator, stall, quiet, unexplained, **kwargs):
        super().__init__(**kwargs)
        self.allocator, self.stall, self.quiet, self.unexplained = allocator, stall, quiet, unexplained

    def training_step(self, batch, batch_idx):
        iteration = self.global_step + 1
        if iteration in self.stall or iteration in self.quiet:
            self.allocator.retries += 1
        if iteration in self.stall or iteration in self.unexplained:
            CLOCK["clock"].advance(0.030)
        return super().training_step(batch, batch_idx)


def test_allocator_retries_flag_the_slow_iterations_they_happened_in(tmp_path, clock):
    allocator = Allocator()
    timer = IterationTimer(warmup_steps=2, log_every_n_steps=5)
    timer._read_alloc_retries = allocator.read  # on CUDA, torch.cuda.memory_stats()["num_alloc_retries"]
    # a retry in a fast iteration (21) is read at the log window after it (25): the slow 27 is not blamed for it
    model = Retries(allocator, stall={13, 29, 41}, quiet={21}, unexplained={27, 47}, n=256)
    t, _ = run(tmp_path, model, timer=timer, max_steps=60)
    tail = t["tail"]
    cause = tail["by_cause"]["alloc_retry"]
    assert cause["iterations"] == 3 and cause["flagged_iterations"] == 3
    assert cause["time_s"] == pytest.approx(3 * (0.030 + STEP_S), rel=0.01)
    assert cause["excess_s"] == pytest.approx(3 * 0.030, rel=0.01)
    assert tail["by_cause"]["unexplained"]["iterations"] == 2
    assert tail["alloc_retries"] == 4  # the run's total: train start to train end
    assert sorted(s["step"] for s in tail["slowest"] if s["causes"] == ["alloc_retry"]) == [13, 29, 41]
    insight = next(i for i in tail["insights"] if "allocator retried" in i)
    assert "3 iterations" in insight and "expandable_segments" in insight
    assert not any("retried 4 times" in i for i in tail["insights"])  # the per-iteration rule says it instead


def test_no_allocator_retry_flags_nothing_and_off_cuda_nothing_is_read(tmp_path, clock):
    allocator = Allocator()
    timer = IterationTimer(warmup_steps=2, log_every_n_steps=5)
    timer._read_alloc_retries = allocator.read
    t, _ = run(tmp_path, Retries(allocator, stall=set(), quiet=set(), unexplained={13, 29}, n=256), timer=timer,
               max_steps=40)
    assert "alloc_retry" not in t["tail"]["by_cause"] and t["tail"]["by_cause"]["unexplained"]["iterations"] == 2
    assert t["tail"]["alloc_retries"] == 0
    # on the CPU the allocator is never read: the figure is null, with the reason
    t, _ = run(tmp_path / "cpu", Stalls(every=10, stall_s=0.040, n=256), max_steps=40)
    assert t["tail"]["alloc_retries"] is None and "tail.alloc_retries" in t["unavailable"]


def test_a_steady_run_has_a_small_tail_and_no_cause(tmp_path, clock):
    t, _ = run(tmp_path, Paced(n=256), max_steps=40)
    tail = t["tail"]
    assert tail["iterations"] == 0 and tail["share_pct"] == 0.0
    assert tail["insights"] == [tail_insights(tail)[0]] and tail["insights"][0].startswith("The tail is small")


def test_validation_flags_the_next_iteration(tmp_path, clock):
    t, _ = run(tmp_path, Paced(n=256), max_steps=40, limit_val_batches=2, val_check_interval=10,
               check_val_every_n_epoch=None, enable_checkpointing=False)
    cause = t["tail"]["by_cause"]["after_validation"]
    assert cause["flagged_iterations"] == 3  # validations after steps 10, 20, 30 (the one after 40 ends the run)
    assert cause["iterations"] == 0  # none of them slow here


def test_in_a_perf_suite_and_the_gc_hook_goes_at_teardown(tmp_path, clock):
    before = list(gc.callbacks)
    timer = IterationTimer(warmup_steps=2)
    fit(tmp_path, [PerfSuite([timer, SectionProfiler()])], model=Paced(epoch_stall_s=0.100), max_epochs=3,
        limit_val_batches=0, num_sanity_val_steps=0)
    assert gc.callbacks == before
    assert not tail_module.OWN_WORK.sinks  # so does its watch on lightning_perf's own work
    cause = find_summary(tmp_path)["iteration_timer"]["tail"]["by_cause"]["epoch_start"]
    assert cause["iterations"] == 2


class Grows(Paced):
    """Known stalls in known sections: the forward of every 10th step costs 40 ms more; a user section `sampling`
    in the module's batch-end hook costs 60 ms after steps 25 and 75 (IterationTimer's round trip puts it in the
    next iteration, 26 and 76); each epoch start costs 100 ms of data loading."""

    def __init__(self, **kwargs):
        super().__init__(epoch_stall_s=0.100, n=256, **kwargs)

    def training_step(self, batch, batch_idx):
        if (self.global_step + 1) % 10 == 0:
            CLOCK["clock"].advance(0.040)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.global_step in (25, 75):
            with profile_section("sampling"):
                CLOCK["clock"].advance(0.060)


@pytest.mark.parametrize("in_suite", [True, False])
def test_each_slow_iteration_names_the_section_that_exceeded_its_median(tmp_path, clock, in_suite):
    timer = IterationTimer(warmup_steps=2, log_every_n_steps=5, keep_slowest=12)
    profiler = SectionProfiler(warmup_steps=2, print_reports=False)
    callbacks = [PerfSuite([timer, profiler])] if in_suite else [timer, profiler]
    fit(tmp_path, callbacks, model=Grows(), max_steps=80, max_epochs=None, limit_val_batches=0, num_sanity_val_steps=0,
        enable_checkpointing=False)
    summary = find_summary(tmp_path)
    tail = summary["iteration_timer"]["tail"]
    slow = {s["iteration"]: s for s in tail["slowest"]}
    # 32 batches an epoch: epochs start at 33 and 65 (1 is warm-up); forward stalls at 10, 20, ..., 80; sampling
    assert sorted(slow) == [10, 20, 26, 30, 33, 40, 50, 60, 65, 70, 76, 80]
    for n in (10, 20, 30, 40, 50, 60, 70, 80):
        assert slow[n]["section"]["section"] == "forward"
        assert slow[n]["section"]["ms"] == pytest.approx(50.0, rel=0.01)
        assert slow[n]["section"]["median_ms"] == pytest.approx(10.0, rel=0.01)
        assert slow[n]["section"]["excess_ms"] == pytest.approx(40.0, rel=0.01)
    for n in (26, 76):
        assert slow[n]["ms"] == pytest.approx(70.0, rel=0.01)
        assert slow[n]["section"]["section"] == "sampling" and slow[n]["section"]["median_ms"] == 0.0
        assert slow[n]["section"]["ms"] == pytest.approx(60.0, rel=0.01)
    for n in (33, 65):
        assert slow[n]["section"]["section"] == "data_loading"
        assert slow[n]["section"]["ms"] == pytest.approx(100.0, rel=0.01)
    by = tail["by_cause"]
    assert by["epoch_start"]["section"] == {"name": "data_loading", "iterations": 2, "of_kept": 2,
                                            "mean_ms": pytest.approx(100.0, rel=0.01), "median_ms": 0.0,
                                            "runs_in": 78, "of_iterations": 78}
    rest = by["unexplained"]["section"]
    # forward's 8 x 40 ms over its median outweigh sampling's 2 x 60 ms
    assert (rest["name"], rest["iterations"], rest["of_kept"]) == ("forward", 8, 10)
    assert any("data_loading took 100 ms in 2 of the 2 slowest with sections (its median 0.0 ms)" in i
               for i in tail["insights"])
    assert any("forward took 50 ms in 8 of the 10 slowest with sections (its median 10.0 ms): look there first" in i
               for i in tail["insights"])
    # SectionProfiler's own record: as IterationTimer counts the iteration (the sampling after step 25 in 26)
    records = {r["iteration"]: r for r in summary["section_profiler"]["slowest_iterations"]}
    assert records[26]["sections_ms"]["sampling"] == pytest.approx(60.0, rel=0.01)
    assert "sampling" not in records.get(25, {"sections_ms": {}})["sections_ms"]
    assert records[26]["ms"] == pytest.approx(slow[26]["ms"], rel=0.01)


def test_without_section_profiler_the_tail_names_no_section(tmp_path, clock):
    t, _ = run(tmp_path, Grows(), max_steps=40, enable_checkpointing=False)
    assert all("section" not in s for s in t["tail"]["slowest"])
    assert all("section" not in c for c in t["tail"]["by_cause"].values())


# -- the rules, each with a case that fires it and one that does not ----------------------------------------------------
def block(**by_cause):
    base = {"factor": 2.0, "median_ms": 10.0, "share_pct": 0.0, "slowest": [], "alloc_retries": None,
            "dataloader": {"num_workers": 4, "persistent_workers": False}}
    entries = {}
    for name, (n, share) in by_cause.items():
        entries[name] = {"iterations": n, "share_pct": share, "time_s": n * 0.11, "excess_s": n * 0.1,
                         "mean_ms": 110.0, "flagged_iterations": n, "gc_pause_s": n * 0.1}
    base["by_cause"] = entries
    base["share_pct"] = sum(share for _, share in by_cause.values())
    return base


@pytest.mark.parametrize("name, needle", [
    ("epoch_start", "`persistent_workers=True` would save about 0.10 s per epoch"),
    ("checkpoint", "wrote a checkpoint"),
    ("gc", "garbage collection"),
    ("after_validation", "after a validation"),
    ("unexplained", "no epoch start"),
])
def test_each_cause_rule_fires_at_its_share_and_not_below(name, needle):
    minimum = tail_advice.UNEXPLAINED_MIN_PCT if name == "unexplained" else tail_advice.RULE_MIN_PCT
    assert any(needle in i for i in tail_insights(block(**{name: (12, minimum + 0.5)})))
    assert not any(needle in i for i in tail_insights(block(**{name: (12, minimum - 0.5)})))
    assert not any(needle in i for i in tail_insights(block(**{name: (0, 0.0)})))


def test_the_epoch_start_advice_follows_the_dataloader():
    b = block(epoch_start=(12, 9.0))
    b["dataloader"] = {"num_workers": 4, "persistent_workers": True}
    text = " ".join(tail_insights(b))
    assert "epoch starts" in text and "persistent_workers=True` would" not in text


def test_the_alloc_retries_rule():
    b = block()
    b["alloc_retries"] = 7
    assert any("retried 7 times" in i for i in tail_insights(b))
    b["alloc_retries"] = 0
    assert not any("retried" in i for i in tail_insights(b))


def test_the_small_tail_rule():
    assert any(i.startswith("The tail is small") for i in tail_insights(block(unexplained=(2, 0.5))))
    assert not any(i.startswith("The tail is small") for i in tail_insights(block(unexplained=(2, 3.0))))


def test_keep_slowest_is_checked_at_construction():
    with pytest.raises(ValueError, match=r"`IterationTimer\(keep_slowest=-1\)`"):
        IterationTimer(keep_slowest=-1)


def test_a_checkpoint_of_an_older_version_loads_its_slowest_without_iteration_numbers():
    from lightning_perf.measure.timing.tail import SlowestIterations

    kept = SlowestIterations(3)
    kept.load([[50.0, 1, 10, 0, 0, 0.0], [60.0, 2, 20, 0, 0, 0.0, 20]])  # 6 numbers before iteration numbers
    assert [(e["step"], e["iteration"]) for e in kept.entries()] == [(20, 20), (10, None)]
    assert len(kept.to_state()[0]) == 7


def test_a_tail_mostly_of_lightning_perfs_own_work_is_advised_fewer_reports():
    from lightning_perf.summary.diagnosis import _largest_tail_cause, _tail_advice

    tail = {"by_cause": {"lightning_perf": {"iterations": 9, "share_pct": 30.0},
                         "unexplained": {"iterations": 1, "share_pct": 2.0}}}
    cause = _largest_tail_cause(tail)
    assert cause == "lightning_perf"
    assert "print_reports=False" in _tail_advice(tail, cause) and "report_every_n_steps" in _tail_advice(tail, cause)
