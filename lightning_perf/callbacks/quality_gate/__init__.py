"""QualityGate: the hooks (``callback``), the schedule of checks (``check_schedule``) and the tolerance
(``tolerance``)."""

from lightning_perf.callbacks.quality_gate.callback import QualityGate

__all__ = ["QualityGate"]
