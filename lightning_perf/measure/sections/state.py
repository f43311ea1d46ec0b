"""What a checkpoint keeps of the section ledger (iterations, the histograms of iterations and sections, validation),
and the ledger restored from it: what resume needs so that one summary covers the whole run."""

from __future__ import annotations

from typing import Any, Dict, Optional

from lightning_perf.measure.sections.ledger import SectionLedger
from lightning_perf.measure.stats.streaming import LogHistogram


def ledger_state(ledger: SectionLedger, t: float) -> Dict[str, Any]:
    """The ledger's state at ``t``. Saved in an iteration's batch-end work (ModelCheckpoint's every_n_train_steps),
    the iteration closes after the save: it is carried as timed so far (up to ``t``), or a resume from it would miss
    it."""
    ledger.fold()
    iterations, iteration_ms = ledger.iterations, ledger.iteration.host.to_dict()
    host_ms = {name: sec.host.to_dict() for name, sec in ledger.sections.items()}
    closed = {name: sec.closed_by_exception for name, sec in ledger.sections.items()}
    if ledger.ending:
        iterations += 1
        if ledger.counted:
            _add_open_iteration(ledger, t, iteration_ms, host_ms, closed)
    return {"iterations": iterations, "iteration_ms": iteration_ms,
            "sections": {name: {"kind": sec.kind, "parent": sec.parent, "host_ms": host_ms[name],
                                "device_ms": sec.device.to_dict(), "closed_by_exception": closed[name]}
                         for name, sec in ledger.sections.items()},
            "validation": {"runs": ledger.validation_runs, "total_s": ledger.validation_s}}


def _add_open_iteration(ledger: SectionLedger, t: float, iteration_ms: Dict[str, Any], host_ms: Dict[str, Any],
                        closed: Dict[str, int]) -> None:
    """Adds the open iteration (its pieces up to ``t``) to the histogram states; the live figures stay as they are."""
    ledger.apply_held()
    it = ledger.open
    pieces = dict(it.pieces)
    if ledger.current is not None and not ledger.next_owner:
        pieces[ledger.current] = pieces.get(ledger.current, 0.0) + (t - ledger.t0)
    total = sum(pieces.values()) + it.user_s
    if total <= 0:
        return

    def plus(state: Dict[str, Any], seconds: float) -> Dict[str, Any]:
        hist = LogHistogram.from_dict(state)
        hist.add(1000.0 * seconds)
        return hist.to_dict()

    iteration_ms.update(plus(iteration_ms, total))
    for name, seconds in pieces.items():
        ledger.section(name)
        host_ms[name] = plus(host_ms.get(name) or LogHistogram().to_dict(), seconds)
        closed.setdefault(name, 0)
    for name, seconds, failed in it.calls:
        host_ms[name] = plus(host_ms[name], seconds)
        closed[name] += failed


def load_ledger(ledger: SectionLedger, iterations: int, iteration_ms: Optional[LogHistogram],
                sections: Dict[str, tuple], validation_runs: int, validation_s: float) -> None:
    """A checkpoint's state, read and checked by the caller, into ``ledger``: ``sections`` name -> (kind, parent,
    host histogram, device histogram, closed by exception)."""
    ledger.iterations = iterations
    if iteration_ms is not None:
        ledger.iteration.host = iteration_ms
    for name, (kind, parent, host, device, closed) in sections.items():
        sec = ledger.section(name, kind, parent)
        if host is not None:
            sec.host = host
        if device is not None:
            sec.device = device
        sec.closed_by_exception = closed
    ledger.validation_runs, ledger.validation_s = validation_runs, validation_s
