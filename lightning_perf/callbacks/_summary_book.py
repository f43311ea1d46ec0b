"""The summary book: one per Trainer, so that callbacks which never import each other write one file together."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_perf.callbacks._run_info import iso_now, logged_scalars, run_info
from lightning_perf.errors import PerfConfigError
from lightning_perf.summary.io import probe_folder, write_json_atomic
from lightning_perf.summary.schema import SCHEMA_VERSION, SUMMARY_FILENAME

if TYPE_CHECKING:
    from lightning_perf.callbacks._base import PerfCallback

#: Environment variable naming the summary file (used by `lightning-perf matrix` for each variant's process).
SUMMARY_PATH_ENV = "LIGHTNING_PERF_SUMMARY_PATH"


def trainer_stage(trainer: Trainer) -> str:
    """``fit``, ``validate``, ``test`` or ``predict``: what the Trainer is running now (``trainer.state.fn``)."""
    fn = getattr(getattr(trainer, "state", None), "fn", None)
    return str(getattr(fn, "value", fn or "fit"))


def check_writable(what: str, path: str) -> None:
    """Fails at set-up, naming the argument, when ``path`` cannot be written: a run must not train for hours and
    then lose its file. Creates the folder, writes and removes a probe file."""
    if os.path.isdir(path):
        raise PerfConfigError(f"{what}={path!r} is a directory; expected a file path such as"
                              f" {os.path.join(path, SUMMARY_FILENAME)!r}.")
    try:
        probe_folder(path)
    except OSError as err:
        raise PerfConfigError(f"{what}={path!r} cannot be written ({type(err).__name__}: {err}); choose a writable"
                              " path. Checked before training so that no run loses its results.") from None


def stage_path(path: str, stage: str) -> str:
    """The file of a validate/test/predict run beside the fit's: ``perf_summary.json`` -> ``perf_summary_test.json``."""
    if stage == "fit":
        return path
    root, ext = os.path.splitext(path)
    return f"{root}_{stage}{ext or '.json'}"


class SummaryBook:
    """Collects the sections of every lightning_perf callback of one Trainer and writes them as one file.

    One record per run: a fit writes ``perf_summary.json``; a later ``validate``, ``test`` or ``predict`` on the same
    Trainer writes its own ``perf_summary_<stage>.json`` beside it and never touches the fit's file.
    """

    def __init__(self, stage: str = "fit") -> None:
        self.stage = stage
        self.callbacks: List[PerfCallback] = []
        self.started_at: Optional[str] = None
        self.log_dir: Optional[str] = None
        self._written_paths: set = set()
        self._checked: set = set()
        self._ended: set = set()  # ids of the callbacks that ended this record
        self._deferred = False  # an end was reported and the file not yet written
        self.finished = False

    def attach(self, trainer: Trainer, callback: PerfCallback, stage: str = "fit") -> None:
        """Called from ``setup`` on every rank: the only place ``trainer.log_dir`` (a broadcast under DDP) is read."""
        stage = str(getattr(stage, "value", stage))  # Lightning passes a str enum (TrainerFn)
        if self.finished or stage != self.stage:  # a new fit, or another stage: a new record and file
            self.__init__(stage)  # type: ignore[misc]
        if self.log_dir is None:
            self.log_dir = trainer.log_dir or trainer.default_root_dir
        if callback not in self.callbacks:
            self.callbacks.append(callback)
        if self.started_at is None:
            self.started_at = iso_now()
        if trainer.is_global_zero:
            for path, what in self.sources(trainer):
                if path not in self._checked:
                    check_writable(what, path)
                    self._checked.add(path)

    def sources(self, trainer: Trainer) -> List[tuple]:
        """(path, where it came from) of each file this record goes to."""
        explicit: Dict[str, str] = {}
        for cb in self.callbacks:
            if cb.summary_path:
                explicit.setdefault(str(cb.summary_path), f"{type(cb).__name__}(summary_path)")
        if explicit:
            found = list(explicit.items())
        elif os.environ.get(SUMMARY_PATH_ENV):
            found = [(os.environ[SUMMARY_PATH_ENV], f"${SUMMARY_PATH_ENV}")]
        else:
            found = [(os.path.join(self.log_dir or trainer.default_root_dir, SUMMARY_FILENAME),
                      "the summary file (in trainer.log_dir)")]
        return [(stage_path(p, self.stage), w) for p, w in found]

    def paths(self, trainer: Trainer) -> List[str]:
        """Explicit ``summary_path`` arguments, else $LIGHTNING_PERF_SUMMARY_PATH, else <log_dir>/perf_summary.json
        (with ``_<stage>`` before ``.json`` for a validate/test/predict run)."""
        return [p for p, _ in self.sources(trainer)]

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
            "logged": logged_scalars(trainer),
        }
        for field in ("name", "notes"):
            given = next((getattr(cb, f"run_{field}") for cb in self.callbacks if getattr(cb, f"run_{field}", None)),
                         None)
            data["run"][field] = given
        for cb in self.callbacks:
            data[cb.section_name] = cb.summary_section()
        return data

    def write(self, trainer: Trainer, exception: Optional[BaseException] = None,
              ended: Optional["PerfCallback"] = None) -> None:
        """Called by each callback at the end of its run (``ended``) or on an exception. At the end, the whole file
        is written once, when the last callback of the record has ended (so a fit's end is one write, whatever the
        number of callbacks; ``flush`` from teardown covers one whose end hook failed); on an exception at every
        call (rank 0). A call from another stage than this record's (a test raising after a completed fit) writes
        nothing here: the fit's file keeps its record."""
        if trainer_stage(trainer) != self.stage:
            return
        self.finished = True
        if exception is None and ended is not None:
            self._ended.add(id(ended))
            if any(id(cb) not in self._ended for cb in self.callbacks):
                self._deferred = True
                return
        self._deferred = False
        if not trainer.is_global_zero:
            return
        data = self.build(trainer, exception)
        data["stage"] = self.stage
        for path in self.paths(trainer):
            try:
                write_json_atomic(path, data)
            except OSError as err:  # the disk failed after the set-up check: keep the results in the log dir
                fallback = stage_path(os.path.join(self.log_dir or trainer.default_root_dir, SUMMARY_FILENAME),
                                      self.stage)
                if os.path.abspath(fallback) == os.path.abspath(path):
                    raise
                write_json_atomic(fallback, data)
                rank_zero_warn(f"lightning_perf: could not write {path} ({err}); the summary went to {fallback}")
                path = fallback
            if path not in self._written_paths:
                self._written_paths.add(path)
                rank_zero_info(f"lightning_perf: summary written to {path}")

    def flush(self, trainer: Trainer) -> None:
        """Writes a record whose end some callback never reported (called from every callback's teardown)."""
        if self._deferred and trainer_stage(trainer) == self.stage:
            self.write(trainer)


#: The attribute of a Trainer that holds its SummaryBook. Not a module-level WeakKeyDictionary: the book holds the
#: callbacks, and Lightning gives every callback ``log = lightning_module.log``, whose module holds the trainer; a
#: weak key reachable from its own value never dies, and each fit's trainer, model and data stayed alive for the
#: whole process (7.5 GB of CUDA tensors across the GPU checks). On the trainer, the book dies with it.
_BOOK_ATTRIBUTE = "_lightning_perf_summary_book"


def book_for(trainer: Trainer) -> SummaryBook:
    book = getattr(trainer, _BOOK_ATTRIBUTE, None)
    if book is None:
        book = SummaryBook()
        setattr(trainer, _BOOK_ATTRIBUTE, book)
    return book
