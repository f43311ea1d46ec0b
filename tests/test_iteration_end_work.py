"""SectionProfiler: work at the end of an iteration belongs to that iteration, and the fit's final work has its own
row (issue 23, seed 004). On the virtual clock (helpers.VirtualClock): every figure is the cost the test injects."""

import pytest
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import DataLoader

from helpers import ClockedItems, SimulatedDevice, TinyModel, find_summary, fit, read_scalars, use_virtual_clock
from lightning_perf import SectionProfiler, profile_section

STEP_S, SAMPLE_S, SAVE_S, FINAL_S, FETCH_S = 0.003, 0.005, 0.007, 0.011, 0.0005


class CostlySaves(TorchCheckpointIO):
    """Every checkpoint write costs SAVE_S on the virtual clock, and is written for real."""

    def __init__(self, clock):
        self.clock, self.saves = clock, 0

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.clock.advance(SAVE_S)
        self.saves += 1
        super().save_checkpoint(checkpoint, path, storage_options)


class Sampler(TinyModel):
    """STEP_S a training_step; every ``every`` steps a SAMPLE_S ``sampling`` section in the module's batch-end hook
    (which Lightning calls after every callback's), counted by the model itself."""

    def __init__(self, clock, every):
        super().__init__()
        self.clock, self.every, self.sampled = clock, every, 0

    def training_step(self, batch, batch_idx):
        self.clock.advance(STEP_S)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.trainer.global_step % self.every == 0:
            with profile_section("sampling"):
                self.clock.advance(SAMPLE_S)
            self.sampled += 1


def profiler(**kwargs):
    kwargs.setdefault("print_reports", False)
    kwargs.setdefault("warmup_steps", 0)
    return SectionProfiler(**kwargs)


def tape_off(monkeypatch):
    """Every SectionProfiler of the next fit switches its sections live, with a device clock or without."""
    use = SectionProfiler._use_clock

    def live(self, clock):
        self._tape_ok = False
        use(self, clock)

    monkeypatch.setattr(SectionProfiler, "_use_clock", live)


def watch_runs(monkeypatch, runs):
    """Appends (iteration at its start, iterations closed) of each run of plain iterations worked out at once."""
    steps = SectionProfiler._apply_plain_steps

    def closing(self, tape, i):
        before = self._iterations
        steps(self, tape, i)
        runs.append((before, self._iterations - before))

    monkeypatch.setattr(SectionProfiler, "_apply_plain_steps", closing)


@pytest.mark.parametrize("boundary", ["batch_gap", "fetch"])
def test_every_sampling_call_and_every_checkpoint_is_counted_the_last_ones_too(tmp_path, monkeypatch, boundary):
    """12 steps over two epochs (8 + 4, stopped by max_steps mid-epoch): sampling at 3, 6, 9, 12 and a checkpoint
    at 4, 8, 12. The model's own count, the files on disk and the plugin's count are the references."""
    clock = use_virtual_clock(monkeypatch)
    io, model = CostlySaves(clock), Sampler(clock, every=3)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    fit(tmp_path, [profiler(data_loading_boundary=boundary), ckpt], model=model, max_steps=12, max_epochs=None,
        plugins=[io])
    sp = find_summary(tmp_path)["section_profiler"]
    table = sp["sections"]
    files = len(list((tmp_path / "ckpt").glob("*.ckpt")))
    assert model.sampled == 4 and files == io.saves == 3
    assert sp["iterations"] == 12
    # the module's batch-end sampling runs between two batches: with the fetch as data loading that is the loop's own
    # section; with batch_gap it is carved out of the gap and named `other` (not part of the fetch)
    between = "other" if boundary == "batch_gap" else "between_batches"
    assert table["sampling"]["count"] == model.sampled and table["sampling"]["parent"] == between
    assert table["sampling"]["total_s"] == pytest.approx(model.sampled * SAMPLE_S)
    assert table["checkpointing"]["count"] == files and table["checkpointing"]["total_s"] == pytest.approx(
        files * SAVE_S)
    # the iterations hold all of it, nothing else was spent: the final row is empty
    assert sp["iteration_ms"]["mean"] * sp["iterations"] == pytest.approx(
        1000 * (12 * STEP_S + 4 * SAMPLE_S + 3 * SAVE_S))
    assert 1000 * sum(r["total_s"] for r in table.values()) == pytest.approx(
        sp["iteration_ms"]["mean"] * sp["iterations"])
    final = sp["after_last_iteration"]
    assert final["total_s"] == pytest.approx(0.0, abs=1e-9) and set(final["sections"]) == {"other"}
    assert "after_last_iteration" not in sp["unavailable"]


