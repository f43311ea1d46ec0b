"""IterationTimer's ledger on its own: the loop's events applied in order on a virtual clock (the times are the
test's), and every count and time in closed form from those times."""

import pytest

from lightning_perf.callbacks.core.state import StateError, StateReader
from lightning_perf.measure.timing.iteration_ledger import IterationLedger
from lightning_perf.measure.timing.tail import AFTER_VALIDATION, CHECKPOINT, EPOCH_START, GC, OWN_WORK
from tests.helpers import VirtualClock


def ledger_on(clock, **kwargs):
    """A ledger on ``clock`` whose fit has set up and started training in epoch 0 at the clock's time."""
    ledger = IterationLedger(clock=clock, **kwargs)
    ledger.fit_setup()
    ledger.start_training(epoch=0)
    ledger.epoch_start(0)
    return ledger


def iterate(ledger, clock, seconds, batches=1, samples=8, items=None):
    """One iteration of ``seconds``, its ``batches`` ending in it with ``samples`` (and ``items``) each: the last one
    ends the iteration."""
    clock.advance(seconds)
    for _ in range(batches - 1):
        ledger.add_batch(samples, items)
    ledger.end_iteration(samples, items)


def validate(ledger, clock, seconds):
    ledger.validation_start()
    clock.advance(seconds)
    return ledger.validation_end()


def test_a_validation_inside_an_iteration_is_eval_time_cut_out_of_it():
    """10 iterations of 5 ms, a 30 ms validation in the middle of the 4th: every iteration is 5 ms, the mean too;
    eval is 30 ms, training 50 ms."""
    clock = VirtualClock()
    ledger = ledger_on(clock, warmup_steps=0)
    for i in range(10):
        if i == 3:
            clock.advance(0.002)
            assert validate(ledger, clock, 0.030) == pytest.approx(0.030)
            iterate(ledger, clock, 0.003)
        else:
            iterate(ledger, clock, 0.005)
    hist = ledger.histogram()
    assert hist.count == 10 and hist.mean == pytest.approx(5.0)
    assert hist.summary()["max"] == pytest.approx(5.0, rel=0.01)
    assert ledger.eval_time_s() == pytest.approx(0.030) and ledger.validation_runs == 1
    assert ledger.train_time_s() == pytest.approx(0.050)
    ledger.finish()
    clock.advance(1.0)  # after the end nothing more is training
    assert ledger.train_time_s() == pytest.approx(0.050)


def test_a_running_validation_is_not_training_time():
    clock = VirtualClock()
    ledger = ledger_on(clock)
    iterate(ledger, clock, 0.005)
    ledger.validation_start()
    clock.advance(0.100)
    assert ledger.train_time_s() == pytest.approx(0.005)


def test_the_warmup_is_left_out_of_the_distribution_and_timed_on_its_own():
    """3 warm-up iterations of 20 ms, then 7 of 5 ms: 7 measured at 5 ms, the warm-up's 60 ms and count kept apart,
    its batches out of the measured counts but in the run's."""
    clock = VirtualClock()
    ledger = ledger_on(clock, warmup_steps=3)
    for i in range(10):
        iterate(ledger, clock, 0.020 if i < 3 else 0.005, batches=2, samples=8, items=100)
    assert ledger.iterations == 10 and ledger.fit_iterations == 10
    assert ledger.histogram().count == 7 and ledger.histogram().mean == pytest.approx(5.0)
    assert ledger.excluded == {"warmup": 3} and ledger.warmup_time_s == pytest.approx(0.060)
    assert (ledger.batches, ledger.samples, ledger.items) == (20, 160, 2000)
    assert (ledger.counted_batches, ledger.counted_samples, ledger.counted_items) == (14, 112, 1400)
    assert ledger.train_time_s() == pytest.approx(0.095)


def test_the_startup_runs_from_the_fits_setup_to_the_training_start_and_sanity_checks_are_apart():
    clock = VirtualClock()
    ledger = IterationLedger(clock=clock)
    ledger.fit_setup()
    clock.advance(0.200)
    ledger.sanity_start()
    clock.advance(0.040)
    ledger.sanity_end()
    clock.advance(0.010)
    ledger.start_training(epoch=0)
    assert ledger.startup_time_s == pytest.approx(0.250) and ledger.sanity_time_s == pytest.approx(0.040)
    assert ledger.fits == 1 and ledger.eval_time_s() == 0.0 and ledger.train_time_s() == 0.0


