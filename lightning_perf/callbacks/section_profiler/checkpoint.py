"""SectionProfiler's checkpoint state read back (what ``measure.sections.state.ledger_state`` wrote): every field is
read and checked before anything is assigned, so a state this version cannot read leaves nothing half-loaded."""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

from lightning_perf.callbacks.core.state import StateError, StateReader
from lightning_perf.measure.stats.streaming import LogHistogram


class SavedLedger(NamedTuple):
    iterations: int
    iteration_ms: Optional[LogHistogram]
    sections: Dict[str, tuple]  # name -> (kind, parent, host histogram, device histogram, closed by exception)
    validation_runs: int
    validation_s: float
    overhead_s: float


def read_saved_ledger(state_dict: Dict[str, Any]) -> SavedLedger:
    """The state, read; raises :class:`StateError` naming the first field this version cannot use."""
    s = StateReader(state_dict)
    sections = {}
    for name, data in (s.mapping("sections", allow_none=True) or StateReader({})).data.items():
        sec = StateReader(data, f"sections.{name}")
        if not isinstance(name, str):
            raise StateError(f"sections has a key {name!r}, expected section names")
        sections[name] = (sec.text("kind", "auto", allow_none=False), sec.text("parent"), sec.histogram("host_ms"),
                          sec.histogram("device_ms"), sec.count("closed_by_exception"))
    validation = s.mapping("validation", allow_none=True) or StateReader({}, "validation")
    return SavedLedger(s.count("iterations"), s.histogram("iteration_ms"), sections, validation.count("runs"),
                       validation.number("total_s"), s.number("overhead_s"))
