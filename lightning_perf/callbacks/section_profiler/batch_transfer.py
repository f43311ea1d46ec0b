"""Marks Lightning's host-to-device batch transfer: the strategy instance's ``batch_to_device`` (a public Strategy
method, which Lightning's loops look up on the instance) is wrapped for the fit and given back exactly at teardown or
after an exception (``callbacks/core/strategy_marks``)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from lightning_perf.callbacks.core import strategy_marks
from lightning_perf.callbacks.core.strategy_marks import StrategyMark

#: The strategy method Lightning's loops call to move a batch (``transfer_batch_to_device`` and
#: ``on_after_batch_transfer`` of the LightningModule or data module run inside it).
METHOD = "batch_to_device"


def install(strategy: Any, mark: Callable[[], None]) -> Optional[StrategyMark]:
    """Wraps ``strategy.batch_to_device`` on the instance: ``mark()`` as the transfer starts (where it ends, the next
    hook already marks: ``on_train_batch_start``). None (nothing changed) where it has no such method."""
    return strategy_marks.install(strategy, METHOD, mark)


def uninstall(handle: Optional[StrategyMark]) -> None:
    """Gives the strategy the ``batch_to_device`` it had (see ``strategy_marks.uninstall``)."""
    strategy_marks.uninstall(handle)
