"""Per-step cost of lightning_perf's callbacks, measured against a bare Lightning loop in the same process.

Configurations run in interleaved rounds (bare, no-op callbacks, Lightning's monitors, our suite, each of our
callbacks alone) on a CPU-bound loop of about 1 ms per step. For each, the median over rounds of µs per step
is printed with its overhead over bare. Goals: the whole suite at most 1.25x the overhead of as many no-op
callbacks (Lightning's own hook dispatch), and below half the overhead of ThroughputMonitor + DeviceStatsMonitor +
SimpleProfiler.

    python benchmarks/overhead.py            # about 2 minutes on 2 cores
    python benchmarks/overhead.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, Dict, List, Optional

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import DeviceStatsMonitor, ThroughputMonitor
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.profilers import SimpleProfiler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lightning_perf  # noqa: E402


def suite() -> List[Callback]:
    """Every callback of lightning_perf, with defaults."""
    return [getattr(lightning_perf, name)() for name in lightning_perf.CALLBACKS]


class StepClock(Callback):
    """The same probe in every configuration: time from the end of step `skip` to the end of the last step."""

    def __init__(self, skip: int) -> None:
        self.skip, self.start, self.end, self.steps = skip, None, None, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps += 1
        if self.steps == self.skip:
            self.start = time.perf_counter()
        self.end = time.perf_counter()

    def us_per_step(self) -> float:
        return 1e6 * (self.end - self.start) / (self.steps - self.skip)


class Noop(Callback):
    pass


class Busy(LightningModule):
    """About 1 ms of CPU work per step."""

    def __init__(self, width: int = 384) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


_HOOKS = ("setup", "on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_train_batch_end",
          "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
          "on_train_epoch_end", "on_validation_start", "on_validation_end", "on_train_end")


def time_hooks(callbacks: List[Callback], spent: List[float]) -> None:
    """Wraps the step-path hooks of each callback to add the seconds spent inside them to ``spent[0]``."""
    for cb in callbacks:
        for hook in _HOOKS:
            original = getattr(cb, hook, None)
            if original is None or hook in ("setup", "on_train_start", "on_train_end"):
                continue

            def wrapped(*a, _f=original, **k):
                t = time.perf_counter()
                try:
                    return _f(*a, **k)
                finally:
                    spent[0] += time.perf_counter() - t

            setattr(cb, hook, wrapped)


def hook_cost(make: Callable[[], List[Callback]], steps: int, rounds: int, root: str) -> float:
    """Median µs per step spent inside the given callbacks' step hooks (a direct measure, free of run-to-run
    noise; wrappers a callback installs on the trainer, such as SectionProfiler's, are not included)."""
    costs = []
    for _ in range(rounds):
        spent = [0.0]
        callbacks = make()
        time_hooks(callbacks, spent)
        run(callbacks, steps=steps, skip=1, root=root)
        costs.append(1e6 * spent[0] / steps)
    return statistics.median(costs)


def run(callbacks: List[Callback], steps: int, skip: int, profiler: Any = None, root: str = ".") -> float:
    clock = StepClock(skip)
    x = torch.randn(steps * 16, 384)
    loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=16)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=TensorBoardLogger(root, name="bench"),
        callbacks=[clock, *callbacks], profiler=profiler, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, log_every_n_steps=50,
    )
    trainer.fit(Busy(), loader)
    return clock.us_per_step()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="200 steps, 2 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 200, 2
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    n = len(suite())
    configs: Dict[str, Callable[[], Dict[str, Any]]] = {
        "bare": lambda: {"callbacks": []},
        f"{n} no-op callbacks": lambda: {"callbacks": [Noop() for _ in range(n)]},
        "Lightning monitors (3)": lambda: {
            "callbacks": [ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0]), DeviceStatsMonitor()],
            "profiler": SimpleProfiler(),
        },
        f"lightning_perf suite ({n})": lambda: {"callbacks": suite()},
        f"PerfSuite ({n} in one)": lambda: {"callbacks": [lightning_perf.PerfSuite(suite())]},
    }
    for cb in suite():
        name = type(cb).__name__
        configs[f"  {name} alone"] = lambda name=name: {"callbacks": [getattr(lightning_perf, name)()]}
    results: Dict[str, List[float]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as root:
        names = list(configs)
        run(steps=args.steps // 4, skip=1, root=root, callbacks=[])  # warm the process up before measuring
        for r in range(args.rounds):
            # rotate the order each round, so that no configuration always runs first or last
            for name in names[r % len(names):] + names[: r % len(names)]:
                results[name].append(run(steps=args.steps, skip=args.steps // 5, root=root, **configs[name]()))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        inside = hook_cost(suite, args.steps, 3, root)
        inside_one = hook_cost(lambda: [lightning_perf.PerfSuite(suite())], args.steps, 3, root)
        inside_each = {type(cb).__name__: hook_cost(lambda cb=cb: [getattr(lightning_perf, type(cb).__name__)()],
                                                    args.steps, 3, root) for cb in suite()}
    median = {k: statistics.median(v) for k, v in results.items()}
    bare = median["bare"]
    print(f"\n{'configuration':<32}{'µs/step':>10}{'overhead µs/step':>18}{'x bare':>8}")
    for name, value in median.items():
        print(f"{name:<32}{value:>10.1f}{value - bare:>18.1f}{value / bare:>8.3f}")
    noop = median[f"{n} no-op callbacks"] - bare
    ours = median[f"lightning_perf suite ({n})"] - bare
    theirs = median["Lightning monitors (3)"] - bare
    print()
    floor = max(noop, 1.0)
    print(f"suite overhead / no-op floor:           {ours / floor:.2f}x   (goal <= 1.25x; floor {noop:.1f} µs/step)")
    print(f"time inside lightning_perf hooks:        {inside:.1f} µs/step (measured directly)")
    print(f"  the same {n} inside one PerfSuite:        {inside_one:.1f} µs/step (forwarding included)")
    one = median[f"PerfSuite ({n} in one)"] - bare
    print(f"PerfSuite overhead / separate callbacks: {one / ours:.2f}x   ({one:.1f} vs {ours:.1f} µs/step over bare)"
          if ours > 0 else "the separate callbacks showed no overhead")
    for name, value in inside_each.items():
        print(f"  {name + ':':<38}{value:.1f} µs/step inside its hooks")
    print(f"suite overhead / Lightning monitors:    {ours / theirs:.2f}x   (goal < 0.5x)" if theirs > 0 else
          "Lightning monitors showed no overhead")
    return 0


if __name__ == "__main__":
    sys.exit(main())
