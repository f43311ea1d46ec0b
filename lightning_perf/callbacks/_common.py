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

from lightning_perf.summary.io import probe_folder, write_json_atomic
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

    wrapper.__guarded__ = hook  # type: ignore[attr-defined] - PerfSuite calls it with one guard of its own
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


def check_bool(owner: str, name: str, value: Any) -> bool:
    """A real bool: ``enabled="false"`` is truthy and would silently do the opposite of what was meant."""
    if not isinstance(value, bool):
        raise bad_argument(owner, name, value, "Expected True or False.")
    return value


def check_number(owner: str, name: str, value: Any, minimum: Optional[float] = None, allow_none: bool = False,
                 what: str = "a number") -> Optional[float]:
    """A finite int or float (not a bool, not NaN), at least ``minimum`` when given."""
    if value is None and allow_none:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or (minimum is not None and value < minimum)):
        bound = f" >= {minimum:g}" if minimum is not None else ""
        raise bad_argument(owner, name, value, f"Expected {what}{bound} (finite){' or None' if allow_none else ''}.")
    return float(value)


def check_text(owner: str, name: str, value: Any) -> Optional[str]:
    """None or a string (a run's name or notes for `report`)."""
    if value is not None and not isinstance(value, str):
        raise bad_argument(owner, name, value, "Expected a string or None.")
    return value


def check_path(owner: str, name: str, value: Any) -> Optional[str]:
    """None, a string or an ``os.PathLike``: ``summary_path=123`` would write a file named 123."""
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise bad_argument(owner, name, value, "Expected a file path (a non-empty string or os.PathLike) or None.")
    return value


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
    batch = getattr(trainer, _LOG_BATCH_ATTRIBUTE, None)
    if batch is not None:  # inside a PerfSuite hook: one logger call for all its callbacks, at the hook's end
        batch.setdefault(step, {}).update(clean)
        return
    for logger in trainer.loggers:
        logger.log_metrics(clean, step=step)


#: The attribute of a Trainer that collects what the callbacks of a PerfSuite log within one hook.
_LOG_BATCH_ATTRIBUTE = "_lightning_perf_log_batch"


def open_log_batch(trainer: Any) -> None:
    """From here to ``close_log_batch``, ``log_scalars`` collects instead of calling the loggers."""
    setattr(trainer, _LOG_BATCH_ATTRIBUTE, {})


def close_log_batch(trainer: Any) -> None:
    """Sends what was collected since ``open_log_batch``: one ``log_metrics`` call per logger and step."""
    batch = getattr(trainer, _LOG_BATCH_ATTRIBUTE, None)
    setattr(trainer, _LOG_BATCH_ATTRIBUTE, None)
    for step, metrics in (batch or {}).items():
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)


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


Rows = List[List[Optional[float]]]


def gather_floats_then(trainer: Trainer, values: Sequence[Optional[float]], then: Callable[[Rows], Any],
                       owner: Optional["PerfCallback"] = None) -> None:
    """With several ranks, ``then(gather_floats(trainer, values))`` (one row per rank); with one, nothing: there is no
    spread across ranks to report. Inside a PerfSuite's ``on_train_end`` the values of all its callbacks go in one
    ``all_gather`` at the hook's end (``close_gather_batch``), and each ``then`` gets its rows."""
    if trainer.world_size <= 1:
        return
    batch = getattr(trainer, _GATHER_BATCH_ATTRIBUTE, None)
    if batch is None:
        then(gather_floats(trainer, values))
    else:
        batch.append((list(values), then, owner))


#: The attribute of a Trainer that collects what the callbacks of a PerfSuite gather across ranks within one hook.
_GATHER_BATCH_ATTRIBUTE = "_lightning_perf_gather_batch"


def open_gather_batch(trainer: Any) -> None:
    """From here to ``close_gather_batch``, ``gather_floats_then`` collects instead of gathering."""
    setattr(trainer, _GATHER_BATCH_ATTRIBUTE, [])


def close_gather_batch(trainer: Any) -> List[tuple]:
    """One ``all_gather`` of everything collected since ``open_gather_batch`` (every rank collects the same values
    in the same order, so every rank reaches it with the same shape); each ``then`` gets its own columns. Returns
    (owner, exception) for each ``then`` that failed."""
    batch = getattr(trainer, _GATHER_BATCH_ATTRIBUTE, None)
    setattr(trainer, _GATHER_BATCH_ATTRIBUTE, None)
    if not batch:
        return []
    rows = gather_floats(trainer, [v for values, _, _ in batch for v in values])
    failures, start = [], 0
    for values, then, owner in batch:
        end = start + len(values)
        try:
            then([row[start:end] for row in rows])
        except Exception as err:  # noqa: BLE001 - one callback's figure must not cost the others theirs
            failures.append((owner, err))
        start = end
    return failures


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


# ---------------------------------------------------------------------------------------------------------------
# The summary book: one per Trainer, so that callbacks which never import each other write one file together.
# ---------------------------------------------------------------------------------------------------------------


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


def _device_name(trainer: Trainer) -> str:
    import torch

    device = trainer.strategy.root_device
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    return f"{device.type}: {platform.processor() or platform.machine()}"


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
