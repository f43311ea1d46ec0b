"""Sees Lightning's dataloader fetch: marks put in front of those its training loop makes for its profiler where a
fetch starts and returns (its data fetcher calls them around ``next()`` on the DataLoader's iterator), on the loop
instance for the fit, and given back at teardown or after an exception. Private names, the same from Lightning 2.2 to
2.6: where they are not there nothing is installed, no fetch is seen, and the profiler falls back to the gap between
batches."""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

#: Where Lightning's training loop tells its profiler that a fetch starts and returns.
FETCH_MARKS = ("_on_before_fetch", "_on_after_fetch")
#: Said (warned once, and in the summary) when no fetch was announced in the first iterations.
GAP_REASON = ("Lightning's training loop announced no dataloader fetch (its `_on_before_fetch` and `_on_after_fetch`,"
              " which tell its profiler of each fetch) in 3 iterations: data loading is now timed as the whole gap from"
              " the end of one batch to the start of the next (data_loading_boundary='batch_gap'), so it also holds"
              " Lightning's loop, logging, the progress bar and other callbacks' batch-end hooks: an upper bound of the"
              " wait for data.")


class FetchMarks:
    """Ours (``started``, ``stopped``) in front of the loop's own marks (``before``, ``after``). ``loop`` is None once
    given back; the handle lives on, since a data fetcher that took ours (until the next epoch's start) goes on
    calling the loop's own through it."""

    __slots__ = ("loop", "names", "started", "stopped", "before", "after", "had")

    def __init__(self, loop: Any, names: Tuple[str, str], started: Callable[[], None],
                 stopped: Callable[[], None]) -> None:
        self.loop, self.names, self.started, self.stopped = loop, names, started, stopped
        self.before, self.after = (getattr(loop, name) for name in names)
        self.had = tuple(name in vars(loop) for name in names)  # an instance attribute before ours (another tool's)


def install(trainer: Any, started: Callable[[], None], stopped: Callable[[], None],
            names: Tuple[str, str] = FETCH_MARKS) -> Optional[FetchMarks]:
    """Puts ``started`` and ``stopped`` on the training epoch loop in place of its marks named ``names``; None
    (nothing changed) where the loop has no such marks."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    if not all(callable(getattr(loop, name, None)) for name in names):
        return None
    marks = FetchMarks(loop, names, started, stopped)
    for name, ours in zip(names, (started, stopped)):
        setattr(loop, name, ours)
    return marks


def uninstall(marks: Optional[FetchMarks]) -> None:
    """Gives the loop back its own marks (or what another tool had put on the instance), where ours are still there."""
    loop = marks.loop if marks is not None else None
    if loop is None:
        return
    own = vars(loop)
    for name, ours, theirs, had in zip(marks.names, (marks.started, marks.stopped), (marks.before, marks.after),
                                       marks.had):
        if own.get(name) == ours:
            if had:
                setattr(loop, name, theirs)
            else:
                delattr(loop, name)
    marks.loop = None


class FetchCount:
    """The fetches Lightning announced (their starts and returns), and the step ends of a fit's first iterations
    before one returned: after 3 without one (a release that renames the announcement, a loop of its own), data
    loading falls back to the gap between batches. A fetch whose start is announced and not its return counts as
    none."""

    __slots__ = ("started", "returned", "running", "ends_without")

    def __init__(self) -> None:
        self.started = 0
        self.returned = 0
        self.running = False  # a fetch started and has not returned
        self.ends_without: Optional[int] = None  # None: nothing to check (a fetch seen, or not watching)

    def falls_back(self) -> bool:
        """At a step's end while ``ends_without`` is not None: True at the third without a fetch seen."""
        if self.returned:
            self.ends_without = None
            return False
        self.ends_without = (self.ends_without or 0) + 1
        if self.ends_without < 3:
            return False
        self.ends_without = None
        return True