def test_the_report_at_step_n_holds_the_batch_end_work_of_iteration_n(tmp_path, monkeypatch):
    """A report every 4 steps, sampling and a checkpoint every 4 steps: each window holds exactly one of each, the
    one of its own last iteration (counted in the next iteration, the first window held none and the last was
    lost)."""
    clock = use_virtual_clock(monkeypatch)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    fit(tmp_path, [profiler(report_every_n_steps=4), ckpt], model=Sampler(clock, every=4), max_epochs=2,
        plugins=[CostlySaves(clock)])
    scalars = read_scalars(tmp_path)
    for key, cost in (("time/sampling_ms", SAMPLE_S), ("time/checkpointing_ms", SAVE_S)):
        assert [step for step, _ in scalars[key]] == [4, 8, 12, 16], key
        assert [v for _, v in scalars[key]] == pytest.approx([1000 * cost / 4] * 4), key
    assert [v for _, v in scalars["time/iteration_ms"]] == pytest.approx(
        [1000 * (4 * STEP_S + SAMPLE_S + SAVE_S) / 4] * 4)


class FinalWork(TinyModel):
    """STEP_S a step; at the end of training a FINAL_S ``final_sampling`` section and a checkpoint of its own."""

    def __init__(self, clock, path):
        super().__init__()
        self.clock, self.path = clock, path

    def training_step(self, batch, batch_idx):
        self.clock.advance(STEP_S)
        return super().training_step(batch, batch_idx)

    def on_train_end(self):
        with profile_section("final_sampling"):
            self.clock.advance(FINAL_S)
        self.trainer.save_checkpoint(self.path)


def test_the_fits_final_work_is_its_own_row(tmp_path, monkeypatch, caplog):
    """ModelCheckpoint saves at each epoch end: the first epoch's save is work of the next iteration, the last
    one falls after the last iteration; the module's on_train_end (after every callback's) samples and saves once
    more. Checkpoints in the table plus the final row are the files on disk."""
    clock = use_virtual_clock(monkeypatch)
    io = CostlySaves(clock)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1)
    with caplog.at_level("INFO"):
        fit(tmp_path, [profiler(print_reports=True), ckpt], model=FinalWork(clock, tmp_path / "ckpt" / "end.ckpt"),
            max_epochs=2, limit_val_batches=0, plugins=[io])
    sp = find_summary(tmp_path)["section_profiler"]
    files = len(list((tmp_path / "ckpt").glob("*.ckpt")))
    assert files == io.saves == 3
    final, table = sp["after_last_iteration"], sp["sections"]
    assert table["checkpointing"]["count"] == 1 and table["checkpointing"]["total_s"] == pytest.approx(SAVE_S)
    assert final["sections"]["checkpointing"]["count"] == 2
    assert table["checkpointing"]["count"] + final["sections"]["checkpointing"]["count"] == files
    assert final["sections"]["checkpointing"]["total_s"] == pytest.approx(2 * SAVE_S)
    row = final["sections"]["final_sampling"]
    assert row == {"kind": "user", "parent": "other", "count": 1, "total_s": pytest.approx(FINAL_S),
                   "closed_by_exception": 0}
    assert "final_sampling" not in table  # it ran in no iteration
    assert final["total_s"] == pytest.approx(2 * SAVE_S + FINAL_S)
    assert final["sections"]["other"]["total_s"] == pytest.approx(0.0, abs=1e-9)
    # the iterations keep their own time: 16 steps and the first epoch's save
    assert sp["iteration_ms"]["mean"] * sp["iterations"] == pytest.approx(1000 * (16 * STEP_S + SAVE_S))
    assert "after the last iteration: 0.025 s" in caplog.text


def test_a_fit_that_fails_says_why_it_has_no_final_row(tmp_path, monkeypatch):
    class Fails(TinyModel):
        def training_step(self, batch, batch_idx):
            if batch_idx == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path, [profiler()], model=Fails(), max_epochs=1)
    sp = find_summary(tmp_path)["section_profiler"]
    assert sp["after_last_iteration"] is None
    assert "did not reach its end" in sp["unavailable"]["after_last_iteration"]


