"""The phases a user's training hook opens (``with lightning_perf.phase("eval_in_train_hooks"):``), for VRAMMonitor:
the train phase ends there (keeping its peak) and the hook's phase opens, as validation inside fit does."""

from __future__ import annotations

import weakref
from typing import Any

from lightning.pytorch import Trainer

from lightning_perf.callbacks.core.base import guarded
from lightning_perf.measure.memory.user_phases import add_listener, remove_listener


class HookPhases:
    """A mixin for a callback with ``_enter(phase)``, ``_exit(trainer, phase)``, ``_phase`` and ``_in_training``."""

    _hook_trainer: Any = None

    def _listen_to_hook_phases(self, trainer: Trainer) -> None:
        self._hook_trainer = weakref.ref(trainer)
        add_listener(self._hook_phase)

    def _stop_listening_to_hook_phases(self) -> None:
        remove_listener(self._hook_phase)
        self._hook_trainer = None

    @guarded
    def _hook_phase(self, name: str, entering: bool) -> None:
        """Ends the train phase (keeping its peak) and opens ``name``, or closes ``name`` and opens train again:
        what validation inside fit does, at the user's marks. Only inside training; no sync, no NVML call."""
        trainer = self._hook_trainer() if self._hook_trainer is not None else None
        if trainer is None or trainer.sanity_checking:
            return
        if entering and self._phase == "train":  # type: ignore[attr-defined]
            self._exit(trainer, "train")  # type: ignore[attr-defined]
            self._enter(name)  # type: ignore[attr-defined]
        elif not entering and self._phase == name:  # type: ignore[attr-defined]
            self._exit(trainer, name)  # type: ignore[attr-defined]
            if self._in_training:  # type: ignore[attr-defined]
                self._enter("train")  # type: ignore[attr-defined]
