"""How many threads torch gets in each run of a matrix or a race: the cores other processes leave free.

torch runs its CPU operators on as many intra-op threads as the process may use cores. When another process keeps
a core busy, every operator waits for its slowest thread, the one that shares the busy core: on a 2-core machine
with one core spinning, the denoise example's step took 67 to 128 ms with torch's two threads and 28 ms with one,
and the spread between runs hid a 10% change (docs/bench.md). ``--threads auto`` (the default) reads how busy the
machine is for a second before the first round and gives every run of every setup the same number of threads: the
cores left free. The runs of one matrix then compare like with like, whatever the machine does.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Mapping, Optional

__all__ = ["THREAD_VARIABLES", "choose_threads", "parse_threads", "thread_env", "threads_note"]

#: The variables torch (OpenMP) and MKL read at start-up for their thread counts.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")

#: Seconds of the machine's CPU counters read before the first round.
SPAN_S = 1.0


def parse_threads(value: Any) -> Any:
    """``auto``, ``keep`` or a whole number of threads >= 1 (as an int); a ValueError naming the value otherwise."""
    text = str(value).strip()
    if text in ("auto", "keep"):
        return text
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1 or str(number) != text:
        raise ValueError(f"--threads {value!r}: expected auto, keep or a whole number of threads >= 1")
    return number


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def busy_cores(span_s: float = SPAN_S, psutil_module: Any = None, sleep: Callable[[float], None] = time.sleep
               ) -> Optional[float]:
    """Cores the machine kept busy over ``span_s`` seconds (this process sleeps meanwhile: the others' use), from
    psutil's CPU time counters as VRAMMonitor reads them; None where they cannot be read."""
    from lightning_perf.measure.device.activity import _machine_times

    try:
        if psutil_module is None:
            import psutil as psutil_module
        cores = psutil_module.cpu_count(logical=True) or _usable_cores()
        total0, busy0 = _machine_times(psutil_module.cpu_times())
        sleep(span_s)
        total1, busy1 = _machine_times(psutil_module.cpu_times())
    except Exception:  # noqa: BLE001 - a sandbox without the counters: no figure, torch's default
        return None
    if total1 <= total0:
        return None
    return cores * max(0.0, min(1.0, (busy1 - busy0) / (total1 - total0)))


def choose_threads(how: Any, environ: Mapping[str, str] = os.environ,
                   measure: Callable[[], Optional[float]] = busy_cores) -> Dict[str, Any]:
    """The thread count every run gets: ``threads`` (None: torch's default, nothing set), ``how`` and ``reason``.

    ``auto``: a thread count set in the environment is the user's and is kept; otherwise the cores free before the
    first round (the usable cores less the busy ones, rounded; 1 where none was left free), and torch's default where
    every core was free. ``keep``: torch's default. A number: that many."""
    how = parse_threads(how)
    cores = _usable_cores()
    choice: Dict[str, Any] = {"how": how, "threads": None, "cores": cores, "busy_cores": None}
    if how == "keep":
        choice["reason"] = "torch's default (--threads keep)"
        return choice
    if how != "auto":
        choice["threads"] = how
        choice["reason"] = f"--threads {how}"
        return choice
    given = [f"{name}={environ[name]}" for name in THREAD_VARIABLES if environ.get(name)]
    if given:
        choice["reason"] = f"{', '.join(given)} in the environment, kept"
        return choice
    busy = measure()
    if busy is None:
        choice["reason"] = "torch's default: the machine's CPU counters could not be read"
        return choice
    choice["busy_cores"] = round(busy, 2)
    free = cores - int(round(busy))
    if free >= cores:
        choice["reason"] = f"torch's default: all {cores} cores were free before the first round"
        return choice
    choice["threads"] = max(1, free)
    if free < 1:  # every core busy: a run still needs a thread, and one waits the least for the busy cores
        choice["reason"] = (f"{busy:.1f} of {cores} cores were busy before the first round: no core was left free, so"
                            " each run gets 1 thread, the least (--threads keep for torch's default)")
        return choice
    choice["reason"] = (f"{busy:.1f} of {cores} cores were busy before the first round, so each run gets the"
                        f" {free} left free (--threads keep for torch's default)")
    return choice


def thread_env(env: Dict[str, str], choice: Optional[Dict[str, Any]]) -> Dict[str, str]:
    """``env`` with the chosen thread count set for torch and MKL (unchanged where the choice is torch's default)."""
    if choice and choice.get("threads"):
        env = dict(env)
        for name in THREAD_VARIABLES:
            env[name] = str(choice["threads"])
    return env


def threads_note(choice: Optional[Dict[str, Any]]) -> Optional[str]:
    """One clause for the rounds' line: the threads each run had and why."""
    if not choice:
        return None
    count = choice.get("threads")
    return f"torch threads: {count if count else 'default'} a run ({choice['reason']})"
