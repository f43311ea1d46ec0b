"""What memory a callback touches costs the rest of the step: a probe for the gap between the paired A/B and a
callback's own time in its hooks.

A callback copies N KB (a ``bytearray`` slice assignment: N KB read, N KB written) at each training batch end, on
the benchmark's ~1 ms CPU loop (``overhead.py``'s). For each N it prints the time inside that hook (thread CPU, mean
per step) and the paired A/B of the callback (``overhead.run_paired``: in and out of the Trainer in alternate
blocks of 7 steps, 95% CIs over pairs of blocks). Where the A/B exceeds the hook's own time plus one dispatch, the
difference is paid by the rest of the step: what the hook touched evicted the step's own working set (the model's
weights and gradients) from the core's caches. The 0 KB row is the baseline: the hook's two clock reads and
Lightning's dispatch of it.

    python benchmarks/cache_pollution.py                 # 0, 64, 256 and 1024 KB, about 2 minutes
    python benchmarks/cache_pollution.py --kb 0 256 --steps 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from typing import List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402


class Touch(Callback):
    """Copies ``kb`` KB at each training batch end and keeps the thread CPU time that takes."""

    def __init__(self, kb: int) -> None:
        self.source, self.target = bytearray(os.urandom(kb * 1024)), bytearray(kb * 1024)
        self.spent, self.calls = 0.0, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        start = time.thread_time()
        self.target[:] = self.source
        self.spent += time.thread_time() - start
        self.calls += 1


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kb", type=int, nargs="+", default=[0, 64, 256, 1024], help="KB copied per step")
    parser.add_argument("--steps", type=int, default=4000, help="steps of each paired fit (default 4000)")
    args = parser.parse_args(argv)
    if any(kb < 0 for kb in args.kb):
        parser.error(f"--kb must be >= 0, got {args.kb}")
    if args.steps < 60:
        parser.error(f"--steps must be >= 60 (pairs of 7-step blocks after the warm-up), got {args.steps}")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    overhead.LOGGER["on"] = False
    print(f"{'KB copied':>10}{'in hook':>9}{'paired mean +':>15}{'[95% CI]':>18}{'median +':>10}{'[95% CI]':>18}"
          "   thread CPU µs a step")
    with tempfile.TemporaryDirectory() as root:
        overhead.run([], steps=300, skip=1, root=root)  # warm the process up before measuring
        for kb in args.kb:
            touch = Touch(kb)
            r = overhead.run_paired([touch], args.steps, args.steps // 10, 7, root=root)
            inside = 1e6 * touch.spent / max(1, touch.calls)
            print(f"{kb:>10}{inside:>9.1f}{r['mean']:>15.1f}  [{r['mean_ci'][0]:6.1f}, {r['mean_ci'][1]:6.1f}]"
                  f"{r['median']:>10.1f}  [{r['median_ci'][0]:6.1f}, {r['median_ci'][1]:6.1f}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
