"""Scalars to every logger of a Trainer, each key once per step.

While a Trainer fits, ``log_scalars`` queues the scalars with their step, and each training batch end hands the
loggers at most ``PER_BATCH_END`` of them (``drain_scalars``), of steps before the current one: what a step's batch
end logs waits a batch, for what SectionProfiler logs for that step where the iteration closes. A window report of
~20 scalars sent at once fills TensorBoard's writer queue (10 events by default), and the training thread then waits
for the writer, which computes two CRCs per event in pure Python: ~50 µs a scalar. A few per batch end never fill
it: the writer works while the next step runs. Each point carries the step it was measured at and reaches the logger a few batches later, in the
order logged (one queue); what still waits goes out at the end of training, after an exception and at teardown
(``flush_scalars``). Outside a fit (``validate``, ``test``) scalars go at once; inside a PerfSuite hook, what its
callbacks log then goes in one call at the hook's end.

To Lightning's own ``TensorBoardLogger`` (not a subclass that logs otherwise, no ``prefix``, torch's
``SummaryWriter``), the scalars of one step go as one TensorBoard event holding all of them, written through the
writer's ``FileWriter.add_event`` (values added in place): ``log_metrics`` makes one event per scalar (a protobuf
summary, an event, a queue entry and two pure-Python CRCs each, ~40 µs a scalar on the training thread right after
a step); one event
per step is read back by TensorBoard as the same points (tested). Then a waiting step goes out whole at a batch end,
since one event never fills the writer's queue. Any other logger gets ``log_metrics``; anything unexpected falls
back to it too.
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Tuple

from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch import Trainer

from lightning_perf.measure.timing.clock import now
from lightning_perf.measure.timing.tail import OWN_WORK


_LOGGED: "weakref.WeakKeyDictionary[Trainer, Dict[str, int]]" = weakref.WeakKeyDictionary()

#: Deferred scalars per trainer, oldest first: (step, key, value).
_DEFERRED: "weakref.WeakKeyDictionary[Trainer, Deque[Tuple[int, str, float]]]" = weakref.WeakKeyDictionary()

#: At most this many deferred scalars reach the loggers at one batch end: below TensorBoard's default queue of 10
#: with room for the user's own scalars of that step.
PER_BATCH_END = 4


class _Waiting:
    """How many deferred scalars wait, over all trainers: the step path reads ``WAITING.count`` (one attribute)
    before calling ``drain_scalars``."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


WAITING = _Waiting()


def _finite_new(trainer: Trainer, metrics: Dict[str, float], step: int) -> Dict[str, float]:
    """The finite scalars not yet logged at this step (a phase end that falls on a periodic log step would
    otherwise draw two points at one step)."""
    last = _LOGGED.get(trainer)
    if last is None:
        last = _LOGGED[trainer] = {}
    clean = {}
    for key, value in metrics.items():
        if value is None or not math.isfinite(float(value)) or last.get(key) == step:
            continue
        clean[key] = float(value)
        last[key] = step
    return clean


def log_scalars(trainer: Trainer, metrics: Dict[str, float], step: Optional[int] = None) -> None:
    """Sends finite scalars to every logger of the trainer (loggers log on rank 0 only), each key at most once per
    step; while the trainer fits, through the queue a few per batch end (see the module's docstring)."""
    if not trainer.loggers:
        return
    step = trainer.global_step if step is None else step
    clean = _finite_new(trainer, metrics, step)
    if not clean:
        return
    if trainer.state.fn == "fit":
        queue = _DEFERRED.get(trainer)
        if queue is None:
            queue = _DEFERRED[trainer] = deque()
        queue.extend((step, key, value) for key, value in clean.items())
        WAITING.count += len(clean)
        return
    flush_scalars(trainer)
    batch = getattr(trainer, _LOG_BATCH_ATTRIBUTE, None)
    if batch is not None:  # inside a PerfSuite hook: one logger call for all its callbacks, at the hook's end
        batch.setdefault(step, {}).update(clean)
        return
    _send(trainer, {step: clean})


