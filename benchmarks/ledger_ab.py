"""Two versions of the section ledger on the same events, in one process: this checkout's and another checkout's.

The events of an iteration (fetch, transfer, batch start, the step's switches, batch end, a user section in the
batch-end work, a report every 50) are applied on a virtual clock to both ledgers in alternating blocks of 200
iterations; each pair of blocks gives the difference in thread CPU ns per iteration. Prints the median and the
quartiles of those differences, and whether both ledgers end with the same table and slowest iterations.

    python benchmarks/ledger_ab.py ../other-checkout --pairs 300      # ~1 minute on 2 cores
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")))
from lightning_perf.measure.sections import ledger as section_ledger  # noqa: E402

BLOCK = 200


def other_ledger(checkout: str) -> Any:
    """The other checkout's ledger module, beside this one's (the modules it imports are this one's); a checkout from
    before ``measure/`` was grouped keeps it in ``measure/section_ledger.py``."""
    path = os.path.join(checkout, "lightning_perf", "measure", "sections", "ledger.py")
    if not os.path.exists(path):
        path = os.path.join(checkout, "lightning_perf", "measure", "section_ledger.py")
    spec = importlib.util.spec_from_file_location("other_section_ledger", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def iterations(ledger: Any, n: int, t: float) -> float:
    for _ in range(n):
        ledger.fetch_started(t)
        t += 0.003
        ledger.fetch_returned(t)
        t += 0.0005
        ledger.transfer(t)
        t += 0.0002
        ledger.batch_start(t)
        t += 0.004
        ledger.switch("optimizer_step", t)
        ledger.switch("backward", t)
        t += 0.008
        ledger.switch("other", t)
        t += 0.001
        ledger.switch("optimizer_step", t)
        t += 0.002
        ledger.batch_end(t, True)
        t += 0.001
        ledger.user_section("sampling", None, 0.0005, False)
        t += 0.001
        if ledger.report_due:
            ledger.report_due = False
            ledger.take_window()
    return t


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", help="the other checkout (a clone or git worktree)")
    parser.add_argument("--pairs", type=int, default=300, help="pairs of blocks (default 300)")
    args = parser.parse_args(argv)
    ledgers = {}
    for name, module in (("this", section_ledger), ("other", other_ledger(args.checkout))):
        ledger = ledgers[name] = module.SectionLedger(5, 50, gap_mode=False)
        ledger.train_start(False, 0, 0.0)
        ledger.epoch_start(0.0)
    clock = {"this": 0.0, "other": 0.0}
    differences = []
    for pair in range(args.pairs):
        ns = {}
        for name in (("this", "other") if pair % 2 else ("other", "this")):
            start = time.thread_time_ns()
            clock[name] = iterations(ledgers[name], BLOCK, clock[name])
            ns[name] = (time.thread_time_ns() - start) / BLOCK
        differences.append(ns["this"] - ns["other"])
    tables = {name: ledger.table() for name, ledger in ledgers.items()}
    slowest = {name: ledger.slowest_iterations(tables[name]) for name, ledger in ledgers.items()}
    print(f"{ledgers['this'].iterations} iterations each; this - other, thread CPU ns an iteration: median"
          f" {statistics.median(differences):+.0f}, quartiles {[round(q) for q in statistics.quantiles(differences)]}")
    print(f"same table: {tables['this'] == tables['other']};"
          f" same slowest iterations: {slowest['this'] == slowest['other']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
