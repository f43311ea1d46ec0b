"""Reading and atomically writing summary files."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import secrets
import socket
import stat
import tempfile
from typing import TYPE_CHECKING, Any, Dict, Optional

from lightning_perf.summary.schema import SummaryError

if TYPE_CHECKING:
    from lightning_perf.summary.model import PerfSummary


def _text_of(value: Any) -> str:
    """``str(value)``, else ``repr``, else a placeholder: an object whose ``__str__`` raises must not cost the file."""
    for render in (str, repr):
        try:
            return render(value)
        except Exception:  # noqa: BLE001 - any user object may break here
            continue
    return f"<unreadable {type(value).__name__}>"


def _json_safe(value: Any) -> Any:
    """NaN and infinities become null: JSON has no such numbers, and a reader must not choke on them. Objects JSON
    has no type for become their text (``str``, else ``repr``, else a placeholder)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {_text_of(k) if not isinstance(k, str) else k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return _text_of(value)


#: What stands at a path instead of a regular file, by ``stat`` type: the package replaces only regular files.
_SPECIAL_KINDS = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                  (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class NotARegularFileError(OSError):
    """Something other than a regular file (a named pipe, a device, a socket, a folder) stands at an output path."""


def special_kind(path: str) -> Optional[str]:
    """What stands at ``path`` when it is not a regular file ("a named pipe", "a character device", ...), else None
    (a regular file, nothing, or a dangling symlink). A symlink is judged by its target. Never opens the path: opening
    a named pipe for writing blocks until a reader comes."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _SPECIAL_KINDS if test(mode)), "not a regular file")


def check_regular(path: str) -> None:
    """Raises :class:`NotARegularFileError` when something other than a regular file stands at ``path``."""
    kind = special_kind(path)
    if kind is not None:
        raise NotARegularFileError(errno.EEXIST, f"{kind}, not a regular file", path)


_TMP_PREFIX = ".perf_summary."


def _writer_id() -> str:
    """Who may judge whether a writer is alive: a pid means something only on one host and in one pid namespace (a
    container), so a temporary file's name carries both."""
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname() or "host")[:64] or "host"
    try:
        namespace = re.sub(r"\D", "", os.readlink("/proc/self/ns/pid"))
    except OSError:
        namespace = ""
    return f"{host}-{namespace}" if namespace else host


def _temporary_prefix(pid: int) -> str:
    """``.perf_summary.<host>[-<pid namespace>].<pid>.``: the start of a temporary file's name of writer ``pid``."""
    return f"{_TMP_PREFIX}{_writer_id()}.{pid}."


def _remove_stale_temporaries(folder: str) -> None:
    """Temporary files of writers on this host (and pid namespace) that were killed mid-write (SIGKILL): their
    process no longer exists. Files of other hosts or containers sharing the folder are left alone: their pids
    mean nothing here."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    ours = f"{_TMP_PREFIX}{_writer_id()}."
    for name in names:
        if not (name.startswith(ours) and name.endswith(".tmp")):
            continue
        pid_text = name[len(ours):].split(".", 1)[0]
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


def _folder_of(path: str) -> str:
    """The folder as the operating system will resolve it: not normalized, so ``missing/../x.json`` stays what it
    is (a path through a folder that does not exist) instead of becoming ``x.json``."""
    return os.path.dirname(os.fspath(path)) or os.curdir


def _make_folder(folder: str) -> None:
    """Creates ``folder`` like the writer does. A ``..`` after a folder that does not exist is refused rather than
    that folder created: such a path is a typo more often than a wish."""
    parts = folder.split(os.sep)
    if os.pardir in parts:
        last = len(parts) - 1 - parts[::-1].index(os.pardir)
        head = os.sep.join(parts[:last + 1]) or os.sep
        if not os.path.isdir(head):
            raise FileNotFoundError(errno.ENOENT, "a folder before '..' does not exist", head)
    os.makedirs(folder, exist_ok=True)


_PROBE_PREFIX = ".lightning_perf_probe."


def probe_folder(path: str) -> None:
    """Tries the real path before the work that fills it; raises ``OSError`` when it could not be written there.

    Refuses what is not a regular file (:class:`NotARegularFileError`), creates the folder as the writer will, and
    creates and removes a file with the target's own name when nothing is there yet (else one of the name's
    length, at least): a name too long for the file system, or one it cannot hold, fails here and not after the
    run. Never opens the path itself when something stands there."""
    path = os.fspath(path)
    if "\0" in path:
        raise ValueError("a file path with a NUL byte")
    check_regular(path)
    folder = _folder_of(path)
    _make_folder(folder)
    name = os.path.basename(path)
    if name and not os.path.lexists(path):
        candidates = [path]
    else:
        candidates = []
    for _ in range(8):
        stem = _PROBE_PREFIX + secrets.token_hex(8)
        candidates.append(os.path.join(folder, stem.ljust(len(name), "x")))
    for candidate in candidates:
        try:
            fd = os.open(candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue  # raced by another writer, or an unlucky name: try the next
        os.close(fd)
        os.unlink(candidate)
        return
    raise FileExistsError(errno.EEXIST, "no probe file could be created", folder)


def _read_umask() -> Optional[int]:
    """The process umask without changing it (``Umask:`` of /proc/self/status, Linux 4.7+), else None."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _umask_at_import() -> int:
    """Read once, where the kernel cannot tell it without setting it: the brief flip happens at import, not during
    every write while other threads create files."""
    found = _read_umask()
    if found is not None:
        return found
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK_AT_IMPORT = _umask_at_import()


