"""``lightning-perf run``: the suite attached to every Trainer a command builds, with no change to its code.

The parent (:mod:`.launch`) runs the command with :mod:`.startup` first on ``PYTHONPATH``; the ``sitecustomize`` there
installs :mod:`.hook` in the command's Python, which patches ``Trainer.__init__`` of ``lightning.pytorch`` and
``pytorch_lightning`` when the command imports them, and appends a :class:`.suite.AttachedSuite` to each Trainer's
callbacks. The options travel in the environment variables below; this module holds what both sides use (the
settings, the manifest, the one-line warnings, the Trainers' numbering), and needs neither torch nor Lightning.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, List, Optional

#: The comma-separated callbacks of the suite; its presence is what makes the command's Python attach anything.
CALLBACKS_ENV = "LIGHTNING_PERF_RUN_CALLBACKS"
#: The absolute folder the summaries go to (``--out``, with ``--name`` as a subfolder); absent: each Trainer's log_dir.
OUT_ENV = "LIGHTNING_PERF_RUN_OUT"
#: ``run.name`` of the summaries (``--name``).
NAME_ENV = "LIGHTNING_PERF_RUN_NAME"
#: A quality baseline to gate against (``--baseline``): adds a QualityGate.
BASELINE_ENV = "LIGHTNING_PERF_RUN_BASELINE"
#: A change to try in an A/B trial inside each fit (``--trial``: a built-in name, or ``MODULE:ON,OFF`` /
#: ``MODULE:OBJECT`` imported in the command's Python): adds an ABTrial.
TRIAL_ENV = "LIGHTNING_PERF_RUN_TRIAL"
#: A file the command's processes append one JSON line per event to, for the parent's closing lines.
MANIFEST_ENV = "LIGHTNING_PERF_RUN_MANIFEST"
#: Set by ``lightning-perf matrix``: a Trainer that already has some of the suite's callbacks (given to it, or in a
#: PerfSuite) keeps them and gets only the others, none when it has them all, instead of being left alone; the
#: attached suite then also says where the Trainer's summary went, also when only the Trainer's own callbacks wrote it.
FILL_ENV = "LIGHTNING_PERF_RUN_FILL"

#: The callbacks ``--callbacks`` may name, in summary order; the default is PerfSuite's.
CALLBACK_NAMES = ("IterationTimer", "SectionProfiler", "VRAMMonitor", "EvalNoGradGuard", "QualityGate")
DEFAULT_CALLBACKS = ("IterationTimer", "SectionProfiler", "VRAMMonitor", "EvalNoGradGuard")

SUMMARY_NAME = "perf_summary.json"


def parse_callbacks(text: str) -> List[str]:
    """``IterationTimer,VRAMMonitor`` -> the names, in the order given; ValueError naming the value and the allowed
    names for an unknown, repeated or empty entry."""
    allowed = f"allowed: {', '.join(CALLBACK_NAMES)} (comma-separated)"
    names = [part.strip() for part in str(text).split(",")]
    if not any(names):
        raise ValueError(f"expected at least one callback name, got {text!r}; {allowed}")
    by_lower = {name.lower(): name for name in CALLBACK_NAMES}
    chosen: List[str] = []
    for part in names:
        name = by_lower.get(part.lower())
        if name is None:
            raise ValueError(f"{part!r} in {text!r} is not a lightning_perf callback; {allowed}")
        if name in chosen:
            raise ValueError(f"{name} is named twice in {text!r}; name each callback once")
        chosen.append(name)
    return chosen


def summary_file(number: int) -> str:
    """The file of the ``number``-th Trainer of the command that ran with the suite attached: the first writes
    ``perf_summary.json``, later ones ``perf_summary_trainer<N>.json`` beside it, so none overwrites another."""
    return SUMMARY_NAME if number == 1 else f"perf_summary_trainer{number}.json"


def gate_arguments(path: str) -> Dict[str, Any]:
    """``QualityGate`` arguments that gate every metric of the baseline at ``path`` (a perf_summary.json with a
    quality_gate section, or a file of ``record_baseline``): its image metrics as ``metrics``, its other metrics as
    ``monitor`` with the direction the baseline recorded. ValueError with the reason when there is nothing to gate."""
    from lightning_perf.measure.quality.image_quality import IMAGE_METRICS
    from lightning_perf.summary.baseline import BASELINE_KIND, read_baseline_with_gaps
    from lightning_perf.summary.io import read_json

    values, gaps = read_baseline_with_gaps(path)
    data = read_json(path)  # checked as the first read was: a file swapped for a named pipe since is refused too
    entries = data.get("metrics") if data.get("kind") == BASELINE_KIND else (data.get("quality_gate") or {}).get(
        "metrics")
    entries = entries if isinstance(entries, dict) else {}
    names = list(values) + [name for name in gaps if name not in values]
    metrics = [name for name in IMAGE_METRICS if name in names]
    monitor: Dict[str, str] = {}
    for name in names:
        if name in IMAGE_METRICS:
            continue
        mode = entries.get(name, {}).get("mode") if isinstance(entries.get(name), dict) else None
        if mode not in ("max", "min"):
            raise ValueError(f"{path!r}: metric {name!r} has no direction (mode 'max' or 'min'); it cannot be gated")
        monitor[name] = mode
    if not metrics and not monitor:
        raise ValueError(f"{path!r} holds no quality metric to gate against")
    return {"metrics": metrics, "monitor": monitor or None}


def record(event: str, **fields: Any) -> None:
    """Appends one event of the command's processes to the parent's manifest (one short line, O_APPEND: lines of
    several processes do not interleave). Never raises: the parent's closing lines are not worth a failure."""
    path = os.environ.get(MANIFEST_ENV)
    if not path:
        return
    try:
        line = json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line.encode("utf-8", "surrogatepass"))
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001
        pass


