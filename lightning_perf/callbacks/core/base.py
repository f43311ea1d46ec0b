"""The base of every lightning_perf callback: guarded hooks, warn-once, failure records, its summary section."""

from __future__ import annotations

import copy
import functools
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

from lightning.pytorch import Callback, Trainer
from lightning.pytorch.utilities import rank_zero_warn

from lightning_perf.callbacks.core.arguments import check_path, check_text
from lightning_perf.callbacks.core.scalars import WAITING, discard_scalars, drain_scalars, flush_scalars
from lightning_perf.callbacks.core.state import StateError
from lightning_perf.callbacks.core.summary_book import book_for, error_message, trainer_stage
from lightning_perf.errors import PerfCheckFailed, PerfConfigError

F = TypeVar("F", bound=Callable[..., Any])


def guarded(hook: F) -> F:
    """Wraps a callback hook so that a failing measurement warns once and is recorded, never raised into training.

    The hooks Lightning calls at every training step (batch start and end, around backward and the optimizer step)
    guard themselves inline instead: the same ``try``, with ``except Exception`` recording the hook's name, inside the
    hook. This wrapper is a Python frame more on every call, ~0.4 µs a call right after a step's torch work
    (``python benchmarks/overhead.py --hooks-only SectionProfiler --against <checkout>``: 18.2 µs a step with it on
    its six step hooks, 15.0 inline; EvalNoGradGuard's three 5.1 and 3.8). ``tests/test_inline_guards.py`` breaks
    each such hook and checks its guard, and that every other hook has this one. IterationTimer's one step hook keeps
    this wrapper: 0.4 µs a step is under the 2 µs that keeps a speed trick."""

    @functools.wraps(hook)
    def wrapper(self: "PerfCallback", *args: Any, **kwargs: Any) -> Any:
        try:
            return hook(self, *args, **kwargs)
        except PerfCheckFailed:
            raise
        except Exception as err:  # noqa: BLE001 - a measurement must never stop training
            self._record_failure(hook.__name__, err)
            return None

    wrapper.__guarded__ = hook  # type: ignore[attr-defined] - a mark: tests/test_inline_guards.py finds guards by it
    return wrapper  # type: ignore[return-value]


def reads_state(load: F) -> F:
    """Wraps a callback's ``load_state_dict``: state this version cannot read (another version's, edited by hand) is
    warned about once, recorded under the section's ``unavailable.checkpoint_state`` and left out; the callback goes
    on with what it had (fresh, on a resume) and training resumes. The loaders read everything (with
    :class:`~lightning_perf.callbacks.core.state.StateReader`) before they assign anything, so nothing is
    half-loaded."""

    @functools.wraps(load)
    def wrapper(self: "PerfCallback", state_dict: Any) -> None:
        try:
            if not isinstance(state_dict, dict):
                raise StateError(f"the state is a {type(state_dict).__name__}, expected a dict")
            known = set(self.state_dict())
            if not known & set(state_dict):
                raise StateError(f"the state has none of the keys this version writes ({', '.join(sorted(known))})"
                                 if state_dict else "the state is empty")
            load(self, state_dict)
        except Exception as err:  # noqa: BLE001 - a checkpoint's measurements must never stop a resume
            self._state_unreadable(err)

    return wrapper  # type: ignore[return-value]


#: The checkpoint key of a PerfSuite starts with this: its entry holds its callbacks' states by their own keys.
SUITE_KEY = "PerfSuite"


def callback_states(checkpoint: Any) -> Dict[Any, Any]:
    """The checkpoint's ``callbacks`` dict (state_key -> state), or an empty one."""
    states = checkpoint.get("callbacks") if isinstance(checkpoint, dict) else None
    return states if isinstance(states, dict) else {}


