"""What every lightning_perf callback shares: guarded hooks, warn-once, logging, the DDP gather, the summary book."""

from __future__ import annotations

import datetime as _dt
import functools
import math
import os
import platform
import socket
import sys
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, TypeVar

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_perf.summary.io import write_json_atomic
from lightning_perf.summary.schema import SCHEMA_VERSION, SUMMARY_FILENAME

F = TypeVar("F", bound=Callable[..., Any])

#: Environment variable naming the summary file (used by `lightning-perf matrix` for each variant's process).
SUMMARY_PATH_ENV = "LIGHTNING_PERF_SUMMARY_PATH"


class PerfCheckFailed(RuntimeError):
    """A check the user asked to fail on has failed. The only error a lightning_perf hook lets through."""


class PerfConfigError(PerfCheckFailed, ValueError):
    """A setting that can only be checked once training runs (outputs, logged names) is wrong; raised at once."""


def guarded(hook: F) -> F:
    """Wraps a callback hook so that a failing measurement warns once and is recorded, never raised into training."""

    @functools.wraps(hook)
    def wrapper(self: "PerfCallback", *args: Any, **kwargs: Any) -> Any:
        try:
            return hook(self, *args, **kwargs)
        except PerfCheckFailed:
            raise
        except Exception as err:  # noqa: BLE001 - a measurement must never stop training
            self._record_failure(hook.__name__, err)
            return None

    return wrapper  # type: ignore[return-value]


def bad_argument(owner: str, name: str, value: Any, allowed: str) -> ValueError:
    """The constructor error of the suite: names the call, the bad value and what is allowed."""
    return ValueError(f"Unsupported parameter value `{owner}({name}={value!r})`. {allowed}")


def check_positive_int(owner: str, name: str, value: Any, allow_none: bool = False, minimum: int = 1) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " or None" if allow_none else ""
        raise bad_argument(owner, name, value, f"Expected an integer >= {minimum}{extra}.")


def iso_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


_LOGGED: "weakref.WeakKeyDictionary[Trainer, Dict[str, int]]" = weakref.WeakKeyDictionary()


def log_scalars(trainer: Trainer, metrics: Dict[str, float], step: Optional[int] = None) -> None:
    """Sends finite scalars to every logger of the trainer (loggers log on rank 0 only), each key at most once per
    step: a phase end that falls on a periodic log step would otherwise draw two points at one step."""
    if not trainer.loggers:
        return
    step = trainer.global_step if step is None else step
    last = _LOGGED.get(trainer)
    if last is None:
        last = _LOGGED[trainer] = {}
    clean = {}
    for key, value in metrics.items():
        if value is None or not math.isfinite(float(value)) or last.get(key) == step:
            continue
        clean[key] = float(value)
        last[key] = step
    if not clean:
        return
    for logger in trainer.loggers:
        logger.log_metrics(clean, step=step)


def gather_floats(trainer: Trainer, values: Sequence[Optional[float]]) -> List[List[Optional[float]]]:
    """One ``all_gather`` on every rank; returns one row of ``values`` per rank (None where a rank had none).

    The caller must reach this on every rank with the same number of values: compute them first, then gather.
    """
    if trainer.world_size <= 1:
        return [list(values)]
    import torch

    tensor = torch.tensor(
        [math.nan if v is None else float(v) for v in values],
        dtype=torch.float64,
        device=trainer.strategy.root_device,
    )
    gathered = trainer.strategy.all_gather(tensor)
    rows = gathered.reshape(trainer.world_size, len(values)).cpu().tolist()
    return [[None if math.isnan(v) else v for v in row] for row in rows]


def spread_across_ranks(per_rank: Sequence[Optional[float]], higher_is_worse: bool = True) -> Dict[str, Any]:
    """min / median / max of a per-rank figure and which rank is worst."""
    known = [(v, r) for r, v in enumerate(per_rank) if v is not None]
    if not known:
        return {"per_rank": list(per_rank), "min": None, "median": None, "max": None, "worst_rank": None}
    ordered = sorted(v for v, _ in known)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    worst = max(known)[1] if higher_is_worse else min(known)[1]
    return {"per_rank": list(per_rank), "min": ordered[0], "median": median, "max": ordered[-1], "worst_rank": worst}