class BatchEndHeavy(TinyModel):
    """A fetch of FETCH_S an item, STEP_S a step, and 2 ms of batch-end work in no section."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def train_dataloader(self):
        return DataLoader(ClockedItems(self.clock, FETCH_S), batch_size=8)

    def training_step(self, batch, batch_idx):
        self.clock.advance(STEP_S)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.clock.advance(0.002)






@pytest.mark.parametrize("boundary", ["batch_gap", "fetch"])
def test_device_time_labels_follow_the_host_pieces_across_the_iteration_close(tmp_path, monkeypatch, boundary):
    """Batch-end work outside any section is the next iteration's data_loading (batch_gap) or this iteration's
    `between_batches` (fetch), on the host: the device intervals are labelled the same way, section by section."""
    clock = use_virtual_clock(monkeypatch)
    sp = profiler(warmup_steps=2, device_timing_every_n_iterations=1, data_loading_boundary=boundary)
    fit(tmp_path, [sp, SimulatedDevice(sp)], model=BatchEndHeavy(clock), max_epochs=2, enable_checkpointing=False)
    s = find_summary(tmp_path)["section_profiler"]
    table = s["sections"]
    assert s["iterations"] == 14 and table["forward"]["device_mean_ms"] is not None
    for name, row in table.items():
        if row["count"]:
            assert row["device_mean_ms"] == pytest.approx(row["mean_ms"], abs=1e-6), (name, row)
    where = "data_loading" if boundary == "batch_gap" else "between_batches"
    fetch_ms = 8 * 1000 * FETCH_S
    if boundary == "batch_gap":
        assert table["data_loading"]["mean_ms"] == pytest.approx(fetch_ms + 2.0)
    else:
        assert table["data_loading"]["mean_ms"] == pytest.approx(fetch_ms)
        assert table["between_batches"]["mean_ms"] == pytest.approx(2.0)
    assert table[where]["count"] == 14


@pytest.mark.parametrize("every, validation, plain, device", [
    (2, 4, False, None), (3, 1.0, False, None), (2, 4, True, None),
    (2, 4, False, 3), (3, 1.0, False, 3), (2, 4, True, 4), (5, 1.0, True, 8)])
def test_the_taped_step_path_gives_the_figures_and_scalars_of_the_live_one(tmp_path, monkeypatch, every, validation,
                                                                           plain, device):
    """SectionProfiler's step path tapes its events and replays them in batches (automatic optimization,
    ``batch_gap``). The same rich fit, taped and with taping switched off (each switch and close made as its hook
    runs, as with ``fetch``): data loading, gradient accumulation, user sections in
    the step and in the module's batch-end hook, a checkpoint every 4 steps with costly writes (its state read at the
    batch end, mid-tape), a report every 2 steps and a validation every 4 batches, each one right after a report's
    step (its batches are transferred before the due iteration closes), and a report every 3 steps with a validation
    at each epoch's end (the limit's replays: the tape's own test in test_section_profiler.py). Every figure of the
    summary and every scalar logged, with its step, is the same. ``plain``: no section in the step and no
    accumulation, so that most steps are plain ones, which the replay works out as arithmetic (``_plain_step``).
    ``device``: with a device clock (SimulatedDevice; one iteration in ``device`` timed after the first ones), where
    the iterations timed on the device and their neighbours run live and the others tape (taping stops at a batch
    end before a timed iteration and starts again at the close after it): the device figures too are those of the fit
    made live, each event recorded at its boundary's time."""

    class Rich(Sampler):
        def train_dataloader(self):
            return DataLoader(ClockedItems(self.clock, FETCH_S), batch_size=8)

        def training_step(self, batch, batch_idx):
            if not plain:
                with profile_section("noise"):
                    self.clock.advance(0.0003 * (1 + batch_idx % 3))
            return super().training_step(batch, batch_idx)

    plain_steps = []
    arithmetic = SectionProfiler._plain_step

    def counted(self, tape, i):
        done = arithmetic(self, tape, i)
        plain_steps.append(done)
        return done

    turns, counts, runs = [], [], []

    def run(root, taping):
        clock = use_virtual_clock(monkeypatch)
        sp = profiler(report_every_n_steps=every, device_timing_every_n_iterations=device or 1)
        if not taping:
            tape_off(monkeypatch)
        else:
            monkeypatch.setattr(SectionProfiler, "_plain_step", counted)
            watch_runs(monkeypatch, runs)
            for name in ("_resume_taping", "_resume_taping_after_close", "_pause_taping"):
                turn = getattr(SectionProfiler, name)
                monkeypatch.setattr(SectionProfiler, name,
                                    lambda self, turn=turn, name=name: (turns.append(name), turn(self))[1])
        seen = []

        class Watch(Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                seen.append(bool(sp._tape))

        ckpt = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=4, save_top_k=-1)
        fit(root, [sp] + ([SimulatedDevice(sp)] if device else []) + [ckpt, Watch()], model=Rich(clock, every=3),
            max_epochs=2, accumulate_grad_batches=1 if plain else 2, plugins=[CostlySaves(clock)],
            val_check_interval=validation)
        monkeypatch.undo()
        counts.append({name: (sec.host.count, sec.device.count) for name, sec in sp._sections.items()})
        return find_summary(root)["section_profiler"], read_scalars(root), any(seen)

    taped, taped_scalars, taped_seen = run(tmp_path / "taped", True)
    live, live_scalars, live_seen = run(tmp_path / "live", False)
    assert taped_seen and not live_seen  # the first run taped, the second did not
    for summary in (taped, live):
        assert summary.pop("overhead_us_per_step") is not None  # its own time: not on the virtual clock
    if device:  # timed iterations in both, and the taped fit stopped and went on taping more than once
        assert taped["sections"]["forward"]["device_mean_ms"] is not None
        # taping resumes at the close that leaves a timed iteration behind (at a batch end only where none was near)
        assert turns.count("_pause_taping") >= (device < 8), turns
        assert turns.count("_resume_taping_after_close") >= 1 + (device < 8), turns
    else:
        assert not turns
    if plain:  # most steps plain (the others: a sampling section, a checkpoint, a validation, an epoch's start)
        assert taped["iterations"] == 16 and "noise" not in taped["sections"]
        assert sum(plain_steps) >= (6 if device is None else 2 if device == 8 else 0) and not all(plain_steps)
        assert max((k for _, k in runs), default=0) >= (2 if device == 8 else 1 if device is None else 0), runs
    else:
        assert taped["iterations"] == 8 and taped["sections"]["noise"]["count"] == 16 and not any(plain_steps)
    assert taped["sections"]["sampling"]["count"] >= 2 and taped["sections"]["checkpointing"]["count"] >= 2
    assert taped["validation"]["runs"] == (4 if validation == 4 else 2)
    assert taped == live
    assert counts[0] == counts[1] and (counts[0]["sampling"][1] > 0) == bool(device), counts  # (device times: each one)
    keys = {key for key in live_scalars if key.startswith("time")}
    assert keys and {key for key in taped_scalars if key.startswith("time")} == keys
    for key in keys:
        assert taped_scalars[key] == live_scalars[key], key


