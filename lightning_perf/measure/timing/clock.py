"""Interval clocks that never stall the device: host time now, device time once the GPU has got there."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Tuple

__all__ = ["DeviceIntervalClock", "POLL_EVERY", "device_timed", "next_device_timed", "now"]

now = time.perf_counter

#: Iterations between two reads of the events the device has passed: each ``Event.query()`` is a driver call
#: (~1-2 µs on the host), so the step path asks in batches; what is recorded meanwhile waits in the bounded pool.
POLL_EVERY = 16


def device_timed(index: int, warmup: int, every: int) -> bool:
    """Whether a fit's iteration at 0-based ``index`` is timed on the device: none of the ``warmup`` first, then the
    first ``every`` counted (a short run still gets device times), then one in ``every``. SectionProfiler's and
    IterationTimer's schedule: with the same warm-up and n they time the same iterations."""
    n = index - warmup
    return n >= 0 and (n < every or n % every == 0)


def next_device_timed(index: int, warmup: int, every: int) -> int:
    """The first 0-based index from ``index`` on that :func:`device_timed` times."""
    n = index - warmup
    if n < 0:
        return warmup
    return index if n < every else warmup - (-n // every) * every


class DeviceIntervalClock:
    """Device-side durations between consecutive :meth:`mark` calls, from CUDA events read lazily.

    ``mark()`` records an event on the current stream and returns at once. ``poll()`` reads the intervals whose
    end event the device has already passed (``Event.query()`` is true), and never waits. ``flush()`` waits for
    the last event: call it only at a phase end, where a sync costs nothing. Events come from a bounded pool and go
    back to it once read; if the device falls more than ``max_pending`` marks behind, marks are skipped and
    counted in :attr:`dropped` rather than growing memory.

    Args:
        event_factory: makes one timing event; defaults to ``torch.cuda.Event(enable_timing=True)``. Tests pass a
            simulated event with ``record()``, ``query()``, ``synchronize()`` and ``elapsed_time(other)``.
        max_pending: bound on events in flight.
        current_stream: returns the stream to record on; defaults to ``torch.cuda.current_stream`` with the default
            event factory (none, i.e. ``record()``, with another). It is asked once per chain (at the first mark
            after a phase boundary) and the stream is kept: ``current_stream()`` costs ~8 µs on an H100 host, which
            ``Event.record()`` without a stream pays on every call.
    """

    def __init__(self, event_factory: Optional[Callable[[], Any]] = None, max_pending: int = 512,
                 current_stream: Optional[Callable[[], Any]] = None) -> None:
        if event_factory is None:
            import torch

            def event_factory() -> Any:
                return torch.cuda.Event(enable_timing=True)

            current_stream = current_stream or torch.cuda.current_stream
        self._current_stream = current_stream
        self._stream: Any = None
        self._factory = event_factory
        self._max_pending = max_pending
        self._pool: List[Any] = []
        # Each entry: (event, whether the interval that ends at this event is counted, its label).
        self._pending: Deque[Tuple[Any, bool, Any]] = deque()
        self._chain_broken = True
        self.dropped = 0

    def _get_event(self) -> Any:
        return self._pool.pop() if self._pool else self._factory()

    def mark(self, counted: bool = True, label: Any = None) -> None:
        """Records a boundary. ``counted=False`` leaves the interval that ends here out of the results; ``label``
        names it (a section), for :meth:`poll_labeled`."""
        if len(self._pending) >= self._max_pending:
            self.dropped += 1
            self._chain_broken = True
            return
        event = self._get_event()
        if self._current_stream is None:
            event.record()
        else:
            if self._chain_broken or self._stream is None:
                self._stream = self._current_stream()
            event.record(self._stream)
        self._pending.append((event, counted and not self._chain_broken, label))
        self._chain_broken = False

    def stamp(self) -> Any:
        """A fresh event recorded on the current stream, outside the chain (a user section's start or end: the
        user may have switched streams, so it is not recorded on the kept one)."""
        event = self._factory()
        event.record()
        return event

    def break_chain(self) -> None:
        """The next interval spans something that is not measured (validation, a new epoch): leave it out."""
        self._chain_broken = True

    def poll_labeled(self) -> List[Tuple[Any, float]]:
        """(label, ms) of the intervals the device has finished, oldest first; never blocks."""
        out: List[Tuple[Any, float]] = []
        pending = self._pending
        while len(pending) >= 2 and pending[1][0].query():
            start = pending.popleft()[0]
            end, counted, label = pending[0]
            if counted:
                out.append((label, float(start.elapsed_time(end))))
            self._pool.append(start)
        return out

    def poll(self) -> List[float]:
        """Durations in ms of the intervals the device has finished, oldest first; never blocks."""
        return [ms for _, ms in self.poll_labeled()]

    def flush_labeled(self) -> List[Tuple[Any, float]]:
        """Waits for the last recorded event (a phase end) and returns every remaining (label, ms)."""
        if self._pending:
            self._pending[-1][0].synchronize()
        out = self.poll_labeled()
        if self._pending:
            self._pool.append(self._pending.popleft()[0])
        self._chain_broken = True
        return out

    def flush(self) -> List[float]:
        """Waits for the last recorded event (a phase end) and returns every remaining duration."""
        return [ms for _, ms in self.flush_labeled()]