def _event_writer(logger: Any) -> Any:
    """The FileWriter that takes one TensorBoard event for all scalars of a step, for Lightning's own
    TensorBoardLogger on torch's SummaryWriter without a prefix (after its first write); else None."""
    global _TENSORBOARD
    if _TENSORBOARD is None:
        try:
            from lightning.fabric.loggers.tensorboard import TensorBoardLogger
            from tensorboard.compat.proto.event_pb2 import Event
            from torch.utils.tensorboard import SummaryWriter

            _TENSORBOARD = (TensorBoardLogger.log_metrics, SummaryWriter, Event)
        except Exception:  # noqa: BLE001 - no TensorBoard here: every logger gets log_metrics
            _TENSORBOARD = ()
    if not _TENSORBOARD or type(logger).log_metrics is not _TENSORBOARD[0] or getattr(logger, "_prefix", None) != "":
        return None
    experiment = getattr(logger, "_experiment", None)
    if type(experiment) is not _TENSORBOARD[1]:
        return None
    writer = getattr(experiment, "file_writer", None)
    return writer if callable(getattr(writer, "add_event", None)) else None


#: (TensorBoardLogger.log_metrics, SummaryWriter, Event) once imported; () where TensorBoard is absent.
_TENSORBOARD: Any = None


def _send(trainer: Trainer, by_step: Dict[int, Dict[str, float]], writers: Optional[List[Any]] = None) -> None:
    """To each logger: one event per step through its ``writers`` entry (``_event_writer``'s, found here when not
    given), else ``log_metrics`` per step."""
    start = now()
    if writers is None:
        writers = [_event_writer(logger) for logger in trainer.loggers]
    for logger, writer in zip(trainer.loggers, writers):
        if writer is not None and rank_zero_only.rank == 0:
            for step, metrics in by_step.items():
                # the event's summary values are added in place: what add_summary does, less two copies of each
                # value (into the summary, then the summary into an event), 2.7x faster
                event = _TENSORBOARD[2]()
                add = event.summary.value.add
                for key, value in metrics.items():
                    add(tag=key, simple_value=value)
                writer.add_event(event, step)
            continue
        for step, metrics in by_step.items():
            logger.log_metrics(metrics, step=step)
    OWN_WORK.add(now() - start)  # lightning_perf's own work, in the iteration that runs (IterationTimer may name it)


#: At a batch end, scalars wait for the next one while the oldest was logged at the current step (see
#: ``drain_scalars``), unless this many wait.
HOLD_AT_MOST = 256


def drain_scalars(trainer: Trainer, limit: Optional[int] = PER_BATCH_END, batch_end: bool = False) -> None:
    """Hands the loggers up to ``limit`` deferred scalars of this trainer (all of them with ``limit=None``, or
    where every logger takes one event per step), one call per logger and step.

    ``batch_end``: called at a training batch end, where only the scalars of earlier steps go. What is logged for
    a step at its batch end (IterationTimer's and VRAMMonitor's windows) then waits one batch, and goes with what
    SectionProfiler logs for the same step when that iteration closes, at the next batch's start: one event to
    TensorBoard for the step, where two wake its writer."""
    queue = _DEFERRED.get(trainer)
    if not queue:
        return
    before = None
    if batch_end and len(queue) < HOLD_AT_MOST:
        before = trainer.global_step
        if queue[0][0] >= before:
            return
    writers = [_event_writer(logger) for logger in trainer.loggers]
    if limit is not None and all(writer is not None for writer in writers):
        limit = None
    n = len(queue) if limit is None else min(limit, len(queue))
    by_step: Dict[int, Dict[str, float]] = {}
    sent = 0
    while sent < n and (before is None or queue[0][0] < before):
        step, key, value = queue.popleft()
        by_step.setdefault(step, {})[key] = value
        sent += 1
    WAITING.count = max(0, WAITING.count - sent)
    _send(trainer, by_step, writers)


def flush_scalars(trainer: Trainer) -> None:
    """Everything deferred for this trainer, now."""
    if WAITING.count:
        drain_scalars(trainer, limit=None)


def discard_scalars(trainer: Any) -> None:
    """Forgets what waits for a trainer whose loggers are gone (a flush that failed must not be tried forever)."""
    queue = _DEFERRED.pop(trainer, None)
    if queue:
        WAITING.count = max(0, WAITING.count - len(queue))


#: The attribute of a Trainer that collects what the callbacks of a PerfSuite log within one hook.
_LOG_BATCH_ATTRIBUTE = "_lightning_perf_log_batch"


def open_log_batch(trainer: Any) -> None:
    """From here to ``close_log_batch``, ``log_scalars`` collects instead of calling the loggers."""
    setattr(trainer, _LOG_BATCH_ATTRIBUTE, {})


def close_log_batch(trainer: Any) -> None:
    """Sends what was collected since ``open_log_batch``: one ``log_metrics`` call per logger and step."""
    batch = getattr(trainer, _LOG_BATCH_ATTRIBUTE, None)
    setattr(trainer, _LOG_BATCH_ATTRIBUTE, None)
    if batch:
        _send(trainer, batch)