def state_locations(states: Dict[Any, Any]) -> List[Tuple[Optional[str], Dict[Any, Any]]]:
    """Where a lightning_perf callback's state can be in a checkpoint: (None, the top level) for a callback given to
    the Trainer itself, then (the suite's key, its entry) for each PerfSuite."""
    return [(None, states)] + [(key, entry) for key, entry in states.items()
                               if isinstance(key, str) and key.startswith(SUITE_KEY) and isinstance(entry, dict)]


class HeldStateKey:
    """A callback's ``state_key``, held on the instance. Lightning reads ``state_key`` at every hook call of every
    callback (the name of its profiler's action), six calls a step: a property is a Python call each time, right
    after a step's work. This descriptor builds the key (the owner's ``_compute_state_key()``) where the instance
    holds none and stores it in the instance, where every later read finds it as a plain attribute (a descriptor
    without ``__set__`` lets the instance's own attribute win). What the key is built from drops it when it changes
    (``self.__dict__.pop("state_key", None)``)."""

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self
        key = obj.__dict__["state_key"] = obj._compute_state_key()
        return key


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

    state_key = HeldStateKey()

    def _compute_state_key(self) -> str:
        """The class name (what checkpoints have always used), with the ``summary_path`` when one is given, so two
        instances of one class writing different files never share checkpoint state."""
        if self.summary_path is None:
            return type(self).__qualname__
        return self._generate_state_key(summary_path=self.summary_path)

    @property
    def summary_path(self) -> Optional[str]:
        return self._summary_path

    @summary_path.setter
    def summary_path(self, value: Optional[str]) -> None:
        self._summary_path = value
        self.__dict__.pop("state_key", None)  # the key names the path: built again at its next read

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
        self._state_problem: Optional[str] = None  # why the checkpoint's state of this callback was not used

    # -- helpers -------------------------------------------------------------------------------------------------
    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(f"{type(self).__name__}: {message}")

    def _record_failure(self, where: str, err: BaseException) -> None:
        reason = f"{type(err).__name__}: {error_message(err)}"
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
            section = {"error": f"{type(err).__name__}: {error_message(err)}"}
        if self._failures:
            section["measurement_failures"] = dict(self._failures)
        if getattr(self, "_state_problem", None):
            unavailable = section.get("unavailable")
            section["unavailable"] = {**(unavailable if isinstance(unavailable, dict) else {}),
                                      "checkpoint_state": self._state_problem}
        return section

    # -- checkpoint state ----------------------------------------------------------------------------------------
    def _state_unreadable(self, err: BaseException) -> None:
        reason = str(err) if isinstance(err, StateError) else f"{type(err).__name__}: {err}"
        self._state_problem = (f"the checkpoint's {type(self).__name__} state could not be read ({reason}); the"
                               " measurements from before the resume are not in this summary")
        self._warn_once("state", f"{self._state_problem}. It starts fresh and training resumes.")

    def _state_missing(self, step: Any) -> None:
        at = f" at step {step}" if isinstance(step, int) and not isinstance(step, bool) else ""
        self._state_problem = (f"resumed{at} from a checkpoint without {type(self).__name__} state (saved without"
                               " this callback, or with another `summary_path`); the measurements from before the"
                               " resume are not in this summary")
        self._warn_once("state", f"{self._state_problem}.")

    def on_load_checkpoint(self, trainer: Trainer, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        """Lightning gives ``load_state_dict`` only the entry under this callback's own ``state_key``: a state saved
        by this callback inside a :class:`PerfSuite` is found here, in the whole checkpoint."""
        try:
            states = callback_states(checkpoint)
            if self.state_key in states:
                if not states[self.state_key]:  # Lightning passes no empty state on: said here
                    self.load_state_dict(states[self.state_key])
                return
        except Exception as err:  # noqa: BLE001 - a checkpoint's measurements must never stop a resume
            self._state_unreadable(err)
            return
        self._restore_state(trainer, checkpoint, delivered_from=None)

    def _restore_state(self, trainer: Trainer, checkpoint: Dict[str, Any], delivered_from: Optional[str]) -> None:
        """Loads this callback's state from wherever the checkpoint holds it, except ``delivered_from`` (where
        Lightning looks: None for the top level, else a suite's key); none found: the resume goes on without the
        earlier measurements, and the summary says so. Only when fitting: validate/test/predict keep no run."""
        try:
            if trainer_stage(trainer) != "fit":
                return
            for where, entry in state_locations(callback_states(checkpoint)):
                if where != delivered_from and self.state_key in entry:
                    self.load_state_dict(copy.deepcopy(entry[self.state_key]))
                    return
            self._state_missing(checkpoint.get("global_step") if isinstance(checkpoint, dict) else None)
        except Exception as err:  # noqa: BLE001 - a checkpoint's measurements must never stop a resume
            self._state_unreadable(err)

    # -- summary plumbing ----------------------------------------------------------------------------------------
    def _start_run(self, trainer: Trainer, stage: str = "fit") -> None:
        """Called from ``setup``: forgets the last run's failures and joins this trainer's summary file of ``stage``
        (a fit's file, or a validate/test/predict file beside it). Fails fast on an output path it cannot write."""
        self._failures.clear()
        self._state_problem = None
        self._check_unique(trainer)
        book_for(trainer).attach(trainer, self, stage)

    def _check_unique(self, trainer: Trainer) -> None:
        """Two lightning_perf callbacks of one key in one Trainer (one given to the Trainer, one inside a PerfSuite,
        or in two suites) would share a checkpoint entry and a summary section: refused, naming both places."""
        places = []
        for cb in trainer.callbacks:
            if isinstance(cb, PerfCallback):
                places.append((cb, "the Trainer's callbacks"))
            elif isinstance(cb.state_key, str) and cb.state_key.startswith(SUITE_KEY):
                places += [(inner, f"`{cb.state_key}`") for inner in getattr(cb, "callbacks", ())
                           if isinstance(inner, PerfCallback)]
        mine = [where for cb, where in places if cb is self]
        if len(mine) > 1:  # one object in two places: Lightning would call each of its hooks twice a step
            raise PerfConfigError(
                f"{type(self).__name__}: the same callback object is given twice, in {mine[0]} and in {mine[1]}; every"
                " hook would run twice and each figure count twice. Give it once.")
        others = [where for cb, where in places if cb is not self and cb.state_key == self.state_key]
        if others:
            raise PerfConfigError(
                f"{type(self).__name__}: this Trainer has two lightning_perf callbacks with the state key"
                f" {self.state_key!r} (in {(mine or ['?'])[0]} and in {others[0]}); their checkpoint state and summary"
                " section would collide. Keep one, or give them different `summary_path`s.")

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
        self._flush_scalars(trainer)
        try:
            book_for(trainer).write(trainer, exception, ended=self)
        except Exception as err:  # noqa: BLE001
            self._record_failure("write_summary", err)

    def _flush_summary(self, trainer: Trainer) -> None:
        """From ``teardown``: writes a record some callback never ended (its end hook failed before it could)."""
        self._flush_scalars(trainer)
        try:
            book_for(trainer).flush(trainer)
        except Exception as err:  # noqa: BLE001
            self._record_failure("write_summary", err)

    def _flush_scalars(self, trainer: Trainer) -> None:
        """Window scalars that still wait for the loggers (see ``core.scalars``) go out before the run ends."""
        try:
            flush_scalars(trainer)
        except Exception as err:  # noqa: BLE001
            discard_scalars(trainer)
            self._record_failure("logging", err)

    def _drain_scalars(self, trainer: Trainer) -> None:
        """At a batch end, outside a PerfSuite (the suite drains once for all its callbacks): a few waiting window
        scalars to the loggers."""
        if WAITING.count and not self._in_suite:
            drain_scalars(trainer, batch_end=True)

    #: Set by a PerfSuite on the callbacks it drives.
    _in_suite = False

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        self._flush_summary(trainer)
