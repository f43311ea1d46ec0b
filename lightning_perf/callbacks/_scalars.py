"""Scalars to every logger of a Trainer, each key once per step, batched into one call inside a PerfSuite hook."""

from __future__ import annotations

import math
import weakref
from typing import Any, Dict, Optional

from lightning.pytorch import Trainer


_LOGGED: "weakref.WeakKeyDictionary[Trainer, Dict[str, int]]" = weakref.WeakKeyDictionary()


def log_scalars(trainer: Trainer, metrics: Dict[str, float], step: Optional[int] = None) -> None:
    """Sends finite scalars to every logger of the trainer (loggers log on rank 0 only), each key at most once per
    step: a phase end that falls on a periodic log step would otherwise draw two points at one step."""
    if not trainer.loggers:
        return
    step = trainer.global_step if step is None else step
    last = _LOGGED.get(trainer)
    if last is None:
        last = _LOGGED[trainer] = {}
    clean = {}
    for key, value in metrics.items():
        if value is None or not math.isfinite(float(value)) or last.get(key) == step:
            continue
        clean[key] = float(value)
        last[key] = step
    if not clean:
        return
    batch = getattr(trainer, _LOG_BATCH_ATTRIBUTE, None)
    if batch is not None:  # inside a PerfSuite hook: one logger call for all its callbacks, at the hook's end
        batch.setdefault(step, {}).update(clean)
        return
    for logger in trainer.loggers:
        logger.log_metrics(clean, step=step)


#: The attribute of a Trainer that collects what the callbacks of a PerfSuite log within one hook.
_LOG_BATCH_ATTRIBUTE = "_lightning_perf_log_batch"


def open_log_batch(trainer: Any) -> None:
    """From here to ``close_log_batch``, ``log_scalars`` collects instead of calling the loggers."""
    setattr(trainer, _LOG_BATCH_ATTRIBUTE, {})


def close_log_batch(trainer: Any) -> None:
    """Sends what was collected since ``open_log_batch``: one ``log_metrics`` call per logger and step."""
    batch = getattr(trainer, _LOG_BATCH_ATTRIBUTE, None)
    setattr(trainer, _LOG_BATCH_ATTRIBUTE, None)
    for step, metrics in (batch or {}).items():
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
