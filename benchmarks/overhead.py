"""Per-step cost of lightning_perf's callbacks, measured against a bare Lightning loop in the same process.

Configurations run in interleaved rounds (bare, no-op callbacks, Lightning's monitors, the suite as separate
callbacks, the suite in one PerfSuite, each callback alone) on a CPU-bound loop of about 1 ms per step, with torch on
one thread. Each run is timed in CPU time of the training thread (time.thread_time), which other processes on the
machine do not inflate, and the overhead of a configuration is the median over rounds of its difference from bare in
the same round, with a bootstrap 95% CI over rounds. Then, per callback:

- dispatch: Lightning calls every hook of every callback (counted here, per step) inside its profiler context;
  the cost of one such call is timed in isolation;
- in its hooks: time spent inside the callback's own hooks (median of several runs);
- total, and the suite's share of a 10 ms and a 1 ms step.

    python benchmarks/overhead.py                  # about 5 minutes on 2 cores
    python benchmarks/overhead.py --quick          # a smoke run
    python benchmarks/overhead.py --device cuda    # on a GPU: a ~10 ms GPU-bound step, wall time (the host waits)
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


#: What StepClock reads: training-thread CPU time on CPU; wall time on CUDA, where the host waits for the device.
CLOCK = {"fn": time.thread_time}


class StepClock(Callback):
    """The same probe in every configuration: training-thread CPU time from the end of step `skip` to the end of
    the last step (time.thread_time: what this thread ran, not what the machine's other processes took); on CUDA
    wall time, with one synchronize at the two marks only."""

    def __init__(self, skip: int) -> None:
        self.skip, self.start, self.end, self.steps = skip, None, None, 0

    def _now(self) -> float:
        if CLOCK["fn"] is time.perf_counter:
            torch.cuda.synchronize()
        return CLOCK["fn"]()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps += 1
        if self.steps == self.skip:
            self.start = self._now()
        elif self.steps > self.skip:
            self.end = self._now() if self.steps == trainer.max_steps else None

    def us_per_step(self) -> float:
        return 1e6 * (self.end - self.start) / (self.steps - self.skip)


class GpuBatches:
    """The same device-resident batch `steps` times: no host-to-device copy in the measurement."""

    def __init__(self, steps: int, batch: int, width: int) -> None:
        x = torch.randn(batch, width, device="cuda")
        self.batch, self.steps = (x, x[:, :1].clone()), steps

    def __iter__(self):
        return iter([self.batch] * self.steps)

    def __len__(self) -> int:
        return self.steps


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
                t = time.perf_counter()  # vDSO, ~50 ns; thread_time is a system call that would inflate this
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


def dispatch_counts(steps: int, root: str) -> Dict[str, float]:
    """How many hook calls Lightning makes per training step on one callback, by hook name."""
    from lightning.pytorch.trainer import call

    counts: Dict[str, int] = {}
    original = call._call_callback_hooks

    def counting(trainer, hook_name, *args, **kwargs):
        counts[hook_name] = counts.get(hook_name, 0) + 1
        return original(trainer, hook_name, *args, **kwargs)

    call._call_callback_hooks = counting
    try:
        run([], steps=steps, skip=1, root=root)
    finally:
        call._call_callback_hooks = original
    return {name: n / steps for name, n in counts.items() if n >= steps}


def dispatch_cost_us(calls: int = 200_000) -> float:
    """One Lightning callback-hook call on a callback that does nothing: getattr, callable, the profiler context
    (PassThroughProfiler, the default) and the call, as in lightning.pytorch.trainer.call._call_callback_hooks."""
    from lightning.pytorch.profilers import PassThroughProfiler

    profiler, cb, trainer = PassThroughProfiler(), Noop(), object()
    name = "on_train_batch_end"
    start = time.thread_time()
    for _ in range(calls):
        fn = getattr(cb, name)
        if callable(fn):
            with profiler.profile(f"[Callback]{cb.state_key}.{name}"):
                fn(trainer, None, None, None, 0)
    return 1e6 * (time.thread_time() - start) / calls


def bootstrap_median_ci(values: List[float], resamples: int = 2000, seed: int = 0) -> tuple:
    import random

    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * (resamples - 1))], medians[int(0.975 * (resamples - 1))]


#: The loop: "cpu", a ~1 ms CPU step; "cuda", a ~10 ms GPU-bound step (4096 x 4096 layers on a 4096 batch).
DEVICE = {"kind": "cpu"}


def run(callbacks: List[Callback], steps: int, skip: int, profiler: Any = None, root: str = ".") -> float:
    clock = StepClock(skip)
    if DEVICE["kind"] == "cuda":
        loader: Any = GpuBatches(steps, batch=4096, width=4096)
        model = Busy(width=4096)
    else:
        x = torch.randn(steps * 16, 384)
        loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=16)
        model = Busy()
    trainer = Trainer(
        accelerator="gpu" if DEVICE["kind"] == "cuda" else "cpu", devices=1, max_steps=steps,
        logger=TensorBoardLogger(root, name="bench"),
        callbacks=[clock, *callbacks], profiler=profiler, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, log_every_n_steps=50,
    )
    trainer.fit(model, loader)
    return clock.us_per_step()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="200 steps, 2 rounds")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: a ~1 ms CPU step in thread CPU time; cuda: a ~10 ms GPU step in wall time")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds = 200, 2
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device here")
        DEVICE["kind"], CLOCK["fn"] = "cuda", time.perf_counter
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
    suite_name, one_name = f"lightning_perf suite ({n})", f"PerfSuite ({n} in one)"
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
        per_step = dispatch_counts(args.steps // 2, root)
    call_us = dispatch_cost_us()
    calls = sum(per_step.values())
    dispatch = calls * call_us
    median = {k: statistics.median(v) for k, v in results.items()}
    bare_runs = results["bare"]
    unit = "wall µs/step" if args.device == "cuda" else "CPU µs/step"
    print(f"\n{'configuration':<32}{unit:>12}{'overhead µs/step (95% CI)':>30}")
    for name, values in results.items():
        diffs = [v - b for v, b in zip(values, bare_runs)]
        lo, hi = bootstrap_median_ci(diffs) if name != "bare" else (0.0, 0.0)
        print(f"{name:<32}{median[name]:>12.1f}{statistics.median(diffs):>14.1f}  [{lo:7.1f}, {hi:7.1f}]")
    print(f"\nLightning calls {calls:.0f} callback hooks per training step on every callback"
          f" ({', '.join(f'{k} {v:g}' for k, v in sorted(per_step.items()))}),")
    print(f"each {call_us:.2f} µs on a callback that does nothing: {dispatch:.1f} µs per callback per step.\n")
    print(f"{'per callback':<26}{'dispatch':>10}{'in hooks':>10}{'total':>10}   µs/step")
    for name, value in inside_each.items():
        print(f"  {name:<24}{dispatch:>10.1f}{value:>10.1f}{dispatch + value:>10.1f}")
    separate = n * dispatch + inside
    together = dispatch + inside_one
    print(f"  {'suite, separate':<24}{n * dispatch:>10.1f}{inside:>10.1f}{separate:>10.1f}")
    print(f"  {'suite in one PerfSuite':<24}{dispatch:>10.1f}{inside_one:>10.1f}{together:>10.1f}")
    for label, total in (("separate", separate), ("PerfSuite", together)):
        print(f"suite ({label}): {100 * total / 10_000:.2f}% of a 10 ms step, {100 * total / 1_000:.1f}% of a 1 ms step")
    if args.device == "cuda":
        step = median["bare"]
        for name in (suite_name, one_name):
            over = statistics.median([v - b for v, b in zip(results[name], bare_runs)])
            print(f"{name} on this {step / 1000:.1f} ms GPU step: {100 * over / step:+.2f}% wall time (A/B),"
                  f" goal < 0.5%")
    print("goal (issue 11): whole suite <= 40 µs/step, each callback <= 15 µs/step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
