"""When a gate checks: at given global steps, at multiples of N, or (neither) at every validation run."""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

from lightning_perf.callbacks.core.arguments import bad_argument


def check_at_steps(owner: str, at_steps: Any) -> Optional[List[int]]:
    """``at_steps`` as a sorted list of distinct global steps (None stays None); an iterator is read once, here."""
    if at_steps is None:
        return None
    if not isinstance(at_steps, (str, bytes, int)):
        try:  # the checks below and the gate see the same steps
            at_steps = list(at_steps)
        except TypeError:
            raise bad_argument(owner, "at_steps", at_steps, "Expected a list of global steps (integers >= 0).")
    if isinstance(at_steps, (str, bytes, int)) or any(
            isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in at_steps):
        raise bad_argument(owner, "at_steps", at_steps, "Expected a list of global steps (integers >= 0).")
    if not at_steps:  # a gate that can never check would pass silently
        raise bad_argument(owner, "at_steps", at_steps, "Expected at least one global step; None checks every"
                           " validation run.")
    return sorted(set(at_steps))


def is_due(step: int, at_steps: Optional[Sequence[int]], every_n_steps: Optional[int]) -> bool:
    """Whether a validation run at global ``step`` is checked."""
    if at_steps is None and every_n_steps is None:
        return True
    return (at_steps is not None and step in at_steps) or (
        every_n_steps is not None and step > 0 and step % every_n_steps == 0)


def unreachable(last_step: Optional[int], at_steps: Optional[Sequence[int]],
                every_n_steps: Optional[int]) -> Optional[str]:
    """Why no scheduled check can happen up to ``last_step`` (None when one can, or when the schedule is every
    validation run)."""
    if last_step is None or last_step < 0 or (at_steps is None and every_n_steps is None):
        return None
    if at_steps is not None and any(0 < s <= last_step for s in at_steps):
        return None
    if every_n_steps is not None and every_n_steps <= last_step:
        return None
    parts = []
    if at_steps is not None:
        steps = list(at_steps) if len(at_steps) <= 5 else list(at_steps[:5]) + ["..."]
        verb = "is" if len(at_steps) == 1 else "are"
        parts.append(f"at_steps=[{', '.join(map(str, steps))}] {verb} outside the run's steps 1 to {last_step}")
    if every_n_steps is not None:
        parts.append(f"every_n_steps={every_n_steps} is larger than the run's last step {last_step}")
    return " and ".join(parts)


def schedule_text(at_steps: Optional[Sequence[int]], every_n_steps: Optional[int]) -> str:
    """``at_steps=[...] or a multiple of every_n_steps=N``: the steps a check was due at."""
    return " or ".join(([f"at_steps={at_steps}"] if at_steps is not None else [])
                       + ([f"a multiple of every_n_steps={every_n_steps}"] if every_n_steps is not None else []))
