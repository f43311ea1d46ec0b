"""The summary's `run` and `logged` blocks: when, where, with which versions and settings, and what the run logged."""

from __future__ import annotations

import datetime as _dt
import math
import os
import platform
import socket
import sys
from typing import Any, Callable, Dict, Optional

from lightning.pytorch import Trainer


def iso_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def _device_name(trainer: Trainer) -> str:
    import torch

    device = trainer.strategy.root_device
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return f"{device.type}: {platform.processor() or platform.machine()}"


def _cpu_count() -> Optional[int]:
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count()


def _memory_total_mb() -> Optional[float]:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (AttributeError, OSError, ValueError):  # no sysconf (Windows) or no such name
        return None


def _model_class(trainer: Trainer) -> Optional[str]:
    module = trainer.lightning_module
    return None if module is None else f"{type(module).__module__}.{type(module).__qualname__}"


def _num_workers(trainer: Trainer) -> Optional[int]:
    workers = getattr(trainer.train_dataloader, "num_workers", None)
    return workers if isinstance(workers, int) and not isinstance(workers, bool) else None


#: At most this many of the run's logged scalars go into the summary (the first by name).
MAX_LOGGED = 64


def logged_scalars(trainer: Trainer) -> Dict[str, Any]:
    """The last value of each scalar the run logged (``trainer.callback_metrics``: ``train_loss``, ``val_loss``,
    what ``ModelCheckpoint(monitor=...)`` watches), and the monitored name, so `report` shows a phase's loss with no
    extra set-up. Makes no collective call: the values are this rank's."""
    values: Dict[str, float] = {}
    try:
        metrics = dict(trainer.callback_metrics)
    except Exception:  # noqa: BLE001
        return {"values": {}, "monitor": None}
    for name in sorted(metrics)[:MAX_LOGGED]:
        value = metrics[name]
        try:
            number = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            continue
        if math.isfinite(number):
            values[str(name)] = number
    monitor = None
    try:
        callback = trainer.checkpoint_callback
        monitor = getattr(callback, "monitor", None) if callback is not None else None
    except Exception:  # noqa: BLE001
        pass
    return {"values": values, "monitor": monitor}


def run_info(trainer: Trainer, started_at: Optional[str], log_dir: Optional[str]) -> Dict[str, Any]:
    """The `run` block: when, where, with which versions and trainer settings. Makes no collective call."""
    import lightning
    import torch

    from lightning_perf import __version__

    info: Dict[str, Any] = {
        "started_at": started_at,
        "finished_at": iso_now(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "command": " ".join(sys.argv),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "lightning": lightning.__version__,
            "lightning_perf": __version__,
            "cuda": torch.version.cuda,
        },
    }
    settings: Dict[str, Callable[[], Any]] = {
        "device": lambda: _device_name(trainer),
        "accelerator": lambda: type(trainer.accelerator).__name__,
        "precision": lambda: str(trainer.precision),
        "strategy": lambda: type(trainer.strategy).__name__,
        "world_size": lambda: trainer.world_size,
        "num_nodes": lambda: trainer.num_nodes,
        "cpu_count": _cpu_count,
        "memory_total_mb": _memory_total_mb,
        "model_class": lambda: _model_class(trainer),
        "num_workers": lambda: _num_workers(trainer),
        "accumulate_grad_batches": lambda: trainer.accumulate_grad_batches,
        "max_steps": lambda: trainer.max_steps,
        "max_epochs": lambda: trainer.max_epochs,
        "global_step": lambda: trainer.global_step,
        "epochs_completed": lambda: trainer.current_epoch,
        "log_dir": lambda: log_dir,
    }
    for key, read in settings.items():
        try:
            info[key] = read()
        except Exception:  # noqa: BLE001 - a field we cannot read stays null
            info[key] = None
    return info