@pytest.mark.parametrize("fold_every", [1, 4, 64])
def test_iteration_times_wait_at_most_fold_every_and_every_read_sees_all_of_them(fold_every):
    clock = VirtualClock()
    ledger = ledger_on(clock, warmup_steps=2, fold_every=fold_every)
    for i in range(2 + 2 * fold_every + 1):
        iterate(ledger, clock, 0.001 * (i + 1))
        measured = max(0, i - 1)
        assert len(ledger.pending_ms) == measured % fold_every  # folded exactly at each boundary
        assert ledger.host.count == measured - measured % fold_every
    assert ledger.histogram().count == 2 * fold_every + 1 and not ledger.pending_ms
    series = ledger.series()
    assert ledger.host.total == pytest.approx(sum(range(3, 2 * fold_every + 4)))  # ms of iterations 3..n
    assert series.to_dict() == ledger.series().to_dict()  # a second read folds nothing new


def test_the_logging_window_holds_the_measured_iterations_since_the_last_log():
    """Window 1: 4 iterations of 5 ms, 2 batches of 8 samples each; its rates are closed-form. Then the tail
    threshold is 2x their median, and window 2's 20 ms iteration is its tail."""
    clock = VirtualClock()
    ledger = ledger_on(clock, warmup_steps=0, fold_every=4)
    for _ in range(4):
        iterate(ledger, clock, 0.005, batches=2, samples=8)
    window = ledger.take_window()
    rates = window.rates(samples_known=True, items_known=False, tail_known=False, flops_per_batch=1e9,
                         peak_flops=1e12)
    assert rates["perf/it_per_s"] == pytest.approx(200.0) and rates["perf/ms_per_iter"] == pytest.approx(5.0)
    assert rates["perf/batches_per_s"] == pytest.approx(400.0) and rates["perf/samples_per_s"] == pytest.approx(3200)
    assert rates["perf/tflops_per_s"] == pytest.approx(0.4) and rates["perf/mfu_pct"] == pytest.approx(40.0)
    assert "perf/items_per_s" not in rates and "perf/tail_time_pct" not in rates
    ledger.update_tail_threshold()
    assert ledger.tail_threshold_s == pytest.approx(0.010, rel=0.02)  # (the histogram's median: within 1%)
    iterate(ledger, clock, 0.005)
    iterate(ledger, clock, 0.020)
    window = ledger.take_window()
    assert window.iterations == 2 and window.seconds == pytest.approx(0.025) and window.tail_s == pytest.approx(0.020)
    rates = window.rates(samples_known=True, items_known=False, tail_known=True, flops_per_batch=None,
                         peak_flops=None)
    assert rates["perf/tail_time_pct"] == pytest.approx(80.0)
    assert ledger.take_window().iterations == 0


def test_the_slowest_iterations_keep_what_coincided_with_them():
    """A checkpoint write and a GC land in the 6th iteration (40 ms), a validation before the 9th (25 ms); the
    others take 5 ms. The two slow ones are the slowest, with their causes and positions; the causes' book has
    them under their first cause."""
    clock = VirtualClock()
    ledger = ledger_on(clock, warmup_steps=0, keep_slowest=2)
    ledger.position = lambda: (100 + ledger.iterations, 3)
    for i in range(10):
        if i == 5:
            ledger.checkpoint_saved()
            ledger.gc_flagged(0.004)
        if i == 8:
            validate(ledger, clock, 1.0)
        iterate(ledger, clock, {5: 0.040, 8: 0.025}.get(i, 0.005))
    rows = {row["iteration"]: row for row in ledger.slowest.entries()}
    assert set(rows) == {6, 9}
    assert rows[6]["ms"] == pytest.approx(40.0) and rows[6]["causes"] == ["checkpoint", "gc"]
    assert rows[6]["gc_pause_ms"] == pytest.approx(4.0) and (rows[6]["step"], rows[6]["epoch"]) == (106, 3)
    assert rows[9]["ms"] == pytest.approx(25.0) and rows[9]["causes"] == ["after_validation"]
    assert {name: hist.count for name, hist in ledger.causes.hists.items()} == {
        "epoch_start": 1, "checkpoint": 1, "after_validation": 1}  # (the first epoch's start: the first iteration's)
    assert ledger.causes.also == {"checkpoint": {"gc": 1}}
    assert ledger.flags == 0  # taken at each iteration's end