class PerfCallback(Callback):
    """Base of the suite's callbacks: warn-once, failure records, and one section in the run's summary file.

    Args:
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.
    """

    #: The key of this callback's section in perf_summary.json.
    section_name: str = ""
    #: Attributes that hold a running fit's threads, locks, bound trainer methods or device events: a copy or a
    #: pickle (``copy.deepcopy``, a spawned process) gets None in their place instead of failing on a lock.
    _transient: tuple = ()

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        for name in self._transient:
            if name in state:
                state[name] = None
        return state

    def __init__(self, summary_path: Optional[str] = None) -> None:
        super().__init__()
        self.summary_path = summary_path
        self._warned: set = set()
        self._failures: Dict[str, str] = {}

    # -- helpers -------------------------------------------------------------------------------------------------
    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(f"{type(self).__name__}: {message}")

    def _record_failure(self, where: str, err: BaseException) -> None:
        reason = f"{type(err).__name__}: {err}"
        self._failures.setdefault(where, reason)
        self._warn_once(
            f"failure:{where}", f"measurement failed in `{where}` and was skipped ({reason}); training goes on."
        )

    def _summary_section(self) -> Dict[str, Any]:
        """The callback's section of perf_summary.json. Overridden by each callback."""
        return {}

    def summary_section(self) -> Dict[str, Any]:
        """The section plus any failures this callback recorded (never raises)."""
        try:
            section = dict(self._summary_section())
        except Exception as err:  # noqa: BLE001
            section = {"error": f"{type(err).__name__}: {err}"}
        if self._failures:
            section["measurement_failures"] = dict(self._failures)
        return section

    # -- summary plumbing ----------------------------------------------------------------------------------------
    def _start_run(self, trainer: Trainer) -> None:
        """Called from ``setup``: forgets the last fit's failures and joins this trainer's summary file."""
        self._failures.clear()
        book_for(trainer).attach(trainer, self)

    def _write_summary(self, trainer: Trainer, exception: Optional[BaseException] = None) -> None:
        try:
            book_for(trainer).write(trainer, exception)
        except Exception as err:  # noqa: BLE001
            self._record_failure("write_summary", err)


# ---------------------------------------------------------------------------------------------------------------
# The summary book: one per Trainer, so that callbacks which never import each other write one file together.
# ---------------------------------------------------------------------------------------------------------------


class SummaryBook:
    """Collects the sections of every lightning_perf callback of one Trainer and writes them as one file."""

    def __init__(self) -> None:
        self.callbacks: List[PerfCallback] = []
        self.started_at: Optional[str] = None
        self.log_dir: Optional[str] = None
        self._written_paths: set = set()
        self.finished = False

    def attach(self, trainer: Trainer, callback: PerfCallback) -> None:
        """Called from ``setup`` on every rank: the only place ``trainer.log_dir`` (a broadcast under DDP) is read."""
        if self.finished:  # a new fit with the same trainer starts a new file
            self.__init__()  # type: ignore[misc]
        if self.log_dir is None:
            self.log_dir = trainer.log_dir or trainer.default_root_dir
        if callback not in self.callbacks:
            self.callbacks.append(callback)
        if self.started_at is None:
            self.started_at = iso_now()

    def paths(self, trainer: Trainer) -> List[str]:
        """Explicit ``summary_path`` arguments, else $LIGHTNING_PERF_SUMMARY_PATH, else <log_dir>/perf_summary.json."""
        explicit = [cb.summary_path for cb in self.callbacks if cb.summary_path]
        if explicit:
            return list(dict.fromkeys(str(p) for p in explicit))
        if os.environ.get(SUMMARY_PATH_ENV):
            return [os.environ[SUMMARY_PATH_ENV]]
        return [os.path.join(self.log_dir or trainer.default_root_dir, SUMMARY_FILENAME)]

    def build(self, trainer: Trainer, exception: Optional[BaseException] = None) -> Dict[str, Any]:
        if exception is None:
            status, error = "completed", None
        else:
            # Ctrl-C, and SIGTERM (Lightning raises SIGTERMException, a SystemExit, when its handler sees one)
            interrupted = isinstance(exception, (KeyboardInterrupt, SystemExit))
            status = "interrupted" if interrupted else "failed"
            error = {"type": type(exception).__name__, "message": str(exception)[:4000]}
            if interrupted:
                error["signal"] = "SIGINT" if isinstance(exception, KeyboardInterrupt) else (
                    "SIGTERM" if type(exception).__name__ == "SIGTERMException" else None)
                error["message"] = error["message"] or f"interrupted by {error['signal'] or 'SystemExit'}"
        data: Dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "status": status,
            "error": error,
            "run": run_info(trainer, self.started_at, self.log_dir),
        }
        for cb in self.callbacks:
            data[cb.section_name] = cb.summary_section()
        return data

    def write(self, trainer: Trainer, exception: Optional[BaseException] = None) -> None:
        """Called by each callback at fit end or on an exception; every call writes the whole file (rank 0)."""
        self.finished = True
        if not trainer.is_global_zero:
            return
        data = self.build(trainer, exception)
        for path in self.paths(trainer):
            write_json_atomic(path, data)
            if path not in self._written_paths:
                self._written_paths.add(path)
                rank_zero_info(f"lightning_perf: summary written to {path}")


_BOOKS: "weakref.WeakKeyDictionary[Trainer, SummaryBook]" = weakref.WeakKeyDictionary()


def book_for(trainer: Trainer) -> SummaryBook:
    book = _BOOKS.get(trainer)
    if book is None:
        book = _BOOKS[trainer] = SummaryBook()
    return book


def _device_name(trainer: Trainer) -> str:
    import torch

    device = trainer.strategy.root_device
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return f"{device.type}: {platform.processor() or platform.machine()}"


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