def _umask() -> int:
    """The umask new files get now, read without setting it; the value at import where it cannot be read so."""
    found = _read_umask()
    return _UMASK_AT_IMPORT if found is None else found


def write_json_atomic(path: str, data: Dict[str, Any]) -> None:
    """Writes ``data`` through a temporary file in the same folder and ``os.replace``: a reader never sees half.

    The file gets the permissions of any new file of the process (0666 less the umask, like the files Lightning
    writes beside it), and temporaries left by a writer of this host that was killed mid-write are removed. Only a
    regular file (or nothing) at ``path`` is replaced: a named pipe, a device or a socket there raises
    :class:`NotARegularFileError` and is left as it is."""
    path = os.fspath(path)
    check_regular(path)
    folder = _folder_of(path)
    _make_folder(folder)
    _remove_stale_temporaries(folder)
    fd, tmp = tempfile.mkstemp(prefix=_temporary_prefix(os.getpid()), suffix=".tmp", dir=folder)
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(_json_safe(data), fh, indent=2, sort_keys=False, default=_text_of)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        check_regular(path)  # again just before: something may have been put there while the file was written
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


#: The largest input file a reader opens: a summary is tens of kB (a fit with every section and 64 ranks is under
#: 2 MB), so 64 MB is a wrong file, not a summary; read whole, it would cost gigabytes of memory as Python objects.
MAX_INPUT_BYTES = 64 * 1024 * 1024


def _checked_input(path: str) -> None:
    """Refuses an input that is not a regular file (``/dev/zero`` reads forever, a named pipe blocks until a writer
    comes) or that is larger than :data:`MAX_INPUT_BYTES`, before it is opened."""
    kind = special_kind(path)
    if kind == "a directory":
        raise SummaryError(f"{path}: is a directory, expected a perf_summary.json file")
    if kind is not None:
        raise SummaryError(f"{path}: is {kind}, not a regular file; expected a perf_summary.json file")
    try:
        size = os.stat(path).st_size
    except (OSError, ValueError):
        return  # said by the open below, as it always was
    if size > MAX_INPUT_BYTES:
        raise SummaryError(f"{path}: {size / 2**20:.0f} MiB, over the readers' limit of"
                           f" {MAX_INPUT_BYTES // 2**20} MiB; expected a perf_summary.json (tens of kB)")


def _decode(path: str) -> Any:
    _checked_input(path)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(MAX_INPUT_BYTES + 1)  # a file that grew since its size was read stops here too
        if len(text) > MAX_INPUT_BYTES:
            raise SummaryError(f"{path}: over the readers' limit of {MAX_INPUT_BYTES // 2**20} MiB; expected a"
                               " perf_summary.json (tens of kB)")
    except FileNotFoundError:
        raise SummaryError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SummaryError(f"{path}: is a directory, expected a perf_summary.json file") from None
    except (OSError, UnicodeDecodeError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise SummaryError(f"{path!r}: cannot read: {err}" if "\0" in path else f"{path}: cannot read: {err}") from None
    if not text.strip():  # said as such, not as JSON that expected a value at line 1
        raise SummaryError(f"{path}: the file is empty; expected a perf_summary.json")
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
    from lightning_perf.summary.model import validate

    data = _decode(path)
    return validate(data, source=path)


def read_json(path: str) -> Any:
    """One JSON file as decoded, read as the CLI's readers read a summary: any problem (missing, not a regular file,
    empty, not JSON, nested too deeply) is a :class:`SummaryError` with one line naming the file."""
    return _decode(path)
