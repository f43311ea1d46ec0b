import time

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from helpers import ManualModel, TinyModel, find_summary, fit, read_scalars, trainer_kwargs, use_virtual_clock
from lightning_perf import IterationTimer


class TwoOptimizerModel(TinyModel):
    """Manual optimization with two optimizers: global_step advances twice per batch."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        for opt in self.optimizers():
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in self.optimizers():
            opt.step()
        return loss

    def configure_optimizers(self):
        half = len(list(self.net.parameters())) // 2
        params = list(self.net.parameters())
        return torch.optim.SGD(params[:half], lr=0.01), torch.optim.SGD(params[half:], lr=0.01)


class PacedEpochs(TinyModel):
    """Known costs on a virtual clock (helpers.VirtualClock), in seconds: ``STEP`` a training_step, ``EPOCH_START``
    and ``EPOCH_END`` in the module's epoch hooks, ``SAVE`` a checkpoint save (the module's on_save_checkpoint),
    ``VAL`` a validation batch (4 a validation)."""

    STEP, EPOCH_START, EPOCH_END, SAVE, VAL = 0.005, 0.003, 0.007, 0.011, 0.002

    def __init__(self, clock):
        super().__init__()
        self.clock = clock

    def training_step(self, batch, batch_idx):
        self.clock.advance(self.STEP)
        return super().training_step(batch, batch_idx)

    def on_train_epoch_start(self):
        self.clock.advance(self.EPOCH_START)

    def on_train_epoch_end(self):
        self.clock.advance(self.EPOCH_END)

    def on_save_checkpoint(self, checkpoint):
        self.clock.advance(self.SAVE)

    def validation_step(self, batch, batch_idx):
        self.clock.advance(self.VAL)
        return super().validation_step(batch, batch_idx)


class SleepyModel(TinyModel):
    """Training steps of at least 5 ms, validation runs (of 4 batches) of at least 1 s: sleep gives lower bounds only.
    An iteration that held a validation would read over 1000 ms, which a stall of a busy machine in a ~5 ms
    iteration does not reach."""

    def training_step(self, batch, batch_idx):
        time.sleep(0.005)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        time.sleep(1.0 / 4)
        return super().validation_step(batch, batch_idx)


def test_summary_figures_of_a_real_fit(tmp_path):
    fit(tmp_path, [IterationTimer(warmup_steps=2)], max_epochs=3)
    s = find_summary(tmp_path)
    assert s["status"] == "completed" and s["schema_version"] == 2
    t = s["iteration_timer"]
    assert t["iterations"] == 24 and t["batches"] == 24 and t["samples"] == 192  # 8 batches of 8, 3 epochs
    # only the warm-up is left out: epoch starts and iterations after validation are real training time
    assert t["excluded"] == {"warmup": 2}
    assert t["measured_iterations"] == 24 - 2
    assert t["validation_runs"] == 3
    ms = t["ms_per_iter"]
    assert ms["min"] <= ms["p50"] <= ms["p95"] <= ms["p99"] <= ms["max"]
    assert t["it_per_s"] == pytest.approx(1000.0 / ms["mean"])
    assert t["samples_per_s"] == pytest.approx(8 * t["it_per_s"], rel=1e-6)
    assert [e["iterations"] for e in t["epochs"]] == [8, 8, 8]
    assert t["device_ms_per_iter"] is None and "CUDA" in t["unavailable"]["device_ms_per_iter"]
    assert t["histogram_ms"]["count"] == t["measured_iterations"]
    run = s["run"]
    assert run["precision"] == "32-true" and run["world_size"] == 1 and run["accumulate_grad_batches"] == 1


def test_measured_iterations_and_warmup_add_up_to_the_training_wall_time(tmp_path, monkeypatch):
    """What the headline predicts: nothing between iterations (epoch starts and ends, checkpoint saves, a
    validation's neighbours) falls outside them; only the last epoch's end work after the last iteration does. On
    the virtual clock (helpers.VirtualClock), where PacedEpochs puts a known cost in each of those places: with real
    time the allowance for the last epoch's end was 2% of the training time plus 15 ms, which one preemption on a
    loaded machine used up. Here every figure is exact, so what falls outside is that work and nothing else."""
    m = PacedEpochs
    fit(tmp_path, [IterationTimer(warmup_steps=2)], model=PacedEpochs(use_virtual_clock(monkeypatch)), max_epochs=3)
    t = find_summary(tmp_path)["iteration_timer"]
    # 24 steps and 3 epochs, each with its start, its end and a save after its validation (left out: eval time)
    assert t["train_time_s"] == pytest.approx(24 * m.STEP + 3 * (m.EPOCH_START + m.EPOCH_END + m.SAVE), abs=1e-9)
    assert t["eval_time_s"] == pytest.approx(3 * 4 * m.VAL, abs=1e-9)
    assert t["warmup_time_s"] == pytest.approx(m.EPOCH_START + 2 * m.STEP, abs=1e-9)
    measured_s = t["histogram_ms"]["sum"] / 1000.0
    outside = t["train_time_s"] - (measured_s + t["warmup_time_s"])
    # what falls outside: the last epoch's end (its save, its end hook), once per fit, not per iteration
    assert outside == pytest.approx(m.SAVE + m.EPOCH_END, abs=1e-9), (outside, t["train_time_s"])


def test_validation_and_sanity_time_are_eval_time_not_iteration_time(tmp_path):
    fit(tmp_path, [IterationTimer(warmup_steps=0)], model=SleepyModel(), max_epochs=1, val_check_interval=4,
        limit_val_batches=4, num_sanity_val_steps=1)
    t = find_summary(tmp_path)["iteration_timer"]
    assert t["ms_per_iter"]["min"] >= 5.0
    # two validation runs of >= 1 s each: counted as eval, none of it inside an iteration
    assert t["eval_time_s"] >= 2.0
    assert t["ms_per_iter"]["max"] < 1000.0
    assert t["validation_runs"] == 2 and t["eval_time_per_validation_s"] >= 1.0
    # the iteration that a validation interrupted is measured without the validation inside it
    assert t["measured_iterations"] == 8
    assert t["sanity_check_time_s"] > 0.0


def test_gradient_accumulation_counts_optimizer_steps(tmp_path):
    fit(tmp_path, [IterationTimer(warmup_steps=0)], max_epochs=1, accumulate_grad_batches=4)
    t = find_summary(tmp_path)["iteration_timer"]
    assert t["batches"] == 8 and t["iterations"] == 2
    assert t["batches_per_s"] == pytest.approx(4 * t["it_per_s"], rel=1e-6)


def test_manual_optimization_counts_batches(tmp_path):
    fit(tmp_path, [IterationTimer(warmup_steps=1)], model=ManualModel(step_every=2), max_epochs=1)
    t = find_summary(tmp_path)["iteration_timer"]
    assert t["manual_optimization"] is True
    assert t["iterations"] == 8 and t["measured_iterations"] == 7
    # max_steps counts optimizer steps (4 here, one every 2 batches); N of time to N is in batches
    assert t["target_steps"] is None


def test_tensorboard_scalars_are_written(tmp_path):
    fit(tmp_path, [IterationTimer(warmup_steps=0, log_every_n_steps=2)], max_epochs=2)
    scalars = read_scalars(tmp_path)
    for key in ("perf/it_per_s", "perf/ms_per_iter", "perf/batches_per_s", "perf/samples_per_s"):
        assert len(scalars[key]) >= 4, key
    for key in ("perf/final_ms_per_iter_p50", "perf/final_ms_per_iter_p95", "perf/final_ms_per_iter_p99",
                "perf/final_it_per_s", "perf/train_time_s", "perf/eval_time_s"):
        assert len(scalars[key]) == 1, key
    its = dict(scalars["perf/it_per_s"])
    ms = dict(scalars["perf/ms_per_iter"])
    for step in its:
        assert its[step] == pytest.approx(1000.0 / ms[step], rel=1e-4)


def test_target_steps_defaults_to_max_steps(tmp_path):
    fit(tmp_path, [IterationTimer(warmup_steps=0)], max_epochs=None, max_steps=12)
    t = find_summary(tmp_path)["iteration_timer"]
    assert t["target_steps"] == 12
    assert t["projected_time_to_target_s"] == pytest.approx(12 * t["ms_per_iter"]["mean"] / 1000.0)
    assert t["projected_remaining_s"] == 0.0 and t["projected_remaining_with_eval_s"] == 0.0


def test_manual_optimization_target_from_max_steps_is_converted_to_batches(tmp_path):
    """Two optimizer steps per batch would otherwise leave a finished run with half its time "remaining"."""
    fit(tmp_path, [IterationTimer(warmup_steps=1)], model=TwoOptimizerModel(), max_epochs=None, max_steps=16)
    t = find_summary(tmp_path)["iteration_timer"]
    assert t["iterations"] == 8 and t["target_steps"] == 8
    assert t["projected_remaining_s"] == 0.0


def test_a_fit_that_fails_in_its_sanity_check_still_names_its_target(tmp_path):
    class BadValidation(TinyModel):
        def validation_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path, [IterationTimer()], model=BadValidation(), max_epochs=None, max_steps=50)
    t = find_summary(tmp_path)["iteration_timer"]
    assert t["target_steps"] == 50 and "projected_time_to_target_s" not in t["unavailable"]


def test_resume_covers_the_whole_run_and_rates_do_not_spike(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit(tmp_path / "a", [IterationTimer(warmup_steps=1), ckpt], max_epochs=None, max_steps=10)
    first = find_summary(tmp_path / "a")["iteration_timer"]
    timer = IterationTimer(warmup_steps=1, log_every_n_steps=2)
    trainer = Trainer(callbacks=[timer], **trainer_kwargs(tmp_path / "b", max_epochs=None, max_steps=20))
    trainer.fit(TinyModel(), ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    t = find_summary(tmp_path / "b")["iteration_timer"]
    assert t["iterations"] == 20 and t["resumed_at_iteration"] == 10
    assert t["measured_iterations"] > first["measured_iterations"]
    assert t["train_time_s"] > first["train_time_s"]
    # A rate can never beat the fastest iteration; one computed from global_step / time-since-resume would.
    fastest_rate = 1000.0 / t["ms_per_iter"]["min"]
    for _, rate in read_scalars(tmp_path / "b")["perf/it_per_s"]:
        assert rate <= fastest_rate * 1.001


def test_logger_less_trainer_still_gets_the_summary(tmp_path):
    fit(tmp_path, [IterationTimer()], logger=False, max_epochs=1)
    assert (tmp_path / "perf_summary.json").is_file()


def test_explicit_summary_path(tmp_path):
    target = tmp_path / "elsewhere" / "mine.json"
    fit(tmp_path / "run", [IterationTimer(summary_path=str(target))], max_epochs=1)
    assert target.is_file()


def test_a_failing_batch_size_fn_warns_and_training_goes_on(tmp_path):
    def broken(batch):
        raise KeyError("images")

    with pytest.warns(UserWarning, match="batch size unknown"):
        fit(tmp_path, [IterationTimer(batch_size_fn=broken)], max_epochs=1)
    t = find_summary(tmp_path)["iteration_timer"]
    assert t["samples_per_s"] is None and "KeyError" in t["unavailable"]["samples_per_s"]
    assert t["it_per_s"] is not None


def test_an_internal_failure_is_recorded_not_raised(tmp_path, monkeypatch):
    timer = IterationTimer()

    def explode(*args, **kwargs):
        raise RuntimeError("probe broke")

    monkeypatch.setattr(timer, "_end_iteration", explode)
    with pytest.warns(UserWarning, match="probe broke"):
        fit(tmp_path, [timer], max_epochs=1)
    s = find_summary(tmp_path)
    assert s["status"] == "completed"
    assert "probe broke" in s["iteration_timer"]["measurement_failures"]["on_train_batch_end"]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"warmup_steps": -1}, r"IterationTimer\(warmup_steps=-1\)"),
        ({"log_every_n_steps": 0}, r"IterationTimer\(log_every_n_steps=0\)"),
        ({"target_steps": 2.5}, r"IterationTimer\(target_steps=2.5\)"),
        ({"batch_size_fn": 3}, r"IterationTimer\(batch_size_fn=3\)"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        IterationTimer(**kwargs)


@pytest.mark.gpu
def test_cuda_device_timing(tmp_path):
    fit(tmp_path, [IterationTimer(warmup_steps=2)], accelerator="gpu", max_epochs=2)
    t = find_summary(tmp_path)["iteration_timer"]
    device = t["device_ms_per_iter"]
    assert device is not None and device["median"] > 0
    assert t["device_events_dropped"] == 0
    assert "device_ms_per_iter" not in t["unavailable"]


def test_batch_size_inference_on_nested_batches():
    from lightning_perf.measure.timing.batch_size import infer_batch_size

    x = torch.zeros(6, 3)
    assert infer_batch_size(x) == 6
    assert infer_batch_size((x, x[:, :1])) == 6
    assert infer_batch_size({"meta": "id", "image": [x]}) == 6
    assert infer_batch_size({"meta": "id"}) is None
    assert infer_batch_size(torch.tensor(1.0)) is None


def test_the_batch_size_path_is_found_once_and_followed_or_found_again():
    from lightning_perf.measure.timing.batch_size import batch_size_path, follow

    x = torch.zeros(6, 3)
    path = batch_size_path({"meta": "id", "image": [x]})
    assert path == ("image", 0)
    assert follow({"meta": "x", "image": [torch.zeros(4, 3)]}, path) == 4
    assert follow((x,), path) is None  # shaped otherwise: the caller looks again


def test_samples_follow_batches_whose_shape_changes(tmp_path):
    """A loader that yields tuples, then dicts: every sample is still counted."""

    class Mixed(TinyModel):
        def train_dataloader(self):
            x = torch.randn(24, 16)
            batches = [(x[:8], x[:8, :1]), {"x": x[8:12], "y": x[8:12, :1]}, (x[12:24], x[12:24, :1])]

            class Loader:  # an iterable of batches (a plain list would be read as three dataloaders)
                def __iter__(self):
                    return iter(batches)

                def __len__(self):
                    return len(batches)

            return Loader()

        def training_step(self, batch, batch_idx):
            x, y = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
            return torch.nn.functional.mse_loss(self(x), y)

    fit(tmp_path, [IterationTimer(warmup_steps=0)], model=Mixed(), max_epochs=1, limit_val_batches=0)
    assert find_summary(tmp_path)["iteration_timer"]["samples"] == 24


def test_run_timestamps_are_to_the_millisecond(tmp_path):
    import datetime as dt

    fit(tmp_path, [IterationTimer()], max_epochs=1)
    run = find_summary(tmp_path)["run"]
    for key in ("started_at", "finished_at"):
        stamp = dt.datetime.fromisoformat(run[key])
        assert len(run[key].split(".")[1].split("+")[0]) == 3 and stamp.tzinfo is not None, run[key]
    assert run["finished_at"] > run["started_at"]


def test_logged_block_holds_the_last_value_tensorboard_got(tmp_path):
    """`report`'s loss columns come from here: the same number the model logged, as TensorBoard recorded it."""
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val_loss")
    fit(tmp_path, [IterationTimer(), ckpt], max_epochs=2)
    s = find_summary(tmp_path)
    tensorboard = read_scalars(tmp_path)["val_loss"]
    last = max(tensorboard)[1]  # the point at the highest step
    assert s["logged"]["values"]["val_loss"] == pytest.approx(last, rel=1e-6)
    assert s["logged"]["monitor"] == "val_loss"


def test_the_step_path_keeps_bounded_memory_and_reads_see_every_iteration(tmp_path, monkeypatch):
    """Iteration times wait in a list for at most FOLD_EVERY iterations; any read (here the histogram mid-fit)
    folds them first, so nothing is missing from what a reader sees."""
    from lightning_perf.callbacks.iteration_timer import callback as module

    monkeypatch.setattr(module, "FOLD_EVERY", 4)
    timer = IterationTimer(warmup_steps=0)
    seen = []

    class Watch(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            waiting = len(timer._pending_ms)
            read = timer._histogram().count if batch_idx == 7 else None  # a read now and then
            seen.append((waiting, read, timer.iterations))

    fit(tmp_path, [timer, Watch()], max_epochs=3)
    assert max(w for w, _, _ in seen) == 3
    reads = [(count, iterations) for _, count, iterations in seen if count is not None]
    assert len(reads) == 3 and all(count == iterations for count, iterations in reads)
    s = find_summary(tmp_path)["iteration_timer"]
    assert s["measured_iterations"] == 24 and len(timer._pending_ms) == 0


class PacedByIteration(TinyModel):
    """On a virtual clock (helpers.VirtualClock): the fit's i-th training step (from 1) takes i ms, a validation
    batch 50 ms; ``validated_after`` lists the training steps each validation came after."""

    def __init__(self, clock):
        super().__init__()
        self.clock, self.i, self.validated_after = clock, 0, []

    def training_step(self, batch, batch_idx):
        self.i += 1
        self.clock.advance(self.i / 1000.0)
        return super().training_step(batch, batch_idx)

    def on_validation_start(self):
        if not self.trainer.sanity_checking:
            self.validated_after.append(self.i)

    def validation_step(self, batch, batch_idx):
        self.clock.advance(0.05)
        return super().validation_step(batch, batch_idx)


def recording_device(target):
    """helpers.SimulatedDevice for ``target`` (device time = the virtual clock), whose clock keeps the ms of every
    counted device interval it reads (``.seen``) and counts the events recorded (``.marks``)."""
    from helpers import SimulatedDevice

    class Recording(SimulatedDevice):
        seen, marks = [], [0]

        def on_train_start(self, trainer, pl_module):
            super().on_train_start(trainer, pl_module)
            clock = target._clock
            mark, poll = clock.mark, clock.poll_labeled

            def counting_mark(*args, **kwargs):
                self.marks[0] += 1
                return mark(*args, **kwargs)

            def keeping_poll():
                out = poll()
                self.seen.extend(round(ms, 6) for _, ms in out)
                return out

            clock.mark, clock.poll_labeled = counting_mark, keeping_poll

    return Recording(target)


def device_timed(f, warmup, every):
    """The schedule the docs state: none of the warm-up, the first n counted iterations, then one in n."""
    return f > warmup and (f - 1 - warmup < every or (f - 1 - warmup) % every == 0)


@pytest.mark.parametrize("every, validate_every, flops", [(1, 4, None), (4, 4, None), (4, None, None), (4, 3, None),
                                                           (4, None, "auto")])
def test_device_time_comes_from_the_iterations_timed_on_the_device(tmp_path, monkeypatch, every, validate_every,
                                                                    flops):
    """A simulated device (device time = the host's virtual clock) under IterationTimer, warm-up 2: exactly the
    iterations of the schedule are timed, each from its start to its end (iteration i takes i ms, so the device
    intervals read name them), with an event at each end of a timed iteration (one between two timed ones), and a
    new start after what the chain leaves out (a validation, the FLOP count) where a timed iteration follows; a
    timed iteration that follows a validation is timed from the validation's end, as its host time leaves the
    validation out."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)  # HostEvents are always complete
    clock = use_virtual_clock(monkeypatch)
    timer = IterationTimer(warmup_steps=2, device_timing_every_n_iterations=every, flops_per_batch=flops)
    device, model = recording_device(timer), PacedByIteration(clock)
    validation = dict(val_check_interval=validate_every, limit_val_batches=2) if validate_every else \
        dict(limit_val_batches=0)
    fit(tmp_path, [timer, device], model=model, max_epochs=3, enable_checkpointing=False, **validation)
    t = find_summary(tmp_path)["iteration_timer"]
    assert t["iterations"] == 24 and t["ms_per_iter"]["max"] == pytest.approx(24.0)  # validations cut out
    timed = [f for f in range(1, 25) if device_timed(f, 2, every)]
    assert every != 4 or timed == [3, 4, 5, 6, 7, 11, 15, 19, 23]
    assert sorted(device.seen) == [float(f) for f in timed]
    assert t["device_timed_iterations"] == len(timed) and t["device_timing_every_n_iterations"] == every
    device_ms = t["device_ms_per_iter"]
    assert device_ms["mean"] == pytest.approx(sum(timed) / len(timed), abs=1e-6)
    assert (device_ms["min"], device_ms["max"]) == (pytest.approx(min(timed)), pytest.approx(max(timed)))
    assert bool(model.validated_after) == bool(validate_every) and (flops is None) == (t["flops_source"] is None)
    ends = [f for f in range(1, 25) if device_timed(f, 2, every) or device_timed(f + 1, 2, every)]
    restarts = [v for v in model.validated_after if device_timed(v + 1, 2, every)] + (
        [2] if flops and device_timed(3, 2, every) else [])  # the FLOPs are counted after iteration 2
    assert device.marks[0] == len(ends) + len(restarts), (device.marks, ends, restarts)
    assert t["device_events_dropped"] == 0 and "device_ms_per_iter" not in t["unavailable"]


@pytest.mark.parametrize("in_suite", [False, True])
@pytest.mark.parametrize("warmup, validate_every", [(0, None), (0, 4), (3, 4), (2, 3)])
def test_iteration_timer_times_on_the_device_the_iterations_section_profiler_does(tmp_path, monkeypatch, warmup,
                                                                                  validate_every, in_suite):
    """The same warm-up and n give the same iterations, in a fit: the device intervals IterationTimer reads are
    those of the schedule, and SectionProfiler's forward section is timed on the device in as many iterations.
    With no warm-up, the first iteration is timed from the epoch's start."""
    from lightning_perf import PerfSuite, SectionProfiler

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    clock = use_virtual_clock(monkeypatch)
    timer = IterationTimer(warmup_steps=warmup, device_timing_every_n_iterations=4)
    profiler = SectionProfiler(warmup_steps=warmup, device_timing_every_n_iterations=4, print_reports=False)
    from helpers import SimulatedDevice

    device = recording_device(timer)
    callbacks = [PerfSuite([timer, profiler])] if in_suite else [timer, profiler]
    validation = dict(val_check_interval=validate_every, limit_val_batches=1) if validate_every else \
        dict(limit_val_batches=0)
    fit(tmp_path, callbacks + [device, SimulatedDevice(profiler)], model=PacedByIteration(clock), max_epochs=4,
        enable_checkpointing=False, **validation)
    s = find_summary(tmp_path)
    timed = [f for f in range(1, 33) if device_timed(f, warmup, 4)]
    assert sorted(device.seen) == [float(f) for f in timed]
    assert s["iteration_timer"]["device_timed_iterations"] == len(timed)
    assert profiler._ledger.sections["forward"].device.count == len(timed)
    assert [timer._device_timed(i) for i in range(199)] == [profiler._device.timed(i) for i in range(199)]


@pytest.mark.parametrize("value", [0, -1, 2.5, "8", None, True])
def test_device_timing_every_n_iterations_must_be_a_positive_int(value):
    with pytest.raises(ValueError, match=r"IterationTimer\(device_timing_every_n_iterations="):
        IterationTimer(device_timing_every_n_iterations=value)


def test_a_checkpoint_carries_the_device_intervals_already_passed(tmp_path, monkeypatch):
    """The device's intervals are read every 16 iterations; a checkpoint between two reads still holds every one
    the device has passed (a read that never waits), so a resume's `device_timed_iterations` misses none."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: None)
    clock = use_virtual_clock(monkeypatch)
    timer = IterationTimer(warmup_steps=1, device_timing_every_n_iterations=1)
    saves = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1, filename="{step}")
    fit(tmp_path, [timer, recording_device(timer), saves], model=PacedByIteration(clock), max_epochs=2,
        limit_val_batches=0)
    carried = torch.load(tmp_path / "ckpt" / "step=12.ckpt", weights_only=False)["callbacks"]["IterationTimer"]
    assert carried["device_histogram_ms"]["count"] == 11  # iterations 2 to 12: the first is the warm-up
    assert find_summary(tmp_path)["iteration_timer"]["device_timed_iterations"] == 15
