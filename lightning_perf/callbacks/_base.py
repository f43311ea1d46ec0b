"""The base of every lightning_perf callback: guarded hooks, warn-once, failure records, its summary section."""

from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Dict, Optional, TypeVar

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from lightning_perf.callbacks._arguments import check_path, check_text
from lightning_perf.callbacks._summary_book import book_for
from lightning_perf.errors import PerfCheckFailed

F = TypeVar("F", bound=Callable[..., Any])


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

    wrapper.__guarded__ = hook  # type: ignore[attr-defined] - PerfSuite calls it with one guard of its own
    return wrapper  # type: ignore[return-value]


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

    @property
    def state_key(self) -> str:
        """The class name (what checkpoints have always used), with the ``summary_path`` when one is given, so two
        instances of one class writing different files never share checkpoint state."""
        if self.summary_path is None:
            return type(self).__qualname__
        return self._generate_state_key(summary_path=self.summary_path)

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        for name in self._transient + ("_trainer_ref",):
            if name in state:
                state[name] = None
        return state

    def __init__(self, summary_path: Optional[str] = None, run_name: Optional[str] = None,
                 run_notes: Optional[str] = None) -> None:
        super().__init__()
        owner = type(self).__name__
        self.summary_path = check_path(owner, "summary_path", summary_path)
        self.run_name = check_text(owner, "run_name", run_name)
        self.run_notes = check_text(owner, "run_notes", run_notes)
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
    def _start_run(self, trainer: Trainer, stage: str = "fit") -> None:
        """Called from ``setup``: forgets the last run's failures and joins this trainer's summary file of ``stage``
        (a fit's file, or a validate/test/predict file beside it). Fails fast on an output path it cannot write."""
        self._failures.clear()
        book_for(trainer).attach(trainer, self, stage)

    def _carry_or_reset(self, trainer: Trainer, reset: Callable[[], None]) -> None:
        """A new fit on the same Trainer (``fit_loop.max_epochs`` raised, ``fit`` again) continues the run like a
        resume does: its state goes through ``state_dict``/``load_state_dict``; another Trainer starts afresh."""
        ref = getattr(self, "_trainer_ref", None)
        carry = self.state_dict() if ref is not None and ref() is trainer else None
        reset()
        if carry:
            self.load_state_dict(carry)
        self._trainer_ref = weakref.ref(trainer)

    def _write_summary(self, trainer: Trainer, exception: Optional[BaseException] = None) -> None:
        """This callback's run has ended (or failed): the file is written once every callback of the record has
        said so, and at once on an exception."""
        try:
            book_for(trainer).write(trainer, exception, ended=self)
        except Exception as err:  # noqa: BLE001
            self._record_failure("write_summary", err)

    def _flush_summary(self, trainer: Trainer) -> None:
        """From ``teardown``: writes a record some callback never ended (its end hook failed before it could)."""
        try:
            book_for(trainer).flush(trainer)
        except Exception as err:  # noqa: BLE001
            self._record_failure("write_summary", err)

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        self._flush_summary(trainer)
