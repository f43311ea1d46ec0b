"""Marks a moment of Lightning's loop that no callback hook marks, from a public method of the strategy instance
(which Lightning's loops look up on the instance): the method is wrapped for the fit and given back exactly at
teardown or after an exception. Nothing of the class or the trainer is replaced, no private name is read."""

from __future__ import annotations

from typing import Any, Callable, Optional


class StrategyMark:
    """One installed wrapper of ``strategy.<method>``: ``mark()`` as each call starts and ``after()`` (if given) as
    it returns. Both are set to None when the wrapper cannot be taken off (something wrapped it after us): it stays
    in that chain and only delegates."""

    __slots__ = ("strategy", "method", "own", "mark", "after", "wrapper")

    def __init__(self, strategy: Any, method: str, mark: Optional[Callable[[], None]],
                 after: Optional[Callable[[], None]] = None) -> None:
        self.strategy, self.method = strategy, method
        self.own = strategy.__dict__.get(method)  # an instance attribute already there (another tool's wrapper)
        self.mark: Optional[Callable[[], None]] = mark
        self.after: Optional[Callable[[], None]] = after
        inner = getattr(strategy, method)
        handle = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            mark = handle.mark
            if mark is not None:
                try:
                    mark()
                except Exception:  # noqa: BLE001 - a measurement never raises into the user's training
                    pass
            result = inner(*args, **kwargs)  # the user's own errors go on as they would without us
            after = handle.after
            if after is not None:
                try:
                    after()
                except Exception:  # noqa: BLE001 - a measurement never raises into the user's training
                    pass
            return result

        wrapper.__name__ = method
        self.wrapper = wrapper


def install(strategy: Any, method: str, mark: Optional[Callable[[], None]],
            after: Optional[Callable[[], None]] = None) -> Optional[StrategyMark]:
    """Wraps ``strategy.<method>`` on the instance; None (nothing changed) where it has no such method."""
    if not callable(getattr(strategy, method, None)):
        return None
    handle = StrategyMark(strategy, method, mark, after)
    setattr(strategy, method, handle.wrapper)
    return handle


def uninstall(handle: Optional[StrategyMark]) -> None:
    """Gives the strategy the method it had: its class's (the instance attribute goes) or the instance attribute
    that was there before. When another wrapper went on top of ours, ours cannot come off without breaking that
    one: it stops marking and only delegates."""
    if handle is None:
        return
    handle.mark = handle.after = None
    strategy, method = handle.strategy, handle.method
    if strategy.__dict__.get(method) is handle.wrapper:
        if handle.own is None:
            delattr(strategy, method)
        else:
            setattr(strategy, method, handle.own)
