"""The PerfSuite that ``lightning-perf run`` attaches to a Trainer: it places its summary where the run's options
say, and stands aside (warns once, measures nothing) where it would change what the command does."""

from __future__ import annotations

import os
from typing import Any, Iterable, List, Optional

from lightning.pytorch import Callback

from lightning_perf._attach import (
    BASELINE_ENV,
    CALLBACKS_ENV,
    DEFAULT_CALLBACKS,
    NAME_ENV,
    OUT_ENV,
    TRIAL_ENV,
    env_text,
    gate_arguments,
    is_lightning_perf_callback,
    next_trainer_number,
    parse_callbacks,
    record,
    summary_file,
    warn_once,
)
from lightning_perf.callbacks.core.arguments import check_path, check_text
from lightning_perf.callbacks.core.base import SUITE_KEY
from lightning_perf.callbacks.core.summary_book import book_for
from lightning_perf.callbacks.perf_suite.callback import PerfSuite
from lightning_perf.errors import PerfCheckFailed, PerfConfigError


def members(callbacks: Iterable[Any]) -> List[Any]:
    """The callbacks, with each PerfSuite's own callbacks in its place (the ones that measure)."""
    found: List[Any] = []
    for cb in callbacks:
        found += list(getattr(cb, "callbacks", None) or []) if isinstance(cb, PerfSuite) else [cb]
    return found


def already_there(cls: type, callbacks: Iterable[Any]) -> bool:
    """Whether ``callbacks`` (PerfSuites looked into) hold a ``cls`` (also a subclass of it): a second one would
    measure the same thing again and write the same summary section."""
    return any(isinstance(cb, cls) for cb in members(callbacks))


def build_suite(beside: Optional[List[Any]] = None) -> "AttachedSuite":
    """The suite of the run's options (the environment ``lightning-perf run`` set). ``beside`` (the Trainer's own
    callbacks, given under ``lightning-perf matrix``): a suite that fills in what they lack, without the callbacks
    of a class they already hold (an empty suite when they hold them all)."""
    names = parse_callbacks(os.environ.get(CALLBACKS_ENV) or ",".join(DEFAULT_CALLBACKS))
    baseline = env_text(BASELINE_ENV)
    if baseline and "QualityGate" not in names:
        names.append("QualityGate")
    import lightning_perf

    callbacks: List[Callback] = []
    for name in names:
        cls = getattr(lightning_perf, name)
        if beside is not None and already_there(cls, beside):
            continue
        if name == "QualityGate" and baseline:
            callbacks.append(cls(baseline=baseline, **gate_arguments(baseline)))
        else:
            callbacks.append(cls())
    trial = env_text(TRIAL_ENV)
    if trial and not (beside is not None and already_there(lightning_perf.ABTrial, beside)):
        callbacks.append(_trial(trial))
    return AttachedSuite(callbacks, out=env_text(OUT_ENV), name=env_text(NAME_ENV), fill=beside is not None)


def _trial(change: str) -> Any:
    """The ``ABTrial`` of ``--trial``. A change of the user's is imported here, in the command's Python (the one
    place that can import it, as the Trainer is built); one that cannot be imported or used is refused at set-up,
    recorded in the trial section (``status: not-started``, ``reason``) with one warning, and the fit runs on."""
    from lightning_perf import ABTrial
    from lightning_perf.measure.trials.changes import Refused

    try:
        trial = ABTrial(change=change)
    except PerfConfigError as err:  # the module or a name cannot be used: the refusal waits for set-up
        trial = ABTrial(change=change, switch_on=_nothing, switch_off=_nothing)
        trial.change = Refused(change, str(err))
    trial.record_refusal = True  # a change this run cannot try: the other callbacks measure on
    return trial


def _nothing(*args: Any, **kwargs: Any) -> None:
    """The step hook of a suite left without callbacks."""


