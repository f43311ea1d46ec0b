"""The section ledger on its own: boundary events applied in order with their times (a virtual clock: the times are
the test's), and every figure in closed form from those times."""

import pytest

from lightning_perf.measure.sections import ledger as ledger_module
from lightning_perf.measure.sections.ledger import BETWEEN, SectionLedger
from lightning_perf.measure.sections.state import ledger_state, load_ledger


def step_switch(ledger, section, t):
    """A hook inside the step, as SectionProfiler records it: held where no device mark is due, else at once."""
    if ledger.marker is None:
        ledger.held.append((section, t))
    else:
        ledger.switch(section, t)


def step(ledger, t, forward=0.004, backward=0.008, optimizer=0.002, clip=0.001):
    """One automatic-optimization step from its batch start at ``t``: forward, zero_grad (0 s), backward, the
    work after backward (``clip``), the optimizer step; returns the time of its batch end."""
    ledger.batch_start(t)
    t += forward
    step_switch(ledger, "optimizer_step", t)  # zero_grad
    step_switch(ledger, "backward", t)
    t += backward
    step_switch(ledger, "other", t)
    t += clip
    step_switch(ledger, "optimizer_step", t)
    t += optimizer
    ledger.batch_end(t, ends_iteration=True)
    return t


def fetch_ledger(marker=None):
    """A ledger whose data loading is the fetch, trained from 0 s with no warm-up, its first epoch started."""
    ledger = SectionLedger(warmup_steps=0, report_every_n_steps=10**6, gap_mode=False)
    ledger.marker = marker
    ledger.train_start(manual=False, global_step=0, t=0.0)
    ledger.epoch_start(0.0)
    return ledger


def fetch_iterations(ledger, n, t, fetch=0.003, loop=0.0005, transfer=0.0002, end_work=0.0015):
    """``n`` iterations with the fetch as data loading: fetch, the loop's work to the transfer, the transfer, the
    step, ``end_work`` of batch-end hooks before the next fetch. Returns the time after the last batch-end work."""
    for _ in range(n):
        ledger.fetch_started(t)
        t += fetch
        ledger.fetch_returned(t)
        t += loop
        ledger.transfer(t)
        t += transfer
        t = step(ledger, t) + end_work
    return t


def test_an_iteration_is_its_pieces_from_its_fetch_to_the_next_fetch():
    ledger = fetch_ledger()
    t = fetch_iterations(ledger, 5, 0.0)
    ledger.fetch_started(t)  # closes the fifth
    table = ledger.table()
    assert ledger.iterations == 5 and table["forward"]["count"] == 5
    expected = {"data_loading": 3.0, "transfer": 0.2, "forward": 4.0, "backward": 8.0, "other": 1.0,
                "optimizer_step": 2.0, BETWEEN: 0.5 + 1.5}
    for name, ms in expected.items():
        assert table[name]["mean_ms"] == pytest.approx(ms, rel=1e-6), name
    assert ledger.iteration.host.mean == pytest.approx(sum(expected.values()), rel=1e-6)
    assert sum(r["share_pct"] for r in table.values() if r["share_pct"]) == pytest.approx(100.0)


def test_in_batch_gap_mode_the_wait_is_the_next_iterations_and_batch_end_work_carved_out_of_it_this_ones():
    """The gap from a step's end to the next transfer is the next iteration's data loading; a user section and a
    checkpoint write in the batch-end work are carved out of it and belong to the iteration whose step ended."""
    ledger = SectionLedger(warmup_steps=0, report_every_n_steps=10**6, gap_mode=True)
    ledger.train_start(manual=False, global_step=0, t=0.0)
    ledger.epoch_start(0.0)
    t = 0.0
    for i in range(4):
        t += 0.010  # the wait for the batch
        ledger.transfer(t)
        t = step(ledger, t)
        ledger.user_section("sampling", None, 0.005, False)  # in the batch-end hook
        ledger.checkpoint(0.007)
        t += 0.005 + 0.007 + 0.001  # the section, the write, 1 ms of other work in the gap
    ledger.transfer(t + 0.010)
    table = ledger.table()
    assert ledger.iterations == 4
    assert table["sampling"]["parent"] == "other" and table["sampling"]["mean_ms"] == pytest.approx(5.0)
    assert table["checkpointing"]["mean_ms"] == pytest.approx(7.0)
    # data loading: the first iteration's 10 ms; the others' 10 ms + the 1 ms of the previous gap not carved out
    assert table["data_loading"]["total_s"] == pytest.approx(0.010 + 3 * 0.011)
    # the four iterations: everything up to the last one's batch-end work (its last 1 ms of gap is the fifth's)
    assert ledger.iteration.host.total / 1000.0 == pytest.approx(t - 0.001, rel=1e-9)


