"""One run of a race or a matrix in a session (process group) of its own, so that its end ends every process the
command started: a ``bash -c '...'`` wrapper's training, the workers a training forgot, not the first process alone.

A timeout kills the whole group. A Ctrl-C (or SIGTERM, SIGHUP: :func:`stops_as_interrupts`) reaches the group once,
passed on by the parent (a terminal's Ctrl-C does not reach another session): the training writes its summary as
interrupted, and what is still running after :data:`GRACE_S` is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from typing import Any, Dict, Iterator, List, Mapping, Optional

__all__ = ["GRACE_S", "Stopped", "run_in_group", "signal_group", "signal_name", "stops_as_interrupts"]

#: Seconds an interrupted run has to write its summary and end before its group is killed.
GRACE_S = 30.0

#: The signals that stop the rounds as a Ctrl-C does (the terminal closed, a job scheduler's stop).
STOPS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP during the rounds, taken as a Ctrl-C: the run in flight ends, the finished rounds are
    reported. ``signum`` is the signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_name(stop: BaseException) -> str:
    """``SIGINT`` for a Ctrl-C, else the signal of a :class:`Stopped`."""
    return signal.Signals(getattr(stop, "signum", signal.SIGINT)).name


@contextlib.contextmanager
def stops_as_interrupts() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise :class:`Stopped` (in the main thread; elsewhere they keep their
    handlers), so they end the rounds as a Ctrl-C does rather than leave the run in flight behind. A signal that is
    ignored (SIGHUP under ``nohup``) stays ignored."""
    def stop(signum: int, frame: Any) -> None:
        raise Stopped(signum)

    previous: Dict[int, Any] = {}
    for signum in STOPS:
        try:
            if signal.getsignal(signum) in (signal.SIG_IGN, None):  # `nohup`'s SIGHUP stays ignored; one set in C
                continue  # (None) cannot be put back
            previous[signum] = signal.signal(signum, stop)
        except (ValueError, OSError):  # not the main thread
            pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def signal_group(proc: subprocess.Popen, signum: int) -> None:
    """Sends ``signum`` to the session of ``proc`` (started with ``start_new_session``); nothing where it has ended."""
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):  # the group has ended
        pass


def run_in_group(argv: List[str], stdout: Any, env: Mapping[str, str], timeout_s: Optional[float]) -> Optional[int]:
    """Runs ``argv`` in a new session, its stdout and stderr to ``stdout``; its exit code, None when it ran past
    ``timeout_s`` (its group killed). When it ends, whatever it left running in its group is killed. A Ctrl-C
    (KeyboardInterrupt, :class:`Stopped`) is passed on to the group, which has :data:`GRACE_S` to end (a second
    Ctrl-C cuts that short) before it is killed; then the interrupt is raised again. OSError where it cannot start."""
    proc = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True)
    try:
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            signal_group(proc, signal.SIGKILL)
            proc.wait()
            return None
    except KeyboardInterrupt as stop:
        signal_group(proc, getattr(stop, "signum", signal.SIGINT))
        with contextlib.suppress(subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.wait(timeout=GRACE_S)
        raise
    finally:
        signal_group(proc, signal.SIGKILL)  # what the command left behind ends with its run
        proc.wait()