def test_the_next_timed_iteration_is_the_first_that_device_timed_says_is_timed():
    """``_next_timed``, the bound of a run of plain iterations on a device clock, in closed form: against
    ``_device_timed`` asked iteration by iteration, over warm-ups and cadences (1 times every one)."""
    for warmup in (0, 1, 5):
        for every in (1, 2, 3, 8, 13, 32):
            sp = profiler(warmup_steps=warmup, device_timing_every_n_iterations=every)
            for fit_iteration in range(200):
                first = next(k for k in range(fit_iteration, fit_iteration + every + warmup + 1)
                             if sp._device_timed(k))
                assert sp._next_timed(fit_iteration) == first, (warmup, every, fit_iteration)


@pytest.mark.parametrize("boundary", ["fetch", "batch_gap"])
@pytest.mark.parametrize("timing", [8, 3])
def test_on_a_device_clock_a_run_of_plain_iterations_stops_before_a_mark(tmp_path, monkeypatch, timing, boundary):
    """With a device clock (SimulatedDevice), the iterations between two timed ones tape, and the replay works out
    their plain steps as arithmetic (``_apply_plain_steps``), which records no event: the run must stop before the
    first switch that ends or starts a timed piece (the batch end before a timed iteration), and the flag of marks
    near and the device's events read as the closes one by one read them. 64 plain iterations (steps of three
    lengths), no report, checkpoint or validation to break the runs: every host and device statistic, each section's
    histograms included, is the same as live, the runs took iterations up to the last one they may, and the events
    in flight stay as few as live (with a warm-up of 5, the closes of iterations 16, 32 and 48 fall in runs)."""

    class Plain(TinyModel):
        def __init__(self, clock):
            super().__init__()
            self.clock = clock

        def train_dataloader(self):
            return DataLoader(ClockedItems(self.clock, FETCH_S), batch_size=2)

        def training_step(self, batch, batch_idx):
            self.clock.advance(STEP_S * (1 + batch_idx % 3))
            return super().training_step(batch, batch_idx)

    closes = []

    def run(root, taping):
        clock = use_virtual_clock(monkeypatch)
        sp = profiler(report_every_n_steps=10**6, warmup_steps=5, device_timing_every_n_iterations=timing,
                      data_loading_boundary=boundary)
        pending = []

        class Watch(Callback):
            def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
                pending.append(len(sp._clock._pending))

        if taping:
            watch_runs(monkeypatch, closes)
        else:
            tape_off(monkeypatch)
        fit(root, [sp, SimulatedDevice(sp), Watch()], model=Plain(clock), max_epochs=2, enable_checkpointing=False,
            limit_val_batches=0, num_sanity_val_steps=0)
        monkeypatch.undo()
        assert sp._clock.dropped == 0
        return {name: (sec.host.to_dict(), sec.device.to_dict()) for name, sec in sp._sections.items()}, pending

    (taped, taped_pending), (live, live_pending) = run(tmp_path / "taped", True), run(tmp_path / "live", False)
    assert live["forward"][1]["count"] > 0 and taped == live
    # the events are read as the fit goes (every POLL_EVERY iterations, a run's closes too), a few iterations later
    # than live at most: not all at the end
    assert max(taped_pending) <= max(live_pending) + 7, (taped_pending, live_pending)  # (7: one timed iteration's)
    # a run starts at a plain step of iteration f (nothing timed in f, f + 1: fit iteration = iteration here) and
    # closes f .. f + k - 1, stepping f + 1 .. f + k: the last one's batch end starts f + k + 1, not timed either
    sp = profiler(warmup_steps=5, device_timing_every_n_iterations=timing)
    assert closes and all(not any(sp._device_timed(f + j) for j in range(k + 2)) for f, k in closes), closes
    longest = max(k for f, k in closes)
    # up to the batch end before a timed iteration; with the fetch the next iteration starts at its fetch, not at the
    # batch end before it, so a run takes one iteration more
    assert longest == (timing - 4 + (boundary == "fetch") if timing > 3 else 0), closes