def test_warm_up_iterations_are_left_out_and_a_report_falls_due_every_n_counted_closes():
    ledger = SectionLedger(warmup_steps=2, report_every_n_steps=3, gap_mode=False)
    ledger.train_start(manual=False, global_step=0, t=0.0)
    due, t = [], 0.0
    for _ in range(8):
        t = fetch_iterations(ledger, 1, t)
        due.append(ledger.report_due)
    ledger.fetch_started(t)
    due.append(ledger.report_due)
    # closes 1..8 happen at the next iteration's fetch: the warm-up two are not counted, then every 3rd close
    assert due == [False, False, False, True, False, False, True, False, False]
    assert ledger.iteration.host.count == 0 and ledger.take_window()[0] == 6  # window figures before histograms
    assert ledger.table()["forward"]["count"] == 6


def test_pieces_wait_for_at_most_fold_every_iterations(monkeypatch):
    monkeypatch.setattr(ledger_module, "FOLD_EVERY", 4)
    ledger = SectionLedger(warmup_steps=0, report_every_n_steps=10**6, gap_mode=False)
    ledger.train_start(manual=False, global_step=0, t=0.0)
    t, waiting = 0.0, []
    for _ in range(20):
        t = fetch_iterations(ledger, 1, t)
        waiting.append(len(ledger.unfolded))
    assert max(waiting) == 3
    ledger.fetch_started(t)
    assert ledger.table()["forward"]["count"] == 20


def test_held_switches_wait_at_most_to_the_fold_and_never_in_the_warm_up_or_an_accumulating_batch(monkeypatch):
    """What is held stays bounded: a warm-up close (no fold follows it) and a batch that does not end its iteration
    apply it; else the fold, every FOLD_EVERY counted iterations. Each iteration holds 10: the close and its owner
    change, the fetch's return, the transfer, the batch start, the step's four, the batch end."""
    monkeypatch.setattr(ledger_module, "FOLD_EVERY", 4)
    ledger = SectionLedger(warmup_steps=3, report_every_n_steps=10**6, gap_mode=False)
    ledger.train_start(manual=False, global_step=0, t=0.0)
    t, held = 0.0, []
    for _ in range(12):  # (fetch_iterations' steps, the held switches counted after each fetch's start)
        ledger.fetch_started(t)
        held.append(len(ledger.held))
        ledger.fetch_returned(t + 0.003)
        ledger.transfer(t + 0.0035)
        t = step(ledger, t + 0.0037) + 0.0015
    assert held == [0, 0, 0, 0, 10, 20, 30, 0, 10, 20, 30, 0]
    ledger.fetch_started(t)  # the twelfth closes: 9 counted, one held
    ledger.fetch_returned(t + 0.003)
    ledger.batch_start(t + 0.0035)
    ledger.batch_end(t + 0.0045, ends_iteration=False)  # accumulating: the next batch is the same iteration's
    assert not ledger.held and ledger.current == BETWEEN
    assert ledger.table()["forward"]["count"] == 9 and ledger.iterations == 12


def test_a_checkpoint_saved_in_batch_end_work_carries_that_iteration_and_loads_back():
    ledger = SectionLedger(warmup_steps=0, report_every_n_steps=10**6, gap_mode=False)
    ledger.train_start(manual=False, global_step=0, t=0.0)
    t = fetch_iterations(ledger, 3, 0.0, end_work=0.0)
    ledger.fetch_started(t)
    t += 0.003
    ledger.fetch_returned(t)
    ledger.transfer(t)
    t = step(ledger, t)  # the fourth iteration's step ended: it closes after the save
    state = ledger_state(ledger, t + 0.001)
    assert state["iterations"] == 4 and state["sections"]["forward"]["host_ms"]["count"] == 4
    assert ledger.iterations == 3 and ledger.table()["forward"]["count"] == 3  # the live figures are untouched
    from lightning_perf.measure.stats.streaming import LogHistogram

    resumed = SectionLedger(warmup_steps=0, report_every_n_steps=10**6, gap_mode=False)
    sections = {name: (s["kind"], s["parent"], LogHistogram.from_dict(s["host_ms"]),
                       LogHistogram.from_dict(s["device_ms"]), s["closed_by_exception"])
                for name, s in state["sections"].items()}
    load_ledger(resumed, state["iterations"], LogHistogram.from_dict(state["iteration_ms"]), sections, 0, 0.0)
    assert resumed.iterations == 4 and resumed.table()["forward"]["count"] == 4
    # three whole iterations (fetch, loop, transfer, step), the fourth's fetch and step, 1 ms of its batch-end work
    assert resumed.iteration.host.total == pytest.approx(3 * (3.0 + 0.5 + 0.2 + 15.0) + 3.0 + 15.0 + 1.0, rel=1e-6)


