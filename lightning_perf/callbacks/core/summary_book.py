"""The summary book: one per Trainer, so that callbacks which never import each other write one file together."""

from __future__ import annotations

import atexit
import hashlib
import json
import multiprocessing
import os
import signal
import tempfile
import threading
from typing import Any, Dict, List, Optional, Protocol

from lightning.pytorch import Trainer
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lightning_perf.callbacks.core.run_info import iso_now, logged_scalars, run_info
from lightning_perf.errors import PerfConfigError
from lightning_perf.measure.timing.tail_advice import explain_with_sections
from lightning_perf.summary.diagnosis import NOT_ENOUGH, diagnose, diagnosis_line
from lightning_perf.summary.energy import join_work
from lightning_perf.summary.evidence import link_traces
from lightning_perf.summary.io import probe_folder, special_kind, write_json_atomic
from lightning_perf.summary.schema import SCHEMA_VERSION, SUMMARY_FILENAME


class SummarySource(Protocol):
    """What the book reads of a callback it writes for (a ``core.base.PerfCallback``): its section's name, its own
    summary path (None: the default) and its section."""

    section_name: str

    @property
    def summary_path(self) -> Optional[str]: ...

    def summary_section(self) -> Dict[str, Any]: ...


#: Environment variable naming the summary file (used by `lightning-perf matrix` for each variant's process).
SUMMARY_PATH_ENV = "LIGHTNING_PERF_SUMMARY_PATH"


def trainer_stage(trainer: Trainer) -> str:
    """``fit``, ``validate``, ``test`` or ``predict``: what the Trainer is running now (``trainer.state.fn``)."""
    fn = getattr(getattr(trainer, "state", None), "fn", None)
    return str(getattr(fn, "value", fn or "fit"))


def check_writable(what: str, path: str) -> None:
    """Fails at set-up, naming the argument, when ``path`` cannot be written: a run must not train for hours and
    then lose its file. Tries the real path: refuses what is not a regular file (a named pipe, a device: the
    package never replaces one), creates the folder as the writer will, and creates and removes a probe file with
    the target's name (or its length)."""
    kind = special_kind(path)
    if path.endswith(tuple(sep for sep in (os.sep, os.altsep) if sep)):
        raise PerfConfigError(f"{what}={path!r} ends with a path separator: a folder, where a file path is expected,"
                              f" such as {os.path.join(path, SUMMARY_FILENAME)!r}.")
    if kind == "a directory":
        raise PerfConfigError(f"{what}={path!r} is a directory; expected a file path such as"
                              f" {os.path.join(path, SUMMARY_FILENAME)!r}.")
    if kind is not None:
        raise PerfConfigError(f"{what}={path!r} is {kind}, not a regular file; lightning_perf replaces only regular"
                              " files. Choose a file path.")
    try:
        probe_folder(path)
    except (OSError, ValueError) as err:
        raise PerfConfigError(f"{what}={path!r} cannot be written ({type(err).__name__}: {err}); choose a writable"
                              " path. Checked before training so that no run loses its results.") from None


def stage_path(path: str, stage: str) -> str:
    """The file of a validate/test/predict run beside the fit's: ``perf_summary.json`` -> ``perf_summary_test.json``."""
    if stage == "fit":
        return path
    root, ext = os.path.splitext(path)
    return f"{root}_{stage}{ext or '.json'}"


#: The longest error message kept; a longer one keeps its start and its end (a traceback's last line says most).
MESSAGE_LIMIT = 4000


def error_message(exception: BaseException) -> str:
    """The exception's message, at most ``MESSAGE_LIMIT`` characters. One whose ``__str__`` raises still gets a
    record: its ``repr`` when that works, else a note that it could not be read."""
    try:
        text = str(exception)
    except Exception as err:  # noqa: BLE001 - any user exception may break here
        try:
            text = f"<the message could not be read: {type(err).__name__} in __str__; repr: {exception!r}>"
        except Exception as err2:  # noqa: BLE001
            text = (f"<the message could not be read: {type(err).__name__} in __str__, {type(err2).__name__} in"
                    " __repr__>")
    if not isinstance(text, str):  # a __str__ that returns something else already raised TypeError above
        text = f"<the message could not be read: {type(text).__name__} from __str__>"
    if len(text) > MESSAGE_LIMIT:
        head = MESSAGE_LIMIT // 4
        text = f"{text[:head]} [...] {text[-(MESSAGE_LIMIT - head - 7):]}"
    return text


