"""User-named timing sections: ``with profile_section("ema"):`` or ``@profile_section("sampling")``.

They cost one global read when no SectionProfiler is active. While one is, each section records its host time
(and, through the sink, device time from CUDA events) with its parent: the enclosing user section, or None.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, List, Optional, Protocol, TypeVar

from lightning_perf.measure.clock import now

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
