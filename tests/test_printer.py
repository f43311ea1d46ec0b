"""SectionProfiler's periodic tables are printed from the printer's thread: in the order of the reports, every one
before anything printed at the end of training, a failure recorded on the callback, and a flush never hangs."""

import logging
import os
import queue
import threading
import time

import pytest

from lightning_perf import SectionProfiler
from lightning_perf.callbacks.core import printer as _printer
from lightning_perf.callbacks.section_profiler import window as _section_window
from tests.helpers import find_summary, fit


def test_the_periodic_tables_come_from_the_printers_thread_in_order_and_before_the_final_table(tmp_path, caplog,
                                                                                                 monkeypatch):
    build = _section_window.report_table

    def slow(*args):  # a slow stream: the last tables are still queued when training ends
        time.sleep(0.02)
        return build(*args)

    monkeypatch.setattr(_section_window, "report_table", slow)
    with caplog.at_level(logging.INFO):
        fit(tmp_path, [SectionProfiler(warmup_steps=0, report_every_n_steps=2)], max_epochs=2)
    stopped = [i for i, r in enumerate(caplog.records) if r.getMessage().startswith("`Trainer.fit` stopped")]
    last_table = max(i for i, r in enumerate(caplog.records) if "SectionProfiler report" in r.getMessage())
    assert len(stopped) == 1 and last_table < stopped[0]  # flushed at the epoch's end, before Lightning's line
    ours = [r for r in caplog.records if "=== SectionProfiler" in r.getMessage()]
    reports = [r for r in ours if "SectionProfiler report" in r.getMessage()]
    assert [r.getMessage().split("(iteration ")[1].split(",")[0] for r in reports] == [str(s) for s in range(2, 17, 2)]
    assert {r.threadName for r in reports} == {"lightning_perf-report"}
    assert ours[-1].getMessage().startswith("=== SectionProfiler: ")  # the final table, on the training thread
    assert ours[-1].threadName == threading.current_thread().name and len(ours) == len(reports) + 1


def test_a_table_that_fails_is_recorded_and_training_goes_on(tmp_path, monkeypatch):
    def broken(*args):
        raise ValueError("no table")

    monkeypatch.setattr(_section_window, "report_table", broken)
    with pytest.warns(UserWarning, match="measurement failed in `report table`"):
        trainer = fit(tmp_path, [SectionProfiler(warmup_steps=0, report_every_n_steps=2)], max_epochs=1)
    assert trainer.global_step == 8
    summary = find_summary(tmp_path)["section_profiler"]
    assert summary["measurement_failures"] == {"report table": "ValueError: no table"}
    assert summary["iterations"] == 8  # the figures are not the table's: all there


def test_a_flush_waits_for_the_tables_handed_over_and_never_longer_than_its_timeout():
    printer = _printer._Printer()
    assert printer.flush()  # nothing started: nothing to wait for
    release, printed = threading.Event(), []

    def slow(text):
        release.wait(10.0)  # a logger's stream that blocks
        return text

    failures = []
    original = _printer.rank_zero_info
    _printer.rank_zero_info = printed.append
    try:
        printer.put(slow, ("first",), failures.append)
        printer.put(lambda: 1 / 0, (), failures.append)
        printer.put(str.upper, ("third",), failures.append)
        assert printer.flush(timeout=0.05) is False  # the stream blocks: the flush gives up, training goes on
        release.set()
        assert printer.flush(timeout=10.0)
    finally:
        _printer.rank_zero_info = original
    assert printed == ["first", "THIRD"]  # in order; the one that failed told its callback and was skipped
    assert [type(err) for err in failures] == [ZeroDivisionError]
    inner = []
    printer.put(lambda: inner.append(printer.flush(timeout=10.0)) or "x", (), failures.append)
    start = time.perf_counter()
    assert printer.flush(timeout=10.0) and inner == [False]  # on its own thread: no wait for itself
    assert time.perf_counter() - start < 5.0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_waits_for_the_table_being_written_and_the_child_can_write(monkeypatch):
    """A DataLoader forks its workers right after an epoch's last report: a child forked mid-write would inherit the
    stream's lock held by a thread it does not have, and hang at its first write."""
    entered, release, printed = threading.Event(), threading.Event(), []

    def write(text):
        entered.set()
        release.wait(10.0)  # the stream is slow: the write takes a while
        printed.append(text)

    monkeypatch.setattr(_printer, "rank_zero_info", write)
    _printer.PRINTER.put(str, ("table",), lambda err: None)
    assert entered.wait(10.0)
    threading.Timer(0.3, release.set).start()
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: the lock it inherited is its own and free, none of the parent's tables is pending
        child = _printer.PRINTER
        os._exit(3 if child._writing.locked() or child.pending() or child._thread is not None else 0)
    waited = time.perf_counter() - start
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert waited >= 0.2 and printed == ["table"]  # the fork waited until the table was written
    assert _printer.PRINTER.flush()