class WorkerExit(RuntimeError):
    """What a spawned worker's record says when its process exits before the end of the fit: Lightning runs a
    ``ddp_spawn`` fit in its workers without its exception handling, so no ``on_exception`` tells them why."""


def in_spawned_worker(trainer: Trainer) -> bool:
    """True in a process that a spawning launcher (``ddp_spawn``, ``ddp_fork``) started for this fit. There the
    callbacks are copies of the parent's, and a failure ends the process without ``on_exception``."""
    launcher = getattr(trainer.strategy, "launcher", None)
    return type(launcher).__name__ == "_MultiProcessingLauncher" and multiprocessing.parent_process() is not None


def handoff_path(parent_pid: int, trainer: Trainer) -> str:
    """Where rank 0's worker tells its parent which files hold its record: the parent learns nothing else from a
    worker that failed. Keyed by the parent process and the trainer's root folder, on this machine."""
    root = os.path.abspath(str(trainer.default_root_dir))
    key = hashlib.sha256(root.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"lightning_perf.handoff.{parent_pid}.{key}.json")


def _read_json(path: str) -> Optional[Dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _os_error_text(err: OSError) -> str:
    """``OSError: [Errno 27] File too large``: the type and the message, on one line."""
    return f"{type(err).__name__}: {' '.join(error_message(err).split())}"


def signalled_at_end(name: str) -> Dict[str, str]:
    """The ``error`` of a fit whose process got ``name`` while the suite wrote the summary of its completed training:
    the measurements are whole, the process was not (it ends as the signal asks once the file is written)."""
    return {"type": name, "signal": name,
            "message": (f"{name} arrived after the fit completed, while lightning_perf wrote its summary; the"
                        f" measurements cover the whole fit, and the process ended as {name} asks once this file was"
                        " written")}


class SummaryBook:
    """Collects the sections of every lightning_perf callback of one Trainer and writes them as one file.

    One record per run: a fit writes ``perf_summary.json``; a later ``validate``, ``test`` or ``predict`` on the same
    Trainer writes its own ``perf_summary_<stage>.json`` beside it and never touches the fit's file.
    """

    def __init__(self, stage: str = "fit") -> None:
        self.stage = stage
        self.callbacks: List[SummarySource] = []
        self.started_at: Optional[str] = None
        self.log_dir: Optional[str] = None
        self.cwd: Optional[str] = None  # relative paths are resolved against the folder of the set-up check
        self._written_paths: set = set()
        self._checked: set = set()
        self._ended: set = set()  # ids of the callbacks that ended this record
        self._deferred = False  # an end was reported and the file not yet written
        self.finished = False
        self._handoff: Optional[str] = None  # in rank 0's spawned worker: the file that names ours to the parent
        self._exit_hook: Any = None
        self._handed_paths: List[str] = []  # in the parent of spawned workers: the files rank 0's worker named
        self._diagnosis: Optional[Dict[str, Any]] = None  # the fit's, once printed: the file says what was printed
        self._warned: set = set()  # write failures already said for this record
        self._held: Any = None  # the SIGTERM handler put aside while the end of a fit is written (rank 0)
        self._signalled: Optional[str] = None  # the signal that came meanwhile
        #: Called before a held signal is raised again (``lightning-perf run`` says where the file went).
        self.before_raising: Optional[Any] = None

    def attach(self, trainer: Trainer, callback: SummarySource, stage: str = "fit") -> None:
        """Called from ``setup`` on every rank: the only place ``trainer.log_dir`` (a broadcast under DDP) is read."""
        stage = str(getattr(stage, "value", stage))  # Lightning passes a str enum (TrainerFn)
        if self.finished or stage != self.stage:  # a new fit, or another stage: a new record and file
            self._close_hand_off()
            self._release_sigterm()
            self.__init__(stage)  # type: ignore[misc]
        if self.log_dir is None:
            self.log_dir = os.path.abspath(trainer.log_dir or trainer.default_root_dir)
            self.cwd = os.getcwd()
        if callback not in self.callbacks:
            self.callbacks.append(callback)
        if self.started_at is None:
            self.started_at = iso_now()
        if trainer.is_global_zero:
            for path, what in self.sources(trainer):
                if path not in self._checked:
                    check_writable(what, path)
                    self._checked.add(path)
            if in_spawned_worker(trainer):
                self._hand_off(trainer)

    @property
    def written_paths(self) -> List[str]:
        """The files this record has been written to so far (rank 0), sorted."""
        return sorted(self._written_paths)

    # -- a spawned worker (ddp_spawn) --------------------------------------------------------------------------------
    def _hand_off(self, trainer: Trainer) -> None:
        """In rank 0's spawned worker: names this record's files to the parent, and writes the record when the
        process exits before the fit's end (a failure on any rank ends the workers without ``on_exception``; the
        parent then adds the error it alone receives)."""
        self._handoff = handoff_path(os.getppid(), trainer)
        try:
            write_json_atomic(self._handoff, {"paths": [os.path.abspath(p) for p in self.paths(trainer)],
                                              "pid": os.getpid()})
        except OSError as err:
            rank_zero_warn(f"lightning_perf: cannot tell the parent process where the summary goes ({err}); a"
                           " failure in a worker will leave a summary without measurements")
            self._handoff = None
        if self._exit_hook is None:
            self._exit_hook = lambda: self._write_at_exit(trainer)
            atexit.register(self._exit_hook)

    def _write_at_exit(self, trainer: Trainer) -> None:
        """The worker exits: a record that never ended is written with what was measured up to here."""
        if self.finished or not self.callbacks:
            return
        if threading.current_thread() is threading.main_thread():
            # the parent SIGTERMs the workers that are left, and Lightning's handler raises mid-write: we are ending
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for _ in range(2):
            try:
                self.write(trainer, WorkerExit("the worker process of rank 0 exited before the end of fit (a rank"
                                               " failed or the run was stopped); measurements up to then"))
                return
            except BaseException:  # noqa: BLE001 - a signal handler may have raised mid-write: try once more
                continue

    def _close_hand_off(self) -> None:
        if self._exit_hook is not None:
            atexit.unregister(self._exit_hook)
            self._exit_hook = None
        if self._handoff is not None:
            try:
                os.unlink(self._handoff)
            except OSError:
                pass
            self._handoff = None

    def _take_over(self, trainer: Trainer, data: Dict[str, Any]) -> Optional[List[str]]:
        """In the parent of spawned workers (it never ran ``setup``): the error it received goes into the record rank
        0's worker wrote, with the measurements up to the failure; None when no worker named its files."""
        handoff = _read_json(handoff_path(os.getpid(), trainer))
        if self._handoff is None and handoff is None:
            return None
        if handoff is not None:
            self._handoff = handoff_path(os.getpid(), trainer)
            self._handed_paths = [str(p) for p in handoff.get("paths") or [] if isinstance(p, str)]
        paths = self._handed_paths
        if not paths:
            return None
        for path in paths:
            written = _read_json(path)
            if written is not None and written.get("run") and written.get("stage", "fit") == self.stage:
                merged = dict(written)
                merged["status"], merged["error"] = data["status"], data["error"]
            else:  # the worker could not write (killed): what the parent knows, where the user looks for it
                merged = dict(data)
                if isinstance(merged.get("error"), dict):
                    merged["error"] = dict(merged["error"], message=(
                        f"{merged['error'].get('message', '')}\n[lightning_perf: no measurements: the worker"
                        " processes exited without writing them]"))
            write_json_atomic(path, merged)
            if path not in self._written_paths:
                self._written_paths.add(path)
                rank_zero_info(f"lightning_perf: summary written to {path}")
        return paths

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
        # a relative path means the folder it was checked in, also when the user's code changes folder later
        return [(stage_path(os.path.join(self.cwd or "", p), self.stage), w) for p, w in found]

    def paths(self, trainer: Trainer) -> List[str]:
        """Explicit ``summary_path`` arguments, else $LIGHTNING_PERF_SUMMARY_PATH, else <log_dir>/perf_summary.json
        (with ``_<stage>`` before ``.json`` for a validate/test/predict run)."""
        return [p for p, _ in self.sources(trainer)]

    def build(self, trainer: Trainer, exception: Optional[BaseException] = None) -> Dict[str, Any]:
        if exception is None:
            status, error = ("completed", None) if self._signalled is None else (
                "interrupted", signalled_at_end(self._signalled))
        else:
            # Ctrl-C, and SIGTERM (Lightning raises SIGTERMException, a SystemExit, when its handler sees one)
            interrupted = isinstance(exception, (KeyboardInterrupt, SystemExit))
            status = "interrupted" if interrupted else "failed"
            error = {"type": type(exception).__name__, "message": error_message(exception)}
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
        self._explain_tail(data)
        join_work(data)  # the training phase's joules over IterationTimer's iterations and samples
        try:  # StepTrace's traces, linked from the slow iterations they hold or follow
            link_traces(data)
        except Exception as err:  # noqa: BLE001 - a measurement never raises into training
            rank_zero_warn(f"lightning_perf: the traces could not be linked to the tail ({type(err).__name__}: {err})")
        if self.stage == "fit":  # a validate/test/predict record has no training to diagnose
            diagnosis = self._diagnosis if self._diagnosis is not None else self._diagnose(data)
            data = {"schema_version": data.pop("schema_version"), "status": data.pop("status"),
                    "error": data.pop("error"), "diagnosis": diagnosis, **data}
        return data

    @staticmethod
    def _explain_tail(data: Dict[str, Any]) -> None:
        """With both in the record, IterationTimer's slow iterations name the SectionProfiler section that exceeded
        its median in each; a failure leaves the tail as it was, with the reason."""
        timer, profiler = data.get("iteration_timer"), data.get("section_profiler")
        tail = timer.get("tail") if isinstance(timer, dict) else None
        if not isinstance(tail, dict) or not isinstance(profiler, dict) or not profiler.get("enabled"):
            return
        try:
            explain_with_sections(tail, profiler.get("slowest_iterations") or [])
        except Exception as err:  # noqa: BLE001 - a measurement never raises into training
            timer.setdefault("unavailable", {})["tail.section"] = (
                f"the slow iterations' sections could not be joined ({type(err).__name__}: {error_message(err)})")

    def _diagnose(self, data: Dict[str, Any]) -> Dict[str, Any]:
        """The run's primary diagnosis from its sections; a failure is a reason, never an error in training."""
        try:
            return diagnose(data)
        except Exception as err:  # noqa: BLE001 - a measurement never raises into training
            reason = f"the diagnosis failed ({type(err).__name__}: {error_message(err)})"
            rank_zero_warn(f"lightning_perf: {reason}; the summary is written without a verdict")
            return {"verdict": NOT_ENOUGH, "reason": reason}

    def _print_diagnosis(self, trainer: Trainer) -> None:
        """The first line of the end-of-fit output: each callback prints its own after it reports its end, and the
        first report comes here before any of them prints."""
        try:
            self._diagnosis = self.build(trainer)["diagnosis"]
            rank_zero_info(diagnosis_line(self._diagnosis))
        except Exception as err:  # noqa: BLE001 - the file is still written; the line is what is lost
            rank_zero_warn(f"lightning_perf: the diagnosis line could not be printed ({type(err).__name__}: {err})")

    def write(self, trainer: Trainer, exception: Optional[BaseException] = None,
              ended: Optional[SummarySource] = None) -> None:
        """Called by each callback at the end of its run (``ended``) or on an exception. At the end, the whole file
        is written once, when the last callback of the record has ended (so a fit's end is one write, whatever the
        number of callbacks; ``flush`` from teardown covers one whose end hook failed); on an exception at every
        call (rank 0). A call from another stage than this record's (a test raising after a completed fit) writes
        nothing here: the fit's file keeps its record."""
        if trainer_stage(trainer) != self.stage:
            return
        self.finished = True
        at_fit_end = exception is None and ended is not None and self.stage == "fit" and trainer.is_global_zero
        if at_fit_end:
            self._hold_sigterm()
        if at_fit_end and self._diagnosis is None:
            self._print_diagnosis(trainer)
        if exception is None and ended is not None:
            self._ended.add(id(ended))
            if any(id(cb) not in self._ended for cb in self.callbacks) and self._signalled is None:
                self._deferred = True
                return
        self._deferred = False  # the last end, or a SIGTERM came: the file now (the callbacks have all measured)
        if not trainer.is_global_zero:
            return
        try:
            for _ in range(2):  # a SIGTERM that came while the record was built or written: written again with it
                signalled = self._signalled
                if self._write_record(trainer, exception) or self._signalled == signalled:
                    break
        finally:
            self._release_sigterm()

    def _write_record(self, trainer: Trainer, exception: Optional[BaseException]) -> bool:
        """Builds the record and writes it to each of its files; True when the parent of spawned workers handed the
        error to the record a worker wrote (nothing more to write)."""
        data = self.build(trainer, exception)
        data["stage"] = self.stage
        if not self.callbacks and exception is not None and self._take_over(trainer, data) is not None:
            try:
                os.unlink(str(self._handoff))
            except OSError:
                pass
            return True
        for path in self.paths(trainer):
            path = self._write_or_fall_back(trainer, path, data)
            if path is None:
                continue
            if path not in self._written_paths:
                self._written_paths.add(path)
                rank_zero_info(f"lightning_perf: summary written to {path}")
        if exception is None:
            self._close_hand_off()  # the worker's record ended normally: nothing for the parent to take over
        return False

    # -- SIGTERM at the end of a fit ---------------------------------------------------------------------------------
    def _hold_sigterm(self) -> None:
        """From the first end report of a fit until its file is written (rank 0, main thread). Lightning gives SIGTERM
        its earlier action back before ``on_fit_end`` (by default: end the process at once), which would end it
        mid-write: no summary, a temporary file left. Held, a SIGTERM is noted; the file is written at once with it
        (``status`` ``interrupted``, see :func:`signalled_at_end`), then the signal is raised again."""
        if self._held is not None or threading.current_thread() is not threading.main_thread():
            return
        try:
            previous = signal.getsignal(signal.SIGTERM)
            if previous is None or previous == signal.SIG_IGN:  # set outside Python (cannot be put back), ignored
                return
            signal.signal(signal.SIGTERM, self._note_sigterm)
        except (AttributeError, ValueError, OSError):
            return
        self._held = previous

    def _note_sigterm(self, signum: int, frame: Any) -> None:
        self._signalled = "SIGTERM"

    def _release_sigterm(self) -> None:
        """Puts the SIGTERM handler back; a SIGTERM that came meanwhile is raised again, to its own action."""
        previous, self._held = self._held, None
        if previous is None:
            return
        try:
            signal.signal(signal.SIGTERM, previous)
        except (ValueError, OSError):
            return
        if self._signalled is not None:
            if self.before_raising is not None:
                try:
                    self.before_raising()
                except Exception:  # noqa: BLE001 - the signal's action comes first
                    pass
            signal.raise_signal(signal.SIGTERM)  # the default action ends the process here (exit status 143)

    def _write_or_fall_back(self, trainer: Trainer, path: str, data: Dict[str, Any]) -> Optional[str]:
        """Writes ``data`` to ``path``; where the disk fails after the set-up check, to ``<log_dir>/perf_summary.json``
        with a warning naming it; where that fails too, one warning that the summary was NOT written, naming the run
        and why. Returns the path written, or None. Never raises an ``OSError``: a lost file is the book's to say,
        not a failure of whichever callback happened to end last."""
        try:
            write_json_atomic(path, data)
            return path
        except OSError as err:
            reason = f"could not write {path} ({_os_error_text(err)})"
        fallback = stage_path(os.path.join(self.log_dir or trainer.default_root_dir, SUMMARY_FILENAME), self.stage)
        if os.path.abspath(fallback) != os.path.abspath(path):
            try:
                write_json_atomic(fallback, data)
            except OSError as err:
                reason += f", nor the fallback {fallback} ({_os_error_text(err)})"
            else:
                self._warn_once_per_record(f"fallback:{path}", f"lightning_perf: {reason}; the summary went to"
                                                               f" {fallback}")
                return fallback
        self._warn_once_per_record(f"lost:{path}", f"lightning_perf: summary NOT written for {self._run_label(data)}:"
                                                   f" {reason}")
        return None

    def _warn_once_per_record(self, key: str, message: str) -> None:
        """Each callback's end or exception calls ``write``: a failure is said once per record, not once per call."""
        if key not in self._warned:
            self._warned.add(key)
            rank_zero_warn(message)

    def _run_label(self, data: Dict[str, Any]) -> str:
        """The run as the user knows it: its ``run_name`` where given, its log dir, and the stage."""
        run = data.get("run") if isinstance(data.get("run"), dict) else {}
        name = run.get("name")
        where = f"logged in {self.log_dir}" if self.log_dir else "with no log dir"
        stage = "" if self.stage == "fit" else f", stage {self.stage}"
        return (f"the run {name!r} ({where}{stage})" if name else f"the run {where}{stage}")

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