def claim_number() -> Optional[int]:
    """The next number of the command's Trainers over all its processes (pool workers, forks, spawned children):
    under an exclusive lock of the manifest, one more than the ``numbered`` events in it, recorded as one more. None
    where there is no manifest or it cannot be locked (no ``fcntl``): the caller counts in its own process."""
    path = os.environ.get(MANIFEST_ENV)
    if not path:
        return None
    try:
        import fcntl

        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held by this open file alone: another process's open waits here
        number = 1 + sum(1 for event in read_manifest(path) if event.get("event") == "numbered")
        os.write(fd, (json.dumps({"event": "numbered", "pid": os.getpid(), "trainer": number}) + "\n").encode())
        return number
    except Exception:  # noqa: BLE001 - the numbering of this process alone is the fallback, not a failure
        return None
    finally:
        os.close(fd)  # and the lock with it


def read_manifest(path: str) -> List[Dict[str, Any]]:
    """The events the command's processes recorded, in order; unreadable lines are skipped."""
    events: List[Dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            for line in fh:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    events.append(event)
    except OSError:
        pass
    return events


def env_text(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else None


_warned: set = set()
_count = {"trainers": 0}


def warn_once(key: str, message: str) -> None:
    """One line on stderr, once per key; not ``warnings.warn``, which ``-W error`` would turn into an exception."""
    if key in _warned:
        return
    _warned.add(key)
    try:
        sys.stderr.write(f"lightning-perf run: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - a closed stderr is no reason to fail the command
        pass


def next_trainer_number() -> int:
    """1 for the first Trainer of the command to run with the suite, 2 for the next, ...: counted over all the
    command's processes (a pool's workers, a fork: each would otherwise write the first's file), in this process
    alone where the run's manifest cannot count them."""
    _count["trainers"] += 1
    claimed = claim_number()
    return _count["trainers"] if claimed is None else claimed


def is_lightning_perf_callback(callback: Any) -> bool:
    """Whether a class of ``callback`` comes from lightning_perf (also a user's subclass of one): by module name, so
    that it needs no import and recognises every copy of the package."""
    return any(str(getattr(cls, "__module__", "")).startswith("lightning_perf.") for cls in type(callback).__mro__)
