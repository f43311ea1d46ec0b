"""Per-rank figures combined under DDP: one ``all_gather`` at a phase end, batched into one inside a PerfSuite."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from lightning.pytorch import Trainer

if TYPE_CHECKING:
    from lightning_perf.callbacks.core.base import PerfCallback


def gather_floats(trainer: Trainer, values: Sequence[Optional[float]]) -> List[List[Optional[float]]]:
    """One ``all_gather`` on every rank; returns one row of ``values`` per rank (None where a rank had none).

    The caller must reach this on every rank with the same number of values: compute them first, then gather.
    """
    if trainer.world_size <= 1:
        return [list(values)]
    import torch

    tensor = torch.tensor(
        [math.nan if v is None else float(v) for v in values],
        dtype=torch.float64,
        device=trainer.strategy.root_device,
    )
    gathered = trainer.strategy.all_gather(tensor)
    rows = gathered.reshape(trainer.world_size, len(values)).cpu().tolist()
    return [[None if math.isnan(v) else v for v in row] for row in rows]


Rows = List[List[Optional[float]]]


def gather_floats_then(trainer: Trainer, values: Sequence[Optional[float]], then: Callable[[Rows], Any],
                       owner: Optional["PerfCallback"] = None) -> None:
    """With several ranks, ``then(gather_floats(trainer, values))`` (one row per rank); with one, nothing: there is no
    spread across ranks to report. Inside a PerfSuite's ``on_train_end`` the values of all its callbacks go in one
    ``all_gather`` at the hook's end (``close_gather_batch``), and each ``then`` gets its rows."""
    if trainer.world_size <= 1:
        return
    batch = getattr(trainer, _GATHER_BATCH_ATTRIBUTE, None)
    if batch is None:
        then(gather_floats(trainer, values))
    else:
        batch.append((list(values), then, owner))


#: The attribute of a Trainer that collects what the callbacks of a PerfSuite gather across ranks within one hook.
_GATHER_BATCH_ATTRIBUTE = "_lightning_perf_gather_batch"


def open_gather_batch(trainer: Any) -> None:
    """From here to ``close_gather_batch``, ``gather_floats_then`` collects instead of gathering."""
    setattr(trainer, _GATHER_BATCH_ATTRIBUTE, [])


def close_gather_batch(trainer: Any) -> List[tuple]:
    """One ``all_gather`` of everything collected since ``open_gather_batch`` (every rank collects the same values
    in the same order, so every rank reaches it with the same shape); each ``then`` gets its own columns. Returns
    (owner, exception) for each ``then`` that failed."""
    batch = getattr(trainer, _GATHER_BATCH_ATTRIBUTE, None)
    setattr(trainer, _GATHER_BATCH_ATTRIBUTE, None)
    if not batch:
        return []
    rows = gather_floats(trainer, [v for values, _, _ in batch for v in values])
    failures, start = [], 0
    for values, then, owner in batch:
        end = start + len(values)
        try:
            then([row[start:end] for row in rows])
        except Exception as err:  # noqa: BLE001 - one callback's figure must not cost the others theirs
            failures.append((owner, err))
        start = end
    return failures


def spread_across_ranks(per_rank: Sequence[Optional[float]], higher_is_worse: bool = True) -> Dict[str, Any]:
    """min / median / max of a per-rank figure and which rank is worst."""
    known = [(v, r) for r, v in enumerate(per_rank) if v is not None]
    if not known:
        return {"per_rank": list(per_rank), "min": None, "median": None, "max": None, "worst_rank": None}
    ordered = sorted(v for v, _ in known)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    worst = max(known)[1] if higher_is_worse else min(known)[1]
    return {"per_rank": list(per_rank), "min": ordered[0], "median": median, "max": ordered[-1], "worst_rank": worst}
