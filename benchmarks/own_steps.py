"""The suite's own time, step by step: where its mean above its median goes, and which steps it makes slow.

One fit of the benchmark's ~1 ms CPU loop (``overhead.py``'s, torch on one thread, TensorBoard on) with the four
defaults in one ``PerfSuite``. Every step hook of the suite, and SectionProfiler's mark in the strategy's
``batch_to_device`` (where its iterations close, its tape is replayed, its fold and its window report run; and its
close wherever else one runs), is timed call by call (``perf_counter``) and summed
per step (a step ends at its batch end). Printed: the median, mean, p99, p99.9 and max of that time a step; how much
of the mean the steps over 5x the median carry; those steps by where they fall (a report step: the first of each
``report_every_n_steps`` window, where SectionProfiler's report runs; the step before it, where IterationTimer's and
VRAMMonitor's windows are logged; the others); and the largest. A step whose own time nears the loop's median step
is one the tool made slow, and IterationTimer's tail counts it (over 2x the median).

SectionProfiler's table is printed, as by default, where Lightning's INFO logging shows (here: to stderr);
``--quiet`` turns it off (``print_reports=False``).

    python benchmarks/own_steps.py                  # 3000 steps, about 20 seconds
    python benchmarks/own_steps.py --steps 6000 --quiet
    LIGHTNING_PERF_BENCH_SOURCE=../other-checkout python benchmarks/own_steps.py   # that checkout's package

The figures are wall time (a preempted hook counts): compare two checkouts in alternating runs on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402
import torch  # noqa: E402

import lightning_perf  # noqa: E402

#: The suite's hooks on the step path (the batch end closes a step).
STEP_HOOKS = ("on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
              "on_before_optimizer_step", "on_train_batch_end")


def own_time_per_step(suite: Any, steps: int, root: str,
                      clock: Callable[[], float] = time.perf_counter) -> List[float]:
    """Seconds spent in ``suite``'s step hooks (and its SectionProfiler's transfer mark and iteration close, where it
    holds one) in each of ``steps`` steps of the benchmark's loop, in step order, read on ``clock`` (wall time; a
    test passes a clock it moves itself)."""
    per: List[float] = [0.0]
    inside = [False]  # the close runs inside a hook (a dataloader_iter step's batch start): timed there once

    def timed(fn: Any, ends_step: bool = False) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if inside[0]:
                return fn(*args, **kwargs)
            inside[0], start = True, clock()
            try:
                return fn(*args, **kwargs)
            finally:
                per[-1] += clock() - start
                inside[0] = False
                if ends_step:
                    per.append(0.0)
        return wrapped

    for hook in STEP_HOOKS:
        setattr(suite, hook, timed(getattr(suite, hook), hook == "on_train_batch_end"))
    for cb in suite.callbacks:
        if isinstance(cb, lightning_perf.SectionProfiler):
            cb._fetch_started = timed(cb._fetch_started)  # where an iteration closes (installed at setup)
            cb._closed = timed(cb._closed)  # (a close elsewhere: an epoch's end)
            cb._batch_transfer = timed(cb._batch_transfer)  # installed at setup from this attribute
    overhead.fit([suite], steps, None, root)
    return per[:steps]


def place(i: int, every: int) -> str:
    """Where step ``i`` (0-based: the (i + 1)-th batch) falls: SectionProfiler's report closes the ``every``-th
    iteration at the next batch's transfer; IterationTimer and VRAMMonitor log their windows at that batch's end."""
    return "report step" if i % every == 0 else ("step before" if (i + 1) % every == 0 else "other")


def describe(per_step: List[float], every: int, skip: int = 20, top: int = 8) -> Dict[str, Any]:
    """The figures printed, in µs, over the steps after the first ``skip`` (the warm-up)."""
    us = [1e6 * s for s in per_step]
    steps = list(range(skip, len(us)))
    values = sorted(us[i] for i in steps)
    median = statistics.median(values)
    big = [i for i in steps if us[i] > 5 * median]
    by: Dict[str, List[float]] = {}
    for i in big:
        by.setdefault(place(i, every), []).append(us[i])
    return {"steps": len(steps), "median": median, "mean": statistics.fmean(values),
            "p99": values[int(0.99 * (len(values) - 1))], "p999": values[int(0.999 * (len(values) - 1))],
            "max": values[-1], "big_share_us": sum(us[i] for i in big) / len(steps),
            "by": {name: (len(v), statistics.fmean(v)) for name, v in by.items()},
            "largest": sorted(((us[i], i) for i in steps), reverse=True)[:top]}


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000, help="steps of the loop (default 3000)")
    parser.add_argument("--quiet", action="store_true", help="SectionProfiler(print_reports=False)")
    args = parser.parse_args(argv)
    if args.steps < 100:
        parser.error(f"--steps must be >= 100 (the first 20 are left out as warm-up), got {args.steps}")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    suite = lightning_perf.PerfSuite([lightning_perf.IterationTimer(),
                                      lightning_perf.SectionProfiler(print_reports=not args.quiet),
                                      lightning_perf.VRAMMonitor(), lightning_perf.EvalNoGradGuard()])
    every = suite.callbacks[1].report_every_n_steps
    with tempfile.TemporaryDirectory() as root:  # the runs' logs and summaries go with it
        overhead.run([], steps=100, skip=1, root=root)  # the process warmed up
        d = describe(own_time_per_step(suite, args.steps, root), every)
    print(f"\nThe four defaults in one PerfSuite (table {'not ' if args.quiet else ''}printed), µs in its step hooks"
          f" a step, over {d['steps']} steps:")
    print(f"  median {d['median']:.1f}  mean {d['mean']:.1f}  p99 {d['p99']:.0f}  p99.9 {d['p999']:.0f}"
          f"  max {d['max']:.0f}")
    print(f"  steps over 5x the median carry {d['big_share_us']:.1f} µs of the mean:")
    for name in ("report step", "step before", "other"):
        n, mean = d["by"].get(name, (0, 0.0))
        print(f"    {name:<12} {n:5} steps, mean {mean:7.0f} µs")
    print("  largest: " + ", ".join(f"step {i} ({place(i, every)}) {v:.0f}" for v, i in d["largest"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
