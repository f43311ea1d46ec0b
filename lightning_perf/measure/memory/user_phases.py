"""Memory phases a user opens around code of their own: ``with phase("eval_in_train_hooks"):``.

Evaluation that a training hook runs (a sampling pass or ``self.validation_step`` called from
``on_train_batch_end``/``on_train_epoch_end``) happens inside Lightning's training phase, so its peak would be
folded into the train peak. Wrapped in :class:`phase`, :class:`~lightning_perf.VRAMMonitor` gives it a peak of its
own. With no monitor listening it costs one list read; nothing here runs on the step path unless the user's code
enters a phase. No Lightning import here.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, List

#: Phase names a user may open; each is a key of ``vram.phases`` in the summary.
PHASE_NAMES = ("eval_in_train_hooks",)

#: Listeners are weak references to bound methods ``listener(name, entering)``: a monitor that is gone is dropped.
_listeners: List[Any] = []
_depth = threading.local()


def add_listener(method: Callable[[str, bool], None]) -> None:
    """Makes the bound method ``method`` hear every outermost enter and exit of a phase (weakly held)."""
    remove_listener(method)
    _listeners.append(weakref.WeakMethod(method))


def remove_listener(method: Callable[[str, bool], None]) -> None:
    _listeners[:] = [ref for ref in _listeners if ref() is not None and ref() != method]


def _tell(name: str, entering: bool) -> None:
    for ref in list(_listeners):
        listener = ref()
        if listener is None:
            continue
        try:
            listener(name, entering)
        except Exception:  # noqa: BLE001 - a measurement never raises into the user's hook; the monitor records it
            pass


class phase:  # noqa: N801 - used like a function: `with phase("eval_in_train_hooks"):`
    """Counts the memory of the code inside in its own phase of :class:`~lightning_perf.VRAMMonitor`.

    Wrap evaluation that a training hook runs, so its peak is not folded into the train peak::

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if batch_idx % 100 == 0:
                with lightning_perf.phase("eval_in_train_hooks"), torch.no_grad():
                    self.render_test_views()

    Only inside training does it open a phase (elsewhere the memory stays in the phase it is in). Nested uses of
    one name count as one phase. An exception inside closes the phase and goes on. With no VRAMMonitor attached it
    does nothing but one check.

    Args:
        name: the phase, one of ``eval_in_train_hooks``.

    Raises:
        ValueError: for another name, at the call.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if name not in PHASE_NAMES:
            raise ValueError(f"Unsupported parameter value `phase(name={name!r})`. Possible choices are:"
                             f" {', '.join(PHASE_NAMES)}.")
        self.name = name

    def __enter__(self) -> "phase":
        depth = getattr(_depth, "value", 0)
        _depth.value = depth + 1
        if depth == 0 and _listeners:
            _tell(self.name, True)
        return self

    def __exit__(self, *exc: Any) -> None:
        _depth.value = getattr(_depth, "value", 1) - 1
        if _depth.value == 0 and _listeners:
            _tell(self.name, False)
