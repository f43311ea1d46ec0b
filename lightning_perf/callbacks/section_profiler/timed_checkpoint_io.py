"""Times checkpoint writes through Lightning's public ``CheckpointIO`` plugin interface: the strategy's own
``CheckpointIO`` goes inside a delegating one for the fit, and comes back at teardown. Nothing of the trainer is
replaced, no private name is read."""

from __future__ import annotations

from typing import Any, Callable, Optional

from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import Strategy

from lightning_perf.measure.timing.clock import now

#: Said in the summary when a strategy writes checkpoints its own way (FSDP, DeepSpeed, XLA, model parallel).
OWN_WRITER_REASON = ("{strategy} writes checkpoints its own way, not through a CheckpointIO plugin: saves stay inside"
                     " the section they ran in (usually `other` or `data_loading`).")


class TimedCheckpointIO(CheckpointIO):
    """Delegates every call to ``inner``; reports the seconds each save and each removal took to ``on_written``."""

    def __init__(self, inner: CheckpointIO, on_written: Callable[[float], None]) -> None:
        self.inner = inner
        self.on_written = on_written

    def _timed(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        start = now()
        try:
            return fn(*args, **kwargs)
        finally:
            self.on_written(now() - start)

    def save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self._timed(self.inner.save_checkpoint, *args, **kwargs)

    def remove_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self._timed(self.inner.remove_checkpoint, *args, **kwargs)

    def load_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.load_checkpoint(*args, **kwargs)

    def teardown(self) -> None:
        self.inner.teardown()

    def __getattr__(self, name: str) -> Any:  # anything else a plugin offers (an async writer's executor, ...)
        if name in ("inner", "on_written"):
            raise AttributeError(name)
        return getattr(self.inner, name)


def writes_through_checkpoint_io(strategy: Strategy) -> bool:
    """Whether ``strategy`` saves through ``strategy.checkpoint_io`` as the base Strategy does."""
    cls = type(strategy)
    return (cls.save_checkpoint is Strategy.save_checkpoint
            and getattr(cls, "checkpoint_io", None) is Strategy.__dict__["checkpoint_io"])


def install(strategy: Strategy, on_written: Callable[[float], None]) -> Optional[TimedCheckpointIO]:
    """Puts a TimedCheckpointIO around the strategy's plugin; None (nothing changed) where saves bypass it."""
    if not writes_through_checkpoint_io(strategy):
        return None
    timed = TimedCheckpointIO(strategy.checkpoint_io, on_written)
    strategy.checkpoint_io = timed
    return timed


def uninstall(strategy: Strategy, timed: Optional[TimedCheckpointIO]) -> None:
    """Gives the strategy its own plugin back, if ours is still the one in place."""
    if timed is not None and strategy.checkpoint_io is timed:
        strategy.checkpoint_io = timed.inner
