"""Interleaved rounds: every setup once per round, the order reversed each round (A B C, C B A, A B C, ...), so that a
drift of the machine lands on every setup alike; a time budget stops starting rounds that would not fit."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from lightning_perf.bench.process_group import signal_name, stops_as_interrupts
from lightning_perf.bench.threads import threads_note
from lightning_perf.bench.together import together_note

#: ``--repeats``' default: 5 rounds. On synthetic runs with 3% drift between runs, 5 runs a side find a 10% change
#: beyond the A/A noise floor in about 90% of trials (4 runs: 82%, 3 runs: 63%), and decide an A/A/A triple in about
#: 1%; see docs/cli.md, "Repeats".
DEFAULT_REPEATS = 5


def round_order(names: Sequence[Any], k: int) -> List[Any]:
    """The order of round ``k`` (from 1): as given in odd rounds, reversed in even ones."""
    return list(names) if k % 2 else list(names)[::-1]


def check_repeats(repeats: Any, budget_s: Any) -> None:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if budget_s is not None and (isinstance(budget_s, bool) or not isinstance(budget_s, (int, float))
                                 or not budget_s > 0 or budget_s == float("inf")):
        raise ValueError(f"budget must be a finite number of seconds > 0, got {budget_s!r}")


def run_rounds(names: Sequence[Any], repeats: int, run_one: Callable[[Any, int], Any],
               budget_s: Optional[float] = None, log: Callable[[str], None] = print,
               what: str = "rounds", clock: Callable[[], float] = time.perf_counter,
               until: Optional[Callable[[Dict[str, Any]], bool]] = None,
               run_round: Optional[Callable[[List[Any], int], Dict[Any, Any]]] = None) -> Dict[str, Any]:
    """Runs ``run_one(name, k)`` for each name in each round ``k`` = 1..``repeats`` (:func:`round_order`). With
    ``budget_s``, a round after the first starts only when the time spent so far plus the longest round so far fits
    in the budget (the first round always runs: no verdict without it). Returns ``results`` (name -> the round
    results in order), ``planned``, ``done``, ``budget_s``, ``round_s`` (each round's seconds), ``stopped`` (why
    rounds were left out, else None), ``interrupted`` and ``signal``: a Ctrl-C (or SIGTERM, SIGHUP) ends the rounds
    where they are, the round cut short left out (``run_one`` ends its run in flight first); :class:`NothingFinished`
    where that was the first round.

    With ``until`` (``--repeats auto``: :mod:`lightning_perf.bench.sequential`), ``repeats`` is the cap on rounds and
    ``until({"results": ..., "done": ...})`` is asked after every round: True (every comparison decided) ends the
    rounds there. ``rule`` ("sequential" or "fixed") and ``stop`` (why the rounds ended: ``decided``, ``budget``,
    ``max rounds``, ``interrupted``, or ``planned`` where a fixed count ran in full) say how they ended.

    With ``run_round`` (``race --together``), each round is ``run_round(names in the round's order, k)``, every setup's
    result at once, in place of ``run_one`` one setup after the other."""
    check_repeats(repeats, budget_s)
    decided = False
    results: Dict[Any, List[Any]] = {name: [] for name in names}
    start, round_s, stopped, interrupted, by, k = clock(), [], None, None, None, 1
    with stops_as_interrupts():
        try:
            for k in range(1, repeats + 1):
                spent = clock() - start
                if k > 1 and budget_s is not None and spent + max(round_s) > budget_s:
                    stopped = (f"stopped after {k - 1} of {repeats} {what}: round {k} would have passed the budget"
                               f" of {budget_s:g} s ({spent:.0f} s spent, the longest round took {max(round_s):.0f}"
                               " s)")
                    log(f"[{what}] {stopped}")
                    break
                began, this_round, order = clock(), {}, round_order(names, k)
                if run_round is not None:
                    log(f"[{what}] round {k} of {repeats}: {', '.join(map(str, order))} together")
                    this_round = run_round(order, k)
                else:
                    for name in order:
                        if repeats > 1:
                            log(f"[{what}] round {k} of {repeats}: {name}")
                        this_round[name] = run_one(name, k)
                for name, result in this_round.items():  # a round counts once every setup has run in it
                    results[name].append(result)
                round_s.append(clock() - began)
                if until is not None and _asked(until, {"results": results, "done": len(round_s)}, log, what):
                    decided = True
                    log(f"[{what}] every comparison decided after {len(round_s)} round(s): stopping")
                    break
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP: the run in flight has ended (process_group)
            by = signal_name(stop)
            interrupted = f"interrupted ({by}) in round {k} of {repeats}; the runs of that round are left out"
            log(f"[{what}] {interrupted}")
    stop = ("interrupted" if interrupted else "decided" if decided else "budget" if stopped
            else "max rounds" if until is not None else "planned")
    info = {"results": results, "planned": repeats, "done": len(round_s), "budget_s": budget_s,
            "round_s": round_s, "stopped": stopped, "interrupted": interrupted, "signal": by,
            "rule": "sequential" if until is not None else "fixed", "stop": stop}
    if interrupted and not round_s:
        raise NothingFinished(info)
    return info


def _asked(until: Callable[[Dict[str, Any]], bool], sofar: Dict[str, Any], log: Callable[[str], None],
           what: str) -> bool:
    """``until(sofar)``; a stopping rule that raises stops nothing (the budget and the cap still do): said, not
    raised, so the rounds that ran are still reported."""
    try:
        return bool(until(sofar))
    except Exception as err:  # noqa: BLE001 - a bug in reading the rounds so far must not lose them
        log(f"[{what}] could not read the rounds so far ({type(err).__name__}: {err}); the rounds go on to the budget"
            " or the cap")
        return False


class NothingFinished(Exception):
    """The rounds were interrupted before the first one finished: nothing to report. ``info`` as
    :func:`run_rounds` returns it."""

    def __init__(self, info: Dict[str, Any]) -> None:
        super().__init__(f"{info['interrupted']}: no round finished, nothing to report")
        self.info = info


def rounds_line(info: Optional[Dict[str, Any]]) -> Optional[str]:
    """One line on the rounds run: how many of those asked, their time, and why the budget or an interrupt stopped
    them."""
    if not info:
        return None
    total = sum(info["round_s"])
    if info.get("rule") == "sequential":
        line = (f"{info['done']} interleaved rounds ran until decided (at most {info['planned']}; {total:.0f} s, each"
                f" setup once a round in a fresh process, the order reversed each round), stopped: {info['stop']}")
    else:
        line = (f"{info['done']} of {info['planned']} interleaved rounds ran ({total:.0f} s, each setup once a round"
                " in a fresh process, the order reversed each round)")
    if info.get("budget_s") is not None:
        line += f"; budget {info['budget_s']:g} s"
    if info.get("stopped"):
        line += f": {info['stopped']}; the verdicts are from the rounds that ran"
    if info.get("interrupted"):
        line += f": {info['interrupted']}; the verdicts are from the rounds that finished"
    threads = threads_note(info.get("threads"))
    together = together_note(info.get("together"))
    return line + "".join(f"; {note}" for note in (threads, together) if note) + "."