def test_a_flag_set_in_an_iteration_goes_with_it_only():
    clock = VirtualClock()
    ledger = ledger_on(clock, warmup_steps=0)
    assert ledger.flags == EPOCH_START  # the first epoch's start falls in the first iteration
    iterate(ledger, clock, 0.005)
    ledger.checkpoint_saved()
    ledger.gc_flagged(0.002)
    validate(ledger, clock, 0.010)  # a collection during validation is not training's; the checkpoint stays
    assert ledger.flags == CHECKPOINT | AFTER_VALIDATION and ledger.gc_pause_s == 0.0
    ledger.gc_flagged(0.002)
    ledger.skip(0.050)  # a collection in the FLOP count is not the next iteration's either
    assert not ledger.flags & GC and ledger.gc_pause_s == 0.0


def test_slow_flags_are_asked_for_slow_iterations_only():
    clock = VirtualClock()
    ledger = ledger_on(clock, warmup_steps=0, keep_slowest=1)
    asked = []
    ledger.slow_flags = lambda: asked.append(ledger.iterations) or 0
    for seconds in (0.005, 0.004, 0.004, 0.009, 0.005):
        iterate(ledger, clock, seconds)
    assert asked == [1, 4]  # slower than the one kept


def test_skipped_work_is_left_out_of_every_clock():
    """A 50 ms FLOP count between iterations 2 and 3 is in no iteration, epoch or training time."""
    clock = VirtualClock()
    ledger = ledger_on(clock, warmup_steps=0)
    iterate(ledger, clock, 0.005)
    iterate(ledger, clock, 0.005)
    clock.advance(0.050)
    ledger.skip(0.050)
    iterate(ledger, clock, 0.005)
    ledger.epoch_end(0)
    assert ledger.histogram().mean == pytest.approx(5.0) and ledger.train_time_s() == pytest.approx(0.015)
    assert ledger.epochs.records == [{"epoch": 0, "time_s": pytest.approx(0.015), "iterations": 3,
                                      "it_per_s": pytest.approx(200.0), "eval_time_s": 0.0}]


def test_epochs_cut_their_validation_and_name_their_start():
    clock = VirtualClock()
    ledger = ledger_on(clock, warmup_steps=0)
    for epoch in range(2):
        if epoch:
            ledger.epoch_start(epoch)
            assert ledger.flags & EPOCH_START
        for _ in range(4):
            iterate(ledger, clock, 0.005)
        validate(ledger, clock, 0.020)
        ledger.epoch_end(epoch)
    assert [(r["epoch"], r["iterations"], r["time_s"], r["eval_time_s"]) for r in ledger.epochs.records] == [
        (0, 4, pytest.approx(0.020), pytest.approx(0.020)), (1, 4, pytest.approx(0.020), pytest.approx(0.020))]


def test_own_work_names_an_iteration_only_where_it_made_it_slow():
    """With a 5 ms median: 2 ms of lightning_perf's own work in a 7 ms iteration names it; in a 30 ms one (slow
    without it: 28 ms) it does not."""
    clock = VirtualClock()
    ledger = ledger_on(clock, warmup_steps=0)
    for _ in range(5):
        iterate(ledger, clock, 0.005)
    for total in (0.007, 0.030):
        ledger.own_work(0.002)
        iterate(ledger, clock, total)
    assert {name: hist.count for name, hist in ledger.causes.hists.items()} == {"epoch_start": 1, "lightning_perf": 1}
    assert ledger.causes.own_s == pytest.approx(0.002)


def test_a_fold_is_own_work_of_the_next_iteration():
    ticks = TickClock()
    ledger = ledger_on(ticks, warmup_steps=0, fold_every=2)
    OWN_WORK.watch(ledger.own_work)
    try:
        ticks.advance(0.005)
        ledger.end_iteration()
        assert ledger.own_s == 0.0
        ticks.advance(0.005)
        ledger.end_iteration()  # folds: two clock reads around it, one tick apart
        assert ledger.own_s == pytest.approx(ticks.tick)
    finally:
        OWN_WORK.unwatch(ledger.own_work)