class AttachedSuite(PerfSuite):
    """A :class:`PerfSuite` attached by ``lightning-perf run``.

    Args:
        callbacks: the lightning_perf callbacks it drives.
        out: the folder of its summary; None: the Trainer's ``log_dir``.
        name: the summaries' ``run.name``.

    At its Trainer's first set-up it takes the next number of the command (1, 2, ..., counted over all its
    processes; under DDP rank 0's): the first Trainer writes ``perf_summary.json``, the N-th
    ``perf_summary_trainer<N>.json`` (``run.name`` ``NAME-trainer<N>``). It stands
    aside when the Trainer has other lightning_perf callbacks by then (appended after construction, or from the
    module's ``configure_callbacks``), and when its callbacks refuse their set-up (a summary path that cannot be
    written): the command runs on, unmeasured by it.

    ``fill`` (``lightning-perf matrix``): it fills in what the Trainer's own lightning_perf callbacks lack. At set-up
    it drops each of its callbacks whose class the Trainer has by then, and stands aside for no other callback; with
    none left it measures nothing, but still reports the files the Trainer's summary went to.
    """

    def __init__(self, callbacks: List[Callback], out: Optional[str] = None, name: Optional[str] = None,
                 fill: bool = False) -> None:
        super().__init__(callbacks)
        self.out = out
        self.name = name
        self.fill = fill
        self.trainer_number: Optional[int] = None

    def _compute_state_key(self) -> str:
        """The key a ``PerfSuite`` of these callbacks has: a checkpoint of a run with the suite attached resumes with
        explicit callbacks, and the other way round."""
        return f"{SUITE_KEY}{repr({'callbacks': [cb.state_key for cb in self.callbacks]})}"

    def _build_dispatch(self) -> None:
        PerfSuite._build_dispatch(self)
        if self.callbacks:
            self.__dict__.pop("on_train_batch_end", None)
        else:  # no callback of its own: it must not hand the loggers the other callbacks' scalars at each step
            self.on_train_batch_end = _nothing

    def _stand_aside(self, trainer: Any, why: str, event: str = "left_alone") -> None:
        self.callbacks = []
        self._build_dispatch()
        record(event, reason=why)

    def _drop_taken(self, trainer: Any) -> None:
        """Under ``fill``: its callbacks of a class the Trainer has by then (from ``configure_callbacks``) go."""
        others = [cb for cb in trainer.callbacks if cb is not self and is_lightning_perf_callback(cb)]
        keep = [cb for cb in self.callbacks if not already_there(type(cb), others)]
        if len(keep) < len(self.callbacks):
            gone = [type(cb).__name__ for cb in self.callbacks if cb not in keep]
            record("left_alone", reason="the Trainer has " + ", ".join(gone) + " of its own", dropped=gone)
            self.callbacks = keep
            self._build_dispatch()

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self.callbacks and not self.fill:
            return
        try:
            if self.fill:
                self._drop_taken(trainer)
            elif any(cb is not self and is_lightning_perf_callback(cb) for cb in trainer.callbacks):
                self._stand_aside(trainer, "the Trainer has lightning_perf callbacks of its own")
                return
            if self.trainer_number is None:
                self.trainer_number = self._take_number(trainer)
                self._place(trainer)
        except Exception as err:  # noqa: BLE001
            warn_once("place", f"the summary cannot be placed ({type(err).__name__}: {err}); this Trainer runs"
                      " unmeasured")
            self._stand_aside(trainer, f"{type(err).__name__}: {err}", "failed")
            return
        try:
            PerfSuite.setup(self, trainer, pl_module, stage)
        except PerfCheckFailed as err:  # PerfConfigError: an output that cannot be written, a state key taken
            warn_once("setup", f"{err}; this Trainer runs unmeasured")
            PerfSuite.teardown(self, trainer, pl_module, stage)  # undoes what the callbacks set up
            self._stand_aside(trainer, str(err), "failed")
            return
        # a SIGTERM held while the fit's end is written ends the process before teardown: said before it does
        book_for(trainer).before_raising = lambda: self._record_written(trainer)

    @staticmethod
    def _take_number(trainer: Any) -> int:
        """The Trainer's number, the same on every rank: rank 0 takes it, a DDP fit's other ranks (processes of the
        command too) get it from rank 0 (set-up runs on every rank once the process group is up)."""
        number = next_trainer_number() if trainer.is_global_zero else None
        if trainer.world_size > 1:
            number = trainer.strategy.broadcast(number, src=0)
        return int(number or 1)

    def _place(self, trainer: Any) -> None:
        number = self.trainer_number or 1
        folder = self.out
        if folder is None and number > 1:  # beside the first's default place, under a name of its own
            folder = trainer.log_dir or trainer.default_root_dir
        for cb in self.callbacks:
            if folder is not None:
                cb.summary_path = check_path(type(cb).__name__, "summary_path",
                                             os.path.join(folder, summary_file(number)))
            if self.name:
                cb.run_name = check_text(type(cb).__name__, "run_name",
                                         self.name if number == 1 else f"{self.name}-trainer{number}")

    def _record_written(self, trainer: Any) -> None:
        try:
            paths = book_for(trainer).written_paths
        except Exception:  # noqa: BLE001
            return
        if paths and self.trainer_number is not None:
            record("written", trainer=self.trainer_number, paths=paths)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        PerfSuite.teardown(self, trainer, pl_module, stage)
        self._record_written(trainer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        PerfSuite.on_exception(self, trainer, pl_module, exception)
        self._record_written(trainer)