class _CountingQueue(queue.SimpleQueue):
    """The printer's wake-up queue, counting what is put in it (a wake of the printer)."""

    puts = 0

    def put(self, item, block=True, timeout=None):
        self.puts += 1
        super().put(item, block, timeout)


def test_while_tables_come_the_printer_looks_for_them_and_asleep_a_table_wakes_it(monkeypatch):
    """The training thread wakes the printer (a queue put, ~45 µs right after a step) only where it sleeps: while
    tables come it looks for them every POLL_S; after IDLE_POLLS empty looks it sleeps until the next table."""
    monkeypatch.setattr(_printer, "POLL_S", 0.02)
    monkeypatch.setattr(_printer, "IDLE_POLLS", 10**6)  # (a busy machine: no sleep while the tables come)
    monkeypatch.setattr(_printer, "rank_zero_info", lambda text: None)
    printer = _printer._Printer()
    printer._queue = _CountingQueue()
    printed = []

    def build(text, done):
        printed.append(text)
        done.set()
        return text

    for i in range(5):
        done = threading.Event()
        printer.put(build, (f"polled {i}", done), lambda err: None)  # the first starts the thread
        assert done.wait(10.0)  # printed without a flush
    assert printer._queue.puts == 0  # and without a wake
    monkeypatch.setattr(_printer, "IDLE_POLLS", 3)
    deadline = time.perf_counter() + 10.0
    while not printer._sleeping and time.perf_counter() < deadline:  # no table for IDLE_POLLS looks: asleep
        time.sleep(0.01)
    assert printer._sleeping
    woken = threading.Event()
    printer.put(build, ("woken", woken), lambda err: None)
    assert woken.wait(10.0) and printer._queue.puts == 1  # the put woke it
    assert printed == [*(f"polled {i}" for i in range(5)), "woken"]
    assert printer.flush(timeout=10.0) and not printer.pending()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_printer_that_dies_is_replaced_by_the_next_flush_and_its_table_is_not_waited_for(monkeypatch):
    """A BaseException out of a table (a logging handler's SystemExit) ends the printer's thread: that table counts
    as done, and a flush starts another printer for the tables queued behind it, in order."""
    printed = []
    monkeypatch.setattr(_printer, "rank_zero_info", printed.append)
    printer = _printer._Printer()
    entered, release = threading.Event(), threading.Event()

    def fatal():
        entered.set()
        release.wait(10.0)  # the tables behind it are queued meanwhile
        raise SystemExit(3)

    printer.put(fatal, (), lambda err: None)
    assert entered.wait(10.0)
    first = printer._thread
    printer.put(str, ("after",), lambda err: None)
    printer.put(str, ("next",), lambda err: None)
    release.set()
    first.join(10.0)
    assert not first.is_alive() and not printer._running
    assert printer.flush(timeout=10.0) and not printer.pending()
    assert printed == ["after", "next"] and printer._thread is not first


def test_the_periodic_table_nests_user_sections_under_their_parents_as_the_final_table_does(tmp_path, caplog):
    """Before: the periodic table listed "unet" flat beside "denoise" (its parent), its share counted twice to the
    eye; the final table indented it as "unet (in denoise)" under its parent."""
    from lightning_perf import profile_section
    from tests.helpers import TinyModel

    class Nested(TinyModel):
        def training_step(self, batch, batch_idx):
            with profile_section("denoise"):
                with profile_section("unet"):
                    loss = super().training_step(batch, batch_idx)
                time.sleep(0.001)  # the parent holds more than its child: the order below is by total
            return loss

    with caplog.at_level(logging.INFO):
        fit(tmp_path, [SectionProfiler(warmup_steps=0, report_every_n_steps=4)], model=Nested(), max_epochs=1)
    tables = [r.getMessage() for r in caplog.records if "=== SectionProfiler" in r.getMessage()]
    periodic, final = tables[0], tables[-1]
    assert "SectionProfiler report" in periodic and final.startswith("=== SectionProfiler: ")

    def labels(table):
        names = []
        for line in table.splitlines()[2:]:
            if not line or not line[0].isspace() and line.split()[0] in ("after", "Insights:"):
                break
            names.append(line[:len(line) - len(line.lstrip())] + line.split()[0]
                         + (" " + " ".join(line.split()[1:3]) if "(in" in line else ""))
        return names

    for table in (periodic, final):
        names = labels(table)
        parent = next(i for i, n in enumerate(names) if n == "forward")  # the user sections run inside forward
        assert names[parent + 1] == "  denoise (in forward)", (names, table)
        assert names[parent + 2] == "    unet (in denoise)", (names, table)
