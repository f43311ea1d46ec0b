"""Python bytecodes a step inside a callback's step path: a count other processes on the machine cannot move.

The benchmark's ~1 ms CPU loop (``overhead.py``'s) runs with one callback (or ``PerfSuite``); every Python opcode
executed inside its step-path hooks (and SectionProfiler's marks at the fetch and in ``batch_to_device``) is counted
with ``sys.settrace``, by function. Printed: opcodes and Python calls a step, and the functions that run the most.
The count is exact and the same on a busy machine as on an idle one, so two versions compare in one run each
(``--against`` runs the other checkout's package in a subprocess). It prices no opcode: a step's µs, with the cache
misses a hook meets right after torch's work, are what ``overhead.py --paired`` measures; use this to find where a
difference comes from.

    python benchmarks/step_opcodes.py SectionProfiler                       # ~30 s on 2 cores
    python benchmarks/step_opcodes.py PerfSuite --against ../other-checkout --top 15
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
from typing import Any, Counter, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402

import lightning_perf  # noqa: E402


def count(name: str, steps: int) -> Tuple[Counter[str], Counter[str]]:
    """(opcodes, calls) by ``file:function`` over ``steps`` steps of the loop with callback ``name``."""
    ops: Counter[str] = collections.Counter()
    calls: Counter[str] = collections.Counter()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        key = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}"
        calls[key] += 1

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "opcode":
                ops[key] += 1
            return local
        return local

    def traced(fn: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            sys.settrace(tracer)
            try:
                return fn(*args, **kwargs)
            finally:
                sys.settrace(None)
        return wrapped

    cb = lightning_perf.PerfSuite() if name == "PerfSuite" else getattr(lightning_perf, name)()
    overhead.wrap_step_path([cb], traced)
    with tempfile.TemporaryDirectory() as root:
        overhead.run([cb], steps=steps, skip=1, root=root)
    return ops, calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("callback", choices=lightning_perf.CALLBACKS + ("PerfSuite",))
    parser.add_argument("--steps", type=int, default=500, help="steps of the loop (default 500)")
    parser.add_argument("--top", type=int, default=20, help="functions listed (default 20)")
    parser.add_argument("--against", metavar="CHECKOUT", help="also count another checkout's package, after this one")
    args = parser.parse_args()
    overhead.LOGGER["on"] = False
    ops, calls = count(args.callback, args.steps)
    print("-" * 80)
    print(f"{args.callback} ({os.path.dirname(os.path.dirname(lightning_perf.__file__))}): "
          f"{sum(ops.values()) / args.steps:.1f} opcodes and {sum(calls.values()) / args.steps:.1f} Python calls a step"
          f" over {args.steps} steps")
    for key, n in ops.most_common(args.top):
        print(f"  {n / args.steps:8.1f} opcodes  {calls[key] / args.steps:6.2f} calls  {key}")
    if args.against:
        here = os.path.abspath(__file__)
        env = dict(os.environ, **{overhead.SOURCE_ENV: os.path.abspath(args.against)})
        subprocess.run([sys.executable, here, args.callback, "--steps", str(args.steps), "--top", str(args.top)],
                       env=env, check=True)


if __name__ == "__main__":
    main()
