"""The parent side of ``lightning-perf run``: runs the command with the start-up folder first on its PYTHONPATH and
the options in its environment, passes signals on, and says where the summaries went. Needs neither torch nor
Lightning; changes nothing outside the command's own environment, and removes its manifest at the end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from typing import Callable, Dict, List, Mapping, Optional

from lightning_perf._attach import (
    BASELINE_ENV,
    CALLBACKS_ENV,
    DEFAULT_CALLBACKS,
    FILL_ENV,
    MANIFEST_ENV,
    NAME_ENV,
    OUT_ENV,
    TRIAL_ENV,
    read_manifest,
)

#: The folder whose sitecustomize attaches the suite.
STARTUP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")

#: Exit codes of a command that could not be started, as shells give them.
EXIT_NOT_FOUND, EXIT_NOT_EXECUTABLE = 127, 126

FORWARDED = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


def command_env(environ: Mapping[str, str], callbacks: List[str], out: Optional[str], name: Optional[str],
                baseline: Optional[str], manifest: Optional[str], fill: bool = False,
                trial: Optional[str] = None) -> Dict[str, str]:
    """The command's environment: ``environ`` with the start-up folder first on PYTHONPATH (the user's entries after
    it, in their order) and the run's options; options not given are removed, not inherited from an outer run.
    ``fill`` (``lightning-perf matrix``): a Trainer with some of the suite's callbacks gets the others only.
    ``trial``: a change each Trainer tries in an ``ABTrial`` (``run --trial``, ``matrix --trial``): a built-in name
    or the user's switches by import path."""
    env = dict(environ)
    given = env.get("PYTHONPATH", "")
    # the user's entries verbatim (an empty one means the working folder); ours once, also under a nested run
    entries = [e for e in given.split(os.pathsep) if not (e and os.path.abspath(e) == STARTUP_DIR)] if given else []
    env["PYTHONPATH"] = os.pathsep.join([STARTUP_DIR] + entries)
    for key, value in ((CALLBACKS_ENV, ",".join(callbacks)), (OUT_ENV, out), (NAME_ENV, name),
                       (BASELINE_ENV, baseline), (MANIFEST_ENV, manifest), (FILL_ENV, "1" if fill else None),
                       (TRIAL_ENV, trial)):
        if value:
            env[key] = value
        else:
            env.pop(key, None)
    return env


def exit_code(returncode: int) -> int:
    """The command's exit code; killed by signal N (a negative return code): 128 + N, as shells report it."""
    return 128 - returncode if returncode < 0 else returncode


def _terminal_sent_it() -> bool:
    """A Ctrl-C at the terminal reaches the whole foreground process group, the command included: passing it on
    would give the command a second one, which cuts its clean shutdown short."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def run_command(command: List[str], callbacks: Optional[List[str]] = None, out: Optional[str] = None,
                name: Optional[str] = None, baseline: Optional[str] = None,
                say: Callable[[str], None] = lambda text: print(text, file=sys.stderr),
                trial: Optional[str] = None) -> int:
    """Runs ``command`` with the suite attached, inheriting stdin, stdout and stderr; returns its exit code."""
    fd, manifest = tempfile.mkstemp(prefix="lightning_perf_run.", suffix=".jsonl")
    os.close(fd)
    try:
        env = command_env(os.environ, list(callbacks or DEFAULT_CALLBACKS), out, name, baseline, manifest,
                          trial=trial)
        started: List[subprocess.Popen] = []
        pending: List[int] = []  # signals that came before the command started: sent to it once it has

        def forward(signum: int, frame: object) -> None:
            if signum == signal.SIGINT and _terminal_sent_it():
                return
            if not started:
                pending.append(signum)
                return
            try:
                started[0].send_signal(signum)
            except OSError:
                pass

        previous = {}
        for signum in FORWARDED:
            try:
                previous[signum] = signal.signal(signum, forward)
            except (ValueError, OSError):  # not the main thread: the command gets signals of its own only
                pass
        try:
            try:
                proc = subprocess.Popen(command, env=env)
            except FileNotFoundError:
                say(f"lightning-perf run: error: command not found: {command[0]!r}")
                return EXIT_NOT_FOUND
            except (PermissionError, OSError) as err:
                say(f"lightning-perf run: error: cannot run {command[0]!r}: {err.strerror or err}")
                return EXIT_NOT_EXECUTABLE
            started.append(proc)
            for signum in pending:
                forward(signum, None)
            returncode = proc.wait()
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        for line in closing_lines(read_manifest(manifest)):
            say(f"lightning-perf run: {line}")
        return exit_code(returncode)
    finally:
        try:
            os.unlink(manifest)
        except OSError:
            pass


def closing_lines(events: List[Dict[str, object]]) -> List[str]:
    """What the command's Trainers did with the suite: where each summary went, which Trainers were left alone, why
    one ran unmeasured, or that no Trainer was built."""
    lines: List[str] = []
    written: List[str] = []
    for event in events:
        if event.get("event") == "written":
            for path in event.get("paths") or []:
                if isinstance(path, str) and path not in written:
                    written.append(path)
    lines += [f"summary written to {path}" for path in written]
    attached = sum(1 for e in events if e.get("event") == "attached")
    alone = sum(1 for e in events if e.get("event") == "left_alone")
    reasons = []
    for event in events:
        reason = event.get("reason")
        if event.get("event") == "failed" and isinstance(reason, str) and reason not in reasons:
            reasons.append(reason)
    if alone:
        lines.append(f"{alone} Trainer(s) had lightning_perf callbacks of their own and were left alone (their"
                     " summaries go where those callbacks say)")
    lines += [f"a Trainer ran unmeasured: {reason}" for reason in reasons]
    if not written:
        if attached:
            lines.append(f"{attached} Trainer(s) built with the suite, no summary written (none ran fit, validate,"
                         " test or predict to its end or to an error)")
        elif not alone and not reasons:
            patched = any(e.get("event") == "patched" for e in events)
            lines.append("no Trainer was built; nothing was measured" + (
                "" if patched else " (the command's Python never imported lightning.pytorch or pytorch_lightning"
                " with PYTHONPATH read)"))
    return lines