def test_the_work_after_the_last_iteration_is_its_own_row():
    ledger = SectionLedger(warmup_steps=0, report_every_n_steps=10**6, gap_mode=False)
    ledger.train_start(manual=False, global_step=0, t=0.0)
    t = fetch_iterations(ledger, 2, 0.0, end_work=0.0)
    assert ledger.train_end(t)
    ledger.user_section("final_sampling", None, 0.011, False)
    ledger.checkpoint(0.007)
    ledger.fit_end(t + 0.011 + 0.007 + 0.002)
    row = ledger.final_row
    assert row["total_s"] == pytest.approx(0.020)
    assert row["sections"]["other"]["total_s"] == pytest.approx(0.002)
    assert row["sections"]["checkpointing"] == {"kind": "auto", "parent": None, "count": 1, "total_s": 0.007}
    assert row["sections"]["final_sampling"]["count"] == 1
    assert "final_sampling" not in ledger.table()  # it ran in no iteration


def test_validation_is_off_the_table_and_the_marker_sees_every_change_of_section():
    marks = []
    ledger = fetch_ledger(marker=lambda current, section, end_next, start_next: marks.append((current, section)))
    t = fetch_iterations(ledger, 1, 0.0, end_work=0.001)
    ledger.validation_start(t)
    ledger.validation_end(t + 0.5)
    ledger.fetch_started(t + 0.5 + 0.001)
    assert ledger.validation_runs == 1 and ledger.validation_s == pytest.approx(0.5)
    assert ledger.iteration.host.count == 0 and ledger.table()[BETWEEN]["total_s"] == pytest.approx(0.0025)
    assert (BETWEEN, None) in marks and (None, BETWEEN) in marks
    assert all(a != b for a, b in marks)


def test_held_switches_are_applied_in_order_before_a_user_section_or_a_write_is_carved():
    """The step's switches wait in ``held`` until the fold; a user section or a checkpoint write inside the
    step is carved out of the section it really ran in."""
    ledger = fetch_ledger()
    t = fetch_iterations(ledger, 1, 0.0)
    ledger.fetch_started(t)
    ledger.fetch_returned(t + 0.003)
    ledger.transfer(t + 0.0035)
    ledger.batch_start(t + 0.0037)
    step_switch(ledger, "optimizer_step", t + 0.0077)
    step_switch(ledger, "backward", t + 0.0077)
    assert [section for section, _ in ledger.held[-5:]] == [BETWEEN, "transfer", "forward", "optimizer_step",
                                                            "backward"]
    assert ledger.current != "backward"  # nothing applied yet
    ledger.user_section("ema", None, 0.002, False)  # ran inside backward, ends at t + 0.0107
    assert not ledger.held and ledger.current == "backward"
    step_switch(ledger, "other", t + 0.0157)
    ledger.checkpoint(0.0005)  # a write in the work after backward
    step_switch(ledger, "optimizer_step", t + 0.0167)
    ledger.batch_end(t + 0.0187, ends_iteration=True)
    ledger.fetch_started(t + 0.0202)
    table = ledger.table()
    assert table["backward"]["count"] == 2 and table["backward"]["total_s"] == pytest.approx(0.008 + 0.006)
    assert table["ema"]["parent"] == "backward" and table["ema"]["total_s"] == pytest.approx(0.002)
    assert table["other"]["total_s"] == pytest.approx(0.001 + 0.0005)
    assert table["checkpointing"]["total_s"] == pytest.approx(0.0005)
    assert table["forward"]["total_s"] == pytest.approx(0.008) and table["transfer"]["total_s"] == pytest.approx(4e-4)
    assert ledger.iteration.host.total / 1000.0 == pytest.approx(2 * 0.0202, rel=1e-9)  # the user section in it


def test_with_a_marker_every_switch_is_applied_at_once_and_marked():
    """Where a device mark may be due the ledger holds nothing: each switch reaches the marker when it happens."""
    marks = []
    ledger = fetch_ledger(marker=lambda current, section, end_next, start_next: marks.append((current, section)))
    fetch_iterations(ledger, 1, 0.0)
    assert not ledger.held
    assert marks[2:] == [("data_loading", BETWEEN), (BETWEEN, "transfer"), ("transfer", "forward"),
                         ("forward", "optimizer_step"), ("optimizer_step", "backward"), ("backward", "other"),
                         ("other", "optimizer_step"), ("optimizer_step", BETWEEN)]