def test_on_a_device_clock_the_replay_at_a_pause_is_counted_once_in_the_overhead(tmp_path, monkeypatch):
    """``overhead_us_per_step`` on a device clock, where a taped batch end before a timed iteration replays the tape
    at once (``_pause_taping``): on the virtual clock every hook's own time is 0, and each batch start replayed one by
    one is made to take 1 ms (a section in every step: no plain ones). The profiler's own time is then the replays'
    time, each counted once (a review found the pauses' replays counted twice, inside the batch end's own time)."""
    clock = use_virtual_clock(monkeypatch)

    class Noisy(TinyModel):
        def train_dataloader(self):
            return DataLoader(ClockedItems(clock, FETCH_S), batch_size=2)

        def training_step(self, batch, batch_idx):
            with profile_section("noise"):
                clock.advance(STEP_S)
            return super().training_step(batch, batch_idx)

    start = SectionProfiler._batch_start_at

    def slow(self, trainer, t):
        if self._replaying:
            clock.advance(0.001)
        start(self, trainer, t)

    monkeypatch.setattr(SectionProfiler, "_batch_start_at", slow)
    replays, pauses = [], []
    replay, pause = SectionProfiler._replay, SectionProfiler._pause_taping

    def timed_replay(self):
        begin, events = clock.t, len(self._tape)
        replay(self)
        if events:
            replays.append(clock.t - begin)

    def counted_pause(self):
        pauses.append(len(replays))
        pause(self)

    monkeypatch.setattr(SectionProfiler, "_replay", timed_replay)
    monkeypatch.setattr(SectionProfiler, "_pause_taping", counted_pause)
    sp = profiler(warmup_steps=5, report_every_n_steps=10**6, device_timing_every_n_iterations=8)
    fit(tmp_path, [sp, SimulatedDevice(sp)], model=Noisy(), max_epochs=1, enable_checkpointing=False,
        limit_val_batches=0, num_sanity_val_steps=0)
    assert len(pauses) >= 2 and sum(replays) >= 0.005, (pauses, replays)
    assert sp._overhead_s == pytest.approx(sum(replays), abs=1e-9)


