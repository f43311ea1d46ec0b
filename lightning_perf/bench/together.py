"""``race --together``: the commands of a round run at the same time, pinned to the same cores, so that every one of
them meets the machine's changes alike.

On a shared machine the speed of one process can move by 40% from second to second (docs/bench.md, "Together
rounds": with one core busy, runs of one command here fell in a fast and a slow mode lasting seconds). Rounds one
command after the other pair the commands only to the round, a few seconds apart, and rounds of the same command
spread by 20% or more; started together on the same cores, the commands share each core in the scheduler's slices of
a few milliseconds, and the ratio of their rates moved by about 1% from round to round. A command that ends first
leaves its place to a spin loop until the round's last run ends, so that the ones still running keep their share of
the cores to the end (alone, the last would speed up for its last steps and read faster than it is).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from lightning_perf.bench.process_group import GRACE_S, signal_group

__all__ = ["FILLER", "can_pin", "pick_cores", "run_together"]

#: What keeps a finished command's place on the cores until the round ends.
FILLER = (sys.executable, "-c", "while True: pass")

#: Seconds between two looks at the runs of a round.
POLL_S = 0.05


def can_pin() -> bool:
    """Whether this platform can pin a process to cores (``os.sched_setaffinity``: Linux)."""
    return hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")


def pick_cores(count: Optional[int], span_s: float = 1.0, psutil_module: Any = None,
               sleep: Callable[[float], None] = time.sleep) -> List[int]:
    """The ``count`` usable cores the machine kept least busy over ``span_s`` seconds (all usable cores where
    ``count`` is None or not below them; the lowest-numbered where the counters cannot be read)."""
    usable = sorted(os.sched_getaffinity(0))
    if count is None or count >= len(usable):
        return usable
    count = max(1, count)
    try:
        from lightning_perf.measure.device.activity import _machine_times

        if psutil_module is None:
            import psutil as psutil_module
        before = psutil_module.cpu_times(percpu=True)
        sleep(span_s)
        after = psutil_module.cpu_times(percpu=True)
        busy = {core: _busy_share(_machine_times(before[core]), _machine_times(after[core])) for core in usable
                if core < min(len(before), len(after))}
    except Exception:  # noqa: BLE001 - a sandbox without the counters: the first usable cores
        busy = {}
    if len(busy) < len(usable):
        return usable[:count]
    return sorted(sorted(usable, key=lambda core: (busy[core], core))[:count])


def _busy_share(before: Tuple[float, float], after: Tuple[float, float]) -> float:
    """A core's busy share between two (total, busy) readings of its counters."""
    total = after[0] - before[0]
    return 1.0 if total <= 0 else max(0.0, min(1.0, (after[1] - before[1]) / total))


def _pinned(cores: Sequence[int]) -> Callable[[], None]:
    def pin() -> None:  # in the child, before exec: every thread it starts inherits the cores
        os.sched_setaffinity(0, cores)
    return pin


def run_together(jobs: Sequence[Tuple[List[str], Any, Mapping[str, str]]], cores: Sequence[int],
                 timeout_s: Optional[float] = None, filler: Sequence[str] = FILLER) -> List[Tuple[Optional[int],
                                                                                                 float]]:
    """Starts every job ``(argv, stdout, env)`` at once, each in a session of its own pinned to ``cores``, and waits
    for all: per job, its exit code (None where it ran past ``timeout_s``, its group killed; 127 where it could not
    start, said in its stdout) and its seconds. Each job that ends while others still run is replaced by a
    ``filler`` on the same cores until the last ends. A Ctrl-C (KeyboardInterrupt, or SIGTERM/SIGHUP taken as one)
    is passed on to every group still running, which have :data:`GRACE_S` together to end; then the interrupt is
    raised again. Whatever a job left running in its group, and every filler, ends with the round."""
    procs: List[Optional[subprocess.Popen]] = []
    codes: List[Optional[int]] = [None] * len(jobs)
    walls: List[float] = [0.0] * len(jobs)
    fillers: List[subprocess.Popen] = []
    start = time.perf_counter()
    try:
        for k, (argv, stdout, env) in enumerate(jobs):
            try:
                procs.append(subprocess.Popen(argv, stdout=stdout, stderr=subprocess.STDOUT, env=dict(env),
                                              start_new_session=True, preexec_fn=_pinned(cores)))
            except OSError as err:
                stdout.write(f"lightning-perf race: cannot run {argv[0]!r}: {err.strerror or err}\n")
                procs.append(None)
                codes[k] = 127
        running = {k for k, proc in enumerate(procs) if proc is not None}
        if running:  # a job that could not start keeps a place on the cores too, as one that ended
            fillers.extend(_start_filler(filler, cores) for proc in procs if proc is None)
        while running:
            now = time.perf_counter()
            for k in sorted(running):
                code = procs[k].poll()  # type: ignore[union-attr]
                if code is None and timeout_s is not None and now - start > timeout_s:
                    signal_group(procs[k], signal.SIGKILL)  # type: ignore[arg-type]
                    procs[k].wait()  # type: ignore[union-attr]
                    code, timed_out = -1, True
                else:
                    timed_out = False
                if code is None:
                    continue
                running.discard(k)
                codes[k], walls[k] = (None if timed_out else code), now - start
                signal_group(procs[k], signal.SIGKILL)  # type: ignore[arg-type]  # what it left behind
                if running:
                    fillers.append(_start_filler(filler, cores))
            if running:
                time.sleep(POLL_S)
    except KeyboardInterrupt as stop:
        live = [proc for proc in procs if proc is not None and proc.poll() is None]
        for proc in live:
            signal_group(proc, getattr(stop, "signum", signal.SIGINT))
        deadline = time.perf_counter() + GRACE_S
        with contextlib.suppress(subprocess.TimeoutExpired, KeyboardInterrupt):
            for proc in live:
                proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
        raise
    finally:
        for proc in fillers:
            proc.kill()
        for proc in procs:
            if proc is not None:
                signal_group(proc, signal.SIGKILL)
                proc.wait()
        for proc in fillers:
            proc.wait()
    return list(zip(codes, walls))


def _start_filler(filler: Sequence[str], cores: Sequence[int]) -> subprocess.Popen:
    return subprocess.Popen(list(filler), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=_pinned(cores))


def together_note(info: Optional[Dict[str, Any]]) -> Optional[str]:
    """One clause for the rounds' line where the rounds ran together."""
    if not info:
        return None
    cores = ", ".join(str(core) for core in info["cores"])
    return (f"together: each round's commands ran at the same time on core(s) {cores}, each finished one's place"
            " kept busy to the round's end, so their it/s are of shared cores and only their ratios compare")
