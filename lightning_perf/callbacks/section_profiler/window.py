"""SectionProfiler's window report: the window's figures to the loggers and, on rank 0, its table to the printer
thread (``core.printer``), which builds and prints it off the step path."""

from __future__ import annotations

import logging
from typing import Callable

from lightning.pytorch import Trainer
from lightning_utilities.core import rank_zero as _rank_zero

from lightning_perf.callbacks.core.printer import PRINTER
from lightning_perf.callbacks.core.scalars import log_scalars
from lightning_perf.measure.sections.ledger import SectionLedger
from lightning_perf.measure.sections.report import report_table
from lightning_perf.measure.timing.clock import now


def info_shown() -> bool:
    """Whether ``rank_zero_info`` would show an INFO line now: where Lightning's INFO logging is off (a script that
    silences it), the periodic table is not built either. The logger is read from the module each time (the
    standalone ``pytorch_lightning`` puts its own there when imported)."""
    try:
        return _rank_zero.log.isEnabledFor(logging.INFO)
    except Exception:  # noqa: BLE001 - not known: build it, rank_zero_info decides
        return True


def report_window(trainer: Trainer, ledger: SectionLedger, print_table: bool,
                  record_failure: Callable[[str, BaseException], None]) -> None:
    """The ledger's window since the last report (then a new one): logged, and where ``print_table`` printed as
    ``measure.sections.report.report_table`` builds it, on the printer's thread, whose failure is recorded as the
    ``report table``'s."""
    iters, metrics, rows = ledger.take_window()
    if not iters:
        return
    log_scalars(trainer, metrics)
    if print_table and trainer.is_global_zero and info_shown():
        PRINTER.put(report_table, (ledger.iterations, trainer.global_step, iters, metrics["time/iteration_ms"], rows),
                    lambda err: record_failure("report table", err))


def flush_tables() -> float:
    """Waits for the periodic tables still being printed, if any; the seconds it waited (lightning_perf's own time,
    as a report is)."""
    if not PRINTER.pending():
        return 0.0
    start = now()
    PRINTER.flush()
    return now() - start