class TickClock(VirtualClock):
    """Moves ``tick`` seconds at every read."""

    tick = 1e-6

    def __call__(self):
        self.t += self.tick
        return self.t


def run_of(clock, warmup_steps=1):
    """A ledger after 6 iterations of 5 ms (the 4th with a checkpoint write), a 20 ms validation and a closed epoch
    0, then 2 iterations into epoch 1."""
    ledger = ledger_on(clock, warmup_steps=warmup_steps, keep_slowest=3, fold_every=4)
    for i in range(6):
        if i == 3:
            ledger.checkpoint_saved()
        iterate(ledger, clock, 0.005 if i != 3 else 0.012, batches=2, samples=4, items=10)
    validate(ledger, clock, 0.020)
    ledger.epoch_end(0)
    ledger.epoch_start(1)
    iterate(ledger, clock, 0.005, batches=2, samples=4, items=10)
    iterate(ledger, clock, 0.005, batches=2, samples=4, items=10)
    return ledger


def test_the_state_goes_round_a_checkpoint():
    clock = VirtualClock()
    ledger = run_of(clock)
    state = ledger.to_state()
    assert not ledger.pending_ms  # the state holds every measured iteration
    resumed = IterationLedger(keep_slowest=3, clock=clock, warmup_steps=1)
    resumed.load(StateReader(state))
    again = resumed.to_state()
    assert again.pop("open_epoch") is None  # carried until the resumed fit starts it again
    slowest = again["tail"].pop("slowest")  # (the order offered starts again)
    assert sorted(row[:1] + row[2:] for row in slowest) == sorted(row[:1] + row[2:] for row in state["tail"]["slowest"])
    state = {**state, "tail": {k: v for k, v in state["tail"].items() if k != "slowest"}}
    assert again == {k: v for k, v in state.items() if k != "open_epoch"}
    assert resumed.resumed_at == 8 and resumed.iterations == 8 and resumed.fits == 1
    assert resumed.histogram().count == 7 and resumed.histogram().mean == pytest.approx(ledger.histogram().mean)
    assert resumed.prior_train_time_s == pytest.approx(0.047) and resumed.prior_eval_time_s == pytest.approx(0.020)
    assert resumed.slowest.entries() == ledger.slowest.entries()
    assert resumed.epochs.carried == {"epoch": 1, "iterations": 2, "time_s": pytest.approx(0.010),
                                      "eval_time_s": 0.0}
    # the resumed fit goes on: its time adds to the carried one, its warm-up is its own
    resumed.fit_setup()
    resumed.start_training(epoch=1)
    iterate(resumed, clock, 0.008)
    iterate(resumed, clock, 0.005)
    resumed.epoch_end(1)
    assert resumed.iterations == 10 and resumed.excluded == {"warmup": 2} and resumed.histogram().count == 8
    assert resumed.train_time_s() == pytest.approx(0.060)
    assert resumed.epochs.records[-1] == {"epoch": 1, "iterations": 4, "time_s": pytest.approx(0.023),
                                          "it_per_s": pytest.approx(4 / 0.023), "eval_time_s": 0.0}


@pytest.mark.parametrize("key, value, named", [
    ("iterations", -3, "iterations"),
    ("histogram_ms", {"count": "many"}, "histogram_ms"),
    ("tail", {"slowest": [[1.0, 2.0]], "gc_pause_s": 0.0, "causes": {}}, "tail.slowest"),
    ("tail", {"slowest": [], "gc_pause_s": "none", "causes": {}}, "tail.gc_pause_s"),
    ("epochs", [{"epoch": "first"}], "epoch"),
])
def test_a_bad_state_is_rejected_with_its_key_and_nothing_is_assigned(key, value, named):
    clock = VirtualClock()
    ledger = run_of(clock)
    state = {**ledger.to_state(), key: value}
    fresh = run_of(VirtualClock(), warmup_steps=0)
    before = fresh.to_state()
    with pytest.raises(StateError, match=named):
        fresh.load(StateReader(state))
    assert fresh.to_state() == before and fresh.resumed_at is None
