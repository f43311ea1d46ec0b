"""User-named timing sections: ``with profile_section("ema"):`` or ``@profile_section("sampling")``.

They cost one global read when no SectionProfiler is active. While one is, each section records its host time
(and, through the sink, device time from CUDA events) with its parent: the enclosing user section, or None.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, NamedTuple, Optional, Protocol, TypeVar

from lightning_perf.measure.stats.streaming import LogHistogram
from lightning_perf.measure.timing.clock import now

F = TypeVar("F", bound=Callable[..., Any])


class SectionSink(Protocol):
    def section_started(self, name: str) -> Any: ...

    def section_ended(self, name: str, parent: Optional[str], seconds: float, token: Any, failed: bool) -> None: ...


_sink: Optional[SectionSink] = None
_stack = threading.local()


def set_sink(sink: Optional[SectionSink]) -> Optional[SectionSink]:
    """Makes ``sink`` receive sections (None: nobody); returns the previous one."""
    global _sink
    previous, _sink = _sink, sink
    return previous


def current_sink() -> Optional[SectionSink]:
    return _sink


def _frames() -> List[Any]:
    stack = getattr(_stack, "frames", None)
    if stack is None:
        stack = _stack.frames = []
    return stack


class profile_section:  # noqa: N801 - used like a function: `with profile_section("ema"):`
    """Times a named piece of code for :class:`~lightning_perf.SectionProfiler`, as a context manager or decorator.

    Nested sections are reported with their parent. A section left by an exception is closed, counted, and marked
    in ``closed_by_exception``; the exception goes on. With no profiler active it does nothing but one check.

    Args:
        name: the section's name, a non-empty string.

    Raises:
        ValueError: for an empty or non-string name, at the call.

    Example::

        with profile_section("ema"):
            ema.update(model)

        @profile_section("sampling")
        def sample(model): ...
    """

    __slots__ = ("name", "_entries")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"Unsupported parameter value `profile_section(name={name!r})`. Expected a non-empty"
                             " string such as 'ema' or 'sampling'.")
        self.name = name
        self._entries: List[Any] = []  # (sink, start, token, parent) per open use: re-entrant and recursive

    def __enter__(self) -> "profile_section":
        sink = _sink
        if sink is None:
            self._entries.append(None)
            return self
        frames = _frames()
        parent = frames[-1] if frames else None
        frames.append(self.name)
        try:
            token = sink.section_started(self.name)
        except Exception:  # noqa: BLE001 - a measurement never raises into the user's code (e.g. a failing event)
            token = None
        self._entries.append((sink, now(), token, parent))
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        entry = self._entries.pop()
        if entry is None:
            return False
        sink, start, token, parent = entry
        frames = _frames()
        if frames:
            frames.pop()
        try:
            sink.section_ended(self.name, parent, now() - start, token, exc_type is not None)
        except Exception:  # noqa: BLE001 - a measurement never raises into the user's code
            pass
        return False

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


#: Raw times a section keeps before they go into its histogram (up to 7/8 more by its phase, see ``Samples``).
HISTOGRAM_EVERY = 512


class Samples:
    """Host times of one section (or of whole iterations): raw seconds, folded into the report window's sum, min and
    max, and into the bounded histogram once ``limit`` of them wait or before any figure is read.

    ``limit`` is ``HISTOGRAM_EVERY`` plus an eighth of it per ``phase`` (0 to 7: the order in which the sections were
    made): with one limit every section that runs once an iteration went into its histogram at the same fold (1 to
    2 ms on a 2-core CPU), one slow iteration of the profiler's own making; with eight the batches are spread."""

    __slots__ = ("host", "raw", "seen", "limit", "window_s", "window_n", "window_min", "window_max")

    def __init__(self, phase: int = 0) -> None:
        self.host = LogHistogram()
        self.raw: List[float] = []
        self.seen = 0  # raw times already in the window's figures
        self.limit = HISTOGRAM_EVERY + HISTOGRAM_EVERY // 8 * (phase % 8)
        self.window_reset()

    def window_reset(self) -> None:
        self.window_s, self.window_n, self.window_min, self.window_max = 0.0, 0, float("inf"), 0.0

    def fold(self, histogram: bool = True) -> None:
        """The raw times not yet in the window's figures go there; into the histogram too where ``histogram`` is
        true or ``limit`` of them wait."""
        raw = self.raw
        if len(raw) > self.seen:
            new = raw[self.seen:]
            self.window_s += sum(new)
            self.window_n += len(new)
            self.window_min = min(self.window_min, min(new))
            self.window_max = max(self.window_max, max(new))
            self.seen = len(raw)
        if raw and (histogram or len(raw) >= self.limit):
            self.host.add_many(raw, 1000.0)
            self.raw, self.seen = [], 0


class Section(Samples):
    """Bounded statistics of one section: per-call host ms (histogram), device ms, calls left by exceptions."""

    __slots__ = ("kind", "parent", "device", "closed_by_exception", "runs")

    def __init__(self, kind: str, parent: Optional[str] = None, phase: int = 0) -> None:
        super().__init__(phase)
        self.kind, self.parent = kind, parent
        self.device = LogHistogram()
        self.closed_by_exception = 0
        self.runs = 0  # a user section: counted iterations it ran in, this process


class UserSectionEvents(NamedTuple):
    """A user section's CUDA event pair on a timed iteration, read once the device has passed its end."""

    name: str
    start: Any
    end: Any
    counted: bool  # (not in the warm-up)
