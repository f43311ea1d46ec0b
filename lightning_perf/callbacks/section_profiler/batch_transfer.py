"""Marks Lightning's host-to-device batch transfer: the strategy instance's ``batch_to_device`` (a public Strategy
method, which Lightning's loops look up on the instance) is wrapped for the fit and given back exactly at teardown or
after an exception. Nothing of the class or the trainer is replaced, no private name is read."""

from __future__ import annotations

from typing import Any, Callable, Optional

#: The strategy method Lightning's loops call to move a batch (``transfer_batch_to_device`` and
#: ``on_after_batch_transfer`` of the LightningModule or data module run inside it).
METHOD = "batch_to_device"


class TransferMark:
    """One installed wrapper: ``mark()`` as the strategy's transfer starts (where it ends, the next hook already marks:
    ``on_train_batch_start``). ``mark`` is set to None when the wrapper cannot be taken off (something wrapped it
    after us): it stays in that chain and only delegates."""

    __slots__ = ("strategy", "own", "mark", "wrapper")

    def __init__(self, strategy: Any, mark: Callable[[], None]) -> None:
        self.strategy = strategy
        self.own = strategy.__dict__.get(METHOD)  # an instance attribute already there (another tool's wrapper)
        self.mark: Optional[Callable[[], None]] = mark
        inner = getattr(strategy, METHOD)
        handle = self

        def batch_to_device(*args: Any, **kwargs: Any) -> Any:
            mark = handle.mark
            if mark is not None:
                try:
                    mark()
                except Exception:  # noqa: BLE001 - a measurement never raises into the user's transfer
                    pass
            return inner(*args, **kwargs)  # the user's own errors go on as they would without us

        self.wrapper = batch_to_device


def install(strategy: Any, mark: Callable[[], None]) -> Optional[TransferMark]:
    """Wraps ``strategy.batch_to_device`` on the instance; None (nothing changed) where it has no such method."""
    if not callable(getattr(strategy, METHOD, None)):
        return None
    handle = TransferMark(strategy, mark)
    setattr(strategy, METHOD, handle.wrapper)
    return handle


def uninstall(handle: Optional[TransferMark]) -> None:
    """Gives the strategy the ``batch_to_device`` it had: its class's method (the instance attribute goes) or the
    instance attribute that was there before. When another wrapper went on top of ours, ours cannot come off without
    breaking that one: it stops marking and only delegates."""
    if handle is None:
        return
    handle.mark = None
    strategy = handle.strategy
    if strategy.__dict__.get(METHOD) is handle.wrapper:
        if handle.own is None:
            delattr(strategy, METHOD)
        else:
            setattr(strategy, METHOD, handle.own)