def test_a_replayed_section_that_fails_stops_no_hook_and_a_crash_still_writes_the_summary(tmp_path, monkeypatch):
    """A user section whose handling fails (injected) in a later callback's batch-end hook, which then raises: the
    failure is recorded where the tape is replayed (``on_exception``), and that hook goes on as live: the summary is
    written and SectionProfiler's marks on the strategy and the section sink are given back."""
    from lightning_perf.measure import sections

    handle = SectionProfiler._section_ended

    def failing(self, name, *args):
        if name == "bad":
            raise RuntimeError("injected")
        return handle(self, name, *args)

    monkeypatch.setattr(SectionProfiler, "_section_ended", failing)
    clock = use_virtual_clock(monkeypatch)
    sp = profiler(report_every_n_steps=2)

    class Late(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if batch_idx == 3:
                assert sp._taping
                with profile_section("bad"):
                    clock.advance(0.001)
                raise ValueError("the user's own error")

    with pytest.raises(ValueError, match="the user's own error"):
        fit(tmp_path, [sp, Late()], model=Sampler(clock, every=3), max_epochs=1, enable_checkpointing=False)
    summary = find_summary(tmp_path)
    assert summary["section_profiler"]["measurement_failures"] == {"profile_section": "RuntimeError: injected"}
    assert summary["section_profiler"]["iterations"] == 3  # the fourth never closed: the fit failed in its batch end
    assert sp._taping is False and sp._transfer is None and sp._strategy is None
    assert sections.current_sink() is not sp


def _plain_tape():
    from lightning_perf.callbacks.section_profiler import _BATCH_START, _STEP_END, _TRANSFER

    return [(_TRANSFER, 1.0), (_BATCH_START, 2.0), ("optimizer_step", 3.0), ("backward", 4.0), ("other", 5.0),
            ("optimizer_step", 6.0), (_STEP_END, 7.0)]


def _add_plain_iterations(tape, n, t, dt):
    """Appends ``n`` plain iterations (``_plain_tape``'s events) to ``tape``, an event every ``dt`` after ``t``."""
    for _ in range(n):
        for code, _ in _plain_tape():
            t += dt
            tape.append((code, t))


def _taping_profiler(piece=None):
    sp = profiler()
    sp._active = sp._taping = True
    sp._current, sp._t0, sp._tape = "data_loading", 0.0, _plain_tape()
    if piece is not None:
        sp._piece = piece
    return sp


def test_a_copy_replays_a_plain_step_as_event_by_event_with_no_trainer(monkeypatch):
    """A deepcopy holds no trainer: the plain step's arithmetic and the events one by one give the same pieces, and
    neither records a failure (the batch start's switch needs no trainer)."""
    import copy

    pieces = []
    for arithmetic in (True, False):
        sp = copy.deepcopy(_taping_profiler())
        sp._trainer_ref = None  # as a copy of a running profiler has it (its trainer is not copied)
        if not arithmetic:
            monkeypatch.setattr(SectionProfiler, "_plain_step", lambda self, tape, i: False)
        sp._replay()
        pieces.append((list(sp._piece.items()), sp._current, sp._t0, sp._ending, dict(sp._failures)))
    assert pieces[0] == pieces[1]
    assert pieces[0][0] == [("data_loading", 1.0), ("transfer", 1.0), ("forward", 1.0), ("optimizer_step", 2.0),
                            ("backward", 1.0), ("other", 1.0)] and not pieces[0][4]


def test_an_interrupt_inside_a_plain_steps_arithmetic_never_applies_it_twice():
    """Ctrl-C (or a signal handler's exception) landing mid-arithmetic: the step's events are consumed before they
    are applied, so the replay that follows (``on_exception``) does not add them again."""
    class Interrupting(dict):
        def __setitem__(self, key, value):
            if key == "forward":
                raise KeyboardInterrupt
            super().__setitem__(key, value)

    sp = _taping_profiler(Interrupting())
    sp._trainer_ref = None
    with pytest.raises(KeyboardInterrupt):
        sp._replay()
    assert sp._tape == [] and not sp._replaying
    sp._replay()
    assert dict(sp._piece) == {"data_loading": 1.0, "transfer": 1.0}  # counted once; the rest of the step is lost


def _random_tape(rng, fetch=False):
    """A tape of many iterations, mostly plain ones, with now and then a user section (in the step or at the batch
    end), a checkpoint write, an accumulating batch or a batch with no transfer; times a few ms apart. ``fetch``: each
    batch's fetch before its transfer (the default boundary), now and then one inside the step (a ``dataloader_iter``
    step) or none."""
    from lightning_perf.callbacks.section_profiler import (_BATCH_START, _CHECKPOINT, _FETCH, _STEP_END, _TRANSFER,
                                                           _USER_SECTION, BETWEEN)

    t, tape = 0.0, []

    def at():
        nonlocal t
        t += rng.uniform(1e-5, 3e-3)
        return t

    for _ in range(rng.randint(20, 300)):
        kind = rng.random()
        if fetch and rng.random() < 0.99:
            tape.append((_FETCH, at(), at()))
        if rng.random() < 0.03:  # before the transfer (an epoch start's hook): its iteration's, not the last one's
            tape.append((_USER_SECTION, "setup", None, rng.uniform(0, 1e-3), False))
        if kind > 0.03:
            tape.append((_TRANSFER, at()))
        tape.append((_BATCH_START, at()))
        if kind < 0.06:
            tape.append((_USER_SECTION, "noise", None, rng.uniform(0, 1e-5), False))
        if fetch and rng.random() < 0.01:
            tape.append((_FETCH, at(), at()))
        if 0.06 <= kind < 0.1:  # accumulating: no optimizer step, the iteration goes on
            tape += [("backward", at()), ("other", at()), (BETWEEN if fetch else "data_loading", at())]
            continue
        tape += [("optimizer_step", at()), ("backward", at()), ("other", at()), ("optimizer_step", at()),
                 (_STEP_END, at())]
        if 0.1 <= kind < 0.13:
            tape.append((_USER_SECTION, "sampling", None, rng.uniform(0, 1e-5), kind < 0.11))
        elif 0.13 <= kind < 0.15:
            tape.append((_CHECKPOINT, rng.uniform(0, 1e-5)))
    return tape


def _profiler_state(sp):
    """Everything the replay and the fold leave behind, to compare two profilers bit for bit."""
    def samples(s):
        return (vars(s.host), list(s.raw), s.seen, s.window_s, s.window_n, s.window_min, s.window_max)

    sections = {name: (samples(sec), sec.kind, sec.parent, sec.closed_by_exception, sec.runs)
                for name, sec in sp._sections.items()}
    return (sections, samples(sp._iteration), sorted(sp._slowest._heap, key=repr), sp._iterations,
            sp._fit_iterations, sp._counted, list(sp._piece.items()), sp._ahead, sp._t0, sp._current, sp._ending,
            sp._next_owner, sp._carved, sp._user_s, sp._iter_calls, sp._end_pieces, sp._end_s, sp._timing,
            sp._final_calls, sp._prev_end, sp._last_folded, dict(sp._failures), sp._tape)


@pytest.mark.parametrize("boundary", ["fetch", "batch_gap"])
@pytest.mark.parametrize("seed", range(60))
def test_runs_of_plain_iterations_replay_as_the_events_one_by_one(monkeypatch, seed, boundary):
    """``_apply_plain_steps`` works out a run of plain iterations (closes and steps) at once; the same random tapes
    replayed event by event (no arithmetic at all) leave every figure, histogram, slowest iteration and state field
    the same, bit for bit: across folds (every FOLD_EVERY iterations), the warm-up's end, reports (with a trainer in
    odd seeds), and tapes replayed in pieces of random length, as the step path replays them."""
    import random
    from types import SimpleNamespace

    rng = random.Random(seed)
    tape = _random_tape(rng, fetch=boundary == "fetch")
    every, warmup = rng.choice([1, 2, 3, 7, 50, 1000]), rng.choice([0, 0, 1, 5])
    cuts = sorted(rng.sample(range(1, len(tape)), k=min(len(tape) - 1, rng.randint(0, 6))))
    states, runs = [], []
    for arithmetic in (True, False):
        monkeypatch.undo()
        if arithmetic:
            apply = SectionProfiler._apply_plain_steps

            def counted(self, tape, i, _apply=apply):
                before = self._iterations
                _apply(self, tape, i)
                runs.append(self._iterations - before)

            monkeypatch.setattr(SectionProfiler, "_apply_plain_steps", counted)
        else:
            monkeypatch.setattr(SectionProfiler, "_plain_step", lambda self, tape, i: False)
        sp = profiler(report_every_n_steps=every, warmup_steps=warmup, data_loading_boundary=boundary)
        sp._active = sp._taping = True
        sp._current, sp._t0, sp._counted = "data_loading", 0.0, warmup == 0
        # a trainer with no logger: reports are made (and reset the windows) where the events one by one make them
        sp._trainer_ref = (lambda: SimpleNamespace(loggers=[], global_step=0, is_global_zero=True)) if seed % 2 else None
        for start, stop in zip([0] + cuts, cuts + [len(tape)]):
            sp._tape.extend(tape[start:stop])
            sp._replay()
        sp._fold()
        states.append(_profiler_state(sp))
    assert states[0] == states[1]
    assert states[0][3] >= 10 and not states[0][21]  # iterations closed, no failure recorded
    if every >= 50 and not cuts:
        assert max(runs) >= 10  # long runs were worked out at once


@pytest.mark.parametrize("boundary", ["fetch", "batch_gap"])
def test_an_interrupt_inside_a_run_of_plain_iterations_neither_loses_nor_repeats_one(monkeypatch, boundary):
    """Ctrl-C landing in the fold that a run of plain iterations reaches (every FOLD_EVERY iterations): what the
    run took is kept as taken, and the replay that follows goes on from there: every iteration closes once."""
    from lightning_perf.callbacks.section_profiler import _FETCH
    from lightning_perf.measure.stats import FOLD_EVERY

    def replayed(interrupt):
        tape = _plain_tape()  # one plain iteration, then 99 more after it, a ms apart
        _add_plain_iterations(tape, 99, tape[-1][1], 0.001)
        if boundary == "fetch":  # each iteration's fetch before its transfer
            tape = [e for event in tape for e in ([(_FETCH, event[1] - 3e-4, event[1] - 2e-4)]
                                                   if event[0] == tape[0][0] else []) + [event]]
        sp = profiler(report_every_n_steps=1000, data_loading_boundary=boundary)
        sp._active = sp._taping = True
        sp._current, sp._t0, sp._tape, sp._trainer_ref = "data_loading", 0.0, tape, None
        events = len(tape)
        if interrupt:
            fold = SectionProfiler._fold

            def once(self, histograms=True):
                monkeypatch.setattr(SectionProfiler, "_fold", fold)
                raise KeyboardInterrupt

            monkeypatch.setattr(SectionProfiler, "_fold", once)
            with pytest.raises(KeyboardInterrupt):
                sp._replay()
            assert 0 < len(sp._tape) < events and sp._iterations == FOLD_EVERY
        sp._replay()
        sp._fold()
        return sp._iterations, sp._iteration.host.count, sp._sections["forward"].host.count

    assert replayed(True) == replayed(False) == (99, 99, 99)


def test_a_section_before_a_runs_first_transfer_stays_with_its_iteration():
    """A user section between an iteration's close and the next transfer (a callback's ``on_train_epoch_start``)
    belongs to the iteration that transfer opens: a run of plain iterations after it leaves it there, as the events
    one by one do (its time in that iteration's total, its call counted once)."""
    from lightning_perf.callbacks.section_profiler import _USER_SECTION

    states = []
    for arithmetic in (True, False):
        sp = profiler(report_every_n_steps=1000)
        sp._active = sp._taping = True
        sp._current, sp._t0, sp._trainer_ref = "data_loading", 0.0, None
        tape = [(_USER_SECTION, "epoch_setup", None, 0.5, False)]
        _add_plain_iterations(tape, 4, 0.0, 1.0)
        sp._tape = tape
        if not arithmetic:
            sp._plain_step = lambda tape, i: False
        sp._replay()
        sp._fold()
        states.append(_profiler_state(sp))
    assert states[0] == states[1]
    sections, iteration = states[0][0], states[0][1]
    assert sections["epoch_setup"][4] == 1 and iteration[0]["count"] == 3  # (the fourth is still open)


def test_a_user_section_opened_in_a_timed_iteration_keeps_its_device_time_where_it_closes_on_the_tape(
        tmp_path, monkeypatch):
    """A section opened at a timed iteration's batch end (live: it takes a device event pair) and closed at the next
    batch start, which tapes (after the live close at the transfer): its device time is read as live, one for each
    span opened in a timed iteration, not dropped with the tape's event."""

    class Span(Callback):
        def __init__(self, clock):
            self.clock, self.open = clock, None

        def close(self):
            if self.open is not None:
                self.open.__exit__(None, None, None)
                self.open = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.clock.advance(0.002)
            self.close()

        def on_train_end(self, trainer, pl_module):
            self.close()  # (one left open would stay open for the tests after this one)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.close()
            self.open = profile_section("span")
            self.open.__enter__()
            self.clock.advance(0.001)

    class Paced(TinyModel):
        def training_step(self, batch, batch_idx):
            clock.advance(0.003)
            return super().training_step(batch, batch_idx)

    results = []
    for taping in (True, False):
        clock = use_virtual_clock(monkeypatch)
        if not taping:
            tape_off(monkeypatch)
        sp = profiler(warmup_steps=0, device_timing_every_n_iterations=4)
        root = tmp_path / str(taping)
        fit(root, [sp, SimulatedDevice(sp), Span(clock)], model=Paced(), max_epochs=3, enable_checkpointing=False,
            num_sanity_val_steps=0, limit_val_batches=0)
        monkeypatch.undo()
        row = find_summary(root)["section_profiler"]["sections"]["span"]
        results.append((row["count"], row["mean_ms"], row["device_mean_ms"], sp._sections["span"].device.count))
    taped, live = results
    assert live[3] == 9 and live[2] == pytest.approx(3.0)
    assert taped == live
