"""SectionLedger's fold by columns (``_fold_columns``) gives exactly the figures of the fold one iteration at a time
(``_fold_each``): random pieces on a virtual clock, user sections, batch-end work, writes, iterations without a
transfer, driven into two ledgers, one of them made to fold one by one."""

import random

import pytest

from lightning_perf.measure.sections.ledger import SLOWEST_KEPT, SectionLedger


class EachLedger(SectionLedger):
    """The reference: every fold one iteration at a time."""

    def _fold_columns(self, unfolded):
        return False


class CountingLedger(SectionLedger):
    """The ledger as it is, counting the folds that took the columns."""

    columns = folds = 0

    def _fold_columns(self, unfolded):
        took = super()._fold_columns(unfolded)
        self.columns += took
        self.folds += 1
        return took


def drive(ledger, seed, iterations, windows):
    """``iterations`` iterations with random pieces; the windows taken where a report falls due (``windows``)."""
    rng = random.Random(seed)
    taken = []
    t = 0.0
    ledger.train_start(manual=False, global_step=0, t=t)
    ledger.epoch_start(t)

    def tick(scale=0.001):
        nonlocal t
        t += rng.expovariate(1.0 / scale)
        return t

    for i in range(iterations):
        if rng.random() < 0.003:
            ledger.epoch_end(tick())
            ledger.epoch_start(tick())
        ledger.fetch_started(tick())
        ledger.fetch_returned(tick(0.003))
        if rng.random() < 0.998:  # (else the batch start closes the iteration: no transfer piece)
            ledger.transfer(tick(0.0002))
        ledger.batch_start(tick())
        for section in ("optimizer_step", "backward", "other", "optimizer_step"):
            ledger.held.append((section, tick(0.004)))
            if rng.random() < 0.1:
                ledger.user_section(rng.choice(("ema", "sampling")), None, rng.uniform(0.0, 0.001), rng.random() < 0.1)
        ledger.batch_end(tick(0.002), ends_iteration=True)
        if rng.random() < 0.008:  # batch-end work: IterationTimer counts it in the next iteration
            ledger.user_section("log_images", None, rng.uniform(0.0, 0.002), False)
        if rng.random() < 0.008:
            ledger.checkpoint(rng.uniform(0.0, 0.01))
        tick(0.0005)
        if windows and ledger.report_due:
            ledger.report_due = False
            taken.append(ledger.take_window())
    ledger.train_end(tick())
    ledger.fit_end(tick())
    table = ledger.table()
    return taken, table, ledger.slowest_iterations(table)


@pytest.mark.parametrize("report_every", [50, 10**6])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_fold_by_columns_gives_the_figures_of_the_fold_one_by_one(seed, report_every):
    figures = []
    for cls in (CountingLedger, EachLedger):
        ledger = cls(warmup_steps=3, report_every_n_steps=report_every, gap_mode=seed == 2)
        figures.append(drive(ledger, seed, 1000, windows=report_every == 50))
        if cls is CountingLedger:
            assert 2 <= ledger.columns < ledger.folds  # (both ways were taken)
    (windows, table, slowest), (ref_windows, ref_table, ref_slowest) = figures
    assert windows == ref_windows  # (floats compared exactly)
    assert table == ref_table
    assert slowest == ref_slowest
    assert len(slowest) == SLOWEST_KEPT
    assert table["forward"]["count"] == 1000 - 3
