"""Reading and atomically writing summary files."""

from __future__ import annotations

import json
import math
import os
import tempfile
from typing import TYPE_CHECKING, Any, Dict

from lightning_perf.summary.schema import SummaryError, validate

if TYPE_CHECKING:
    from lightning_perf.summary.model import PerfSummary


def _json_safe(value: Any) -> Any:
    """NaN and infinities become null: JSON has no such numbers, and a reader must not choke on them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


_TMP_PREFIX = ".perf_summary."


def _remove_stale_temporaries(folder: str) -> None:
    """Temporary files of writers that were killed mid-write (SIGKILL): their process no longer exists."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if not (name.startswith(_TMP_PREFIX) and name.endswith(".tmp")):
            continue
        pid_text = name[len(_TMP_PREFIX):].split(".", 1)[0]
        if not pid_text.isdigit() or int(pid_text) == os.getpid():
            continue
        try:
            os.kill(int(pid_text), 0)
        except ProcessLookupError:
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass
        except OSError:
            pass  # alive, or not ours to signal: leave it


def probe_folder(path: str) -> None:
    """Creates the folder of ``path`` and writes and removes a probe file there; raises ``OSError`` when a file
    cannot be created in it. Output paths are checked with this before the work that fills them."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".lightning_perf_probe.", dir=folder)
    os.close(fd)
    os.unlink(probe)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json_atomic(path: str, data: Dict[str, Any]) -> None:
    """Writes ``data`` through a temporary file in the same folder and ``os.replace``: a reader never sees half.

    The file gets the permissions of any new file of the process (0666 less the umask, like the files Lightning
    writes beside it), and temporaries left by a writer that was killed mid-write are removed."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    _remove_stale_temporaries(folder)
    fd, tmp = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}{os.getpid()}.", suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(_json_safe(data), fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _decode(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise SummaryError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SummaryError(f"{path}: is a directory, expected a perf_summary.json file") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise SummaryError(f"{path!r}: cannot read: {err}" if "\0" in path else f"{path}: cannot read: {err}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise SummaryError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    except RecursionError:
        raise SummaryError(f"{path}: not a summary: JSON nested too deeply to read") from None
    except ValueError as err:  # an integer of more than 4300 digits
        raise SummaryError(f"{path}: not a summary: {str(err).split(';')[0]}") from None


def read_summary(path: str) -> "PerfSummary":
    """Reads one summary into its typed model; raises :class:`SummaryError` with a one-line reason naming the file,
    the field, the bad value and what is allowed (``runs/a/perf_summary.json: `iteration_timer.ms_per_iter.mean`
    must be a finite number >= 0, got NaN``)."""
    from lightning_perf.summary.model import parse

    return parse(_decode(path), source=path)


def load_summary(path: str) -> Dict[str, Any]:
    """Reads and validates one summary (as :func:`read_summary`) and returns it as decoded: a dict whose every field
    a reader uses has the type and range the model gives it."""
    data = _decode(path)
    return validate(data, source=path)
