"""Per-step cost of lightning_perf's callbacks, measured against a bare Lightning loop in the same process.

Configurations run in interleaved rounds (bare, no-op callbacks, Lightning's monitors, the suite as separate
callbacks, the suite in one PerfSuite, each callback alone) on a CPU-bound loop of about 1 ms per step, with torch on
one thread. Each run is timed in CPU time of the training thread (time.thread_time), which other processes on the
machine do not inflate, and the overhead of a configuration is the median over rounds of its difference from bare in
the same round, with a bootstrap 95% CI over rounds. Where the machine's speed drifts from one run to the next (a
shared VM: one run's median step moved by tens of percent), that spread swamps a few µs, so each configuration then
runs once more, paired inside one fit: its callbacks in and out of the Trainer in alternate blocks of 7 steps
(``--paired``; see ``Blocks``), and the difference of the steps with and without them has a 95% CI from a
bootstrap over pairs of adjacent blocks (on CUDA, in the full benchmark, on the host-bound loop only). Then, per
callback:

- dispatch: Lightning calls every hook of every callback (counted here, per step) inside its profiler context;
  the cost of one such call is timed in isolation;
- in its hooks: time spent inside the callback's own hooks, and for SectionProfiler its mark in the strategy's
  ``batch_to_device``, where its iterations close (median of several runs, less what the timing wrapper adds to each
  call; with a logger, this includes waits for the GIL that its writer thread holds);
- total, and the suite's share of a 10 ms and a 1 ms step;
- SectionProfiler's transfer boundary: what its wrapper around the strategy's ``batch_to_device`` and the section
  switch add to the median batch (the mean, with closes, folds and reports, is in its in-hook figure);
- validation under ``torch.no_grad`` (``Trainer(inference_mode=False)``) with and without EvalNoGradGuard, CPU time
  per batch in paired rounds;
- what one scalar logged to TensorBoard costs with TensorBoard's default queue of 10 events and with 1000.

    python benchmarks/overhead.py                  # about 4 minutes on 2 cores
    python benchmarks/overhead.py --paired         # the paired A/B alone, about 1.5 minutes
    python benchmarks/overhead.py --paired --paired-steps 12000 --configs PerfSuite spin --spin-us 40
                                                   # the suite beside a hook of known cost, ~2 minutes
    python benchmarks/overhead.py --quick          # a smoke run
    python benchmarks/overhead.py --device cuda    # on a GPU, every configuration: over 8 minutes; see below
    python benchmarks/overhead.py --hooks-only SectionProfiler PerfSuite --against ../old-checkout --rounds 3
                                                   # two versions' in-hook figures, alternating runs
    python benchmarks/overhead.py --hooks-only SectionProfiler --manual --against ../old --rounds 3
                                                   # the same, manual optimization with two optimizers
    python benchmarks/overhead.py --hooks-only SectionProfiler --simulated-device
                                                   # the Python of the CUDA path, on the CPU loop (see below)
    python benchmarks/overhead.py --hooks-only IterationTimer --simulated-device --event-us 3.04 --against ../old
                                                   # the same, each event record priced as on an H100 host

On a GPU (``--device cuda``) the A/B runs a ~10 ms GPU-bound step in wall time (the host queues kernels ahead of
the device, as in real training; a step's time is the distance of two CUDA events the probe records at batch ends,
with no synchronize). There the time inside a hook is not the hook's cost: once the launch queue is full,
the first CUDA call of any step (our event record, say) waits for a free slot, and that wait lands in whichever hook
makes it. So the in-hook and dispatch figures are taken on a light, host-bound CUDA step (256-wide layers), where
the queue never fills and a hook's time is what it costs the host.

Without a GPU, ``--simulated-device`` (with ``--hooks-only`` or ``--per-hook``) gives SectionProfiler and
IterationTimer a device clock at train start whose events read the host clock (``SimulatedEvent``), as the tests'
simulated device does: their CUDA path runs on the CPU loop (which iterations record events, the live switches there,
the polls), every call but torch's own. A real ``Event.record`` costs ~3 µs more a call on an H100 host
(``benchmarks/cuda_calls.py``), and hooks cost more there beside CUDA work: a figure to compare two versions of that
path, not a CUDA figure. ``--event-us US`` makes each simulated record spin US µs first (3.04: an H100 host's price
of a record in a tight loop), so a version that records fewer events reads as much less as the records' price.
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
from lightning.pytorch.callbacks import DeviceStatsMonitor, ThroughputMonitor, Timer
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

#: The checkout whose lightning_perf is measured: this one, or the one ``--against`` names (set for its runs).
SOURCE_ENV = "LIGHTNING_PERF_BENCH_SOURCE"
#: This script's own checkout.
CHECKOUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.environ.get(SOURCE_ENV) or CHECKOUT)
import lightning_perf  # noqa: E402


def lightning_monitors(timer: bool) -> List[Callback]:
    """Lightning's own monitors: ThroughputMonitor and DeviceStatsMonitor, and with ``timer`` a ``Timer`` with a time
    limit, as users set one (it checks the time and broadcasts the answer every step; with no limit it costs its
    dispatch only): the three the suite's 0.85x goal is set against."""
    monitors: List[Callback] = [ThroughputMonitor(batch_size_fn=lambda b: b[0].shape[0]), DeviceStatsMonitor()]
    if timer:
        monitors.append(Timer(duration="00:12:00:00"))
    return monitors


def suite() -> List[Callback]:
    """Every callback of lightning_perf, with defaults."""
    return [getattr(lightning_perf, name)() for name in lightning_perf.CALLBACKS]


#: Runs per in-hook figure (the median is reported): TensorBoard's writer makes single runs vary by several µs/step.
HOOK_ROUNDS = 5

#: Whether runs log to TensorBoard (as a user's would), or to no logger: the difference is what logging costs.
LOGGER = {"on": True}

#: What the probes read on CPU: the training thread's CPU time. On CUDA they record an event instead (``clock_now``).
CLOCK = {"fn": time.thread_time}
#: Makes the probes' timing event on CUDA, and gives the stream they record on (asked once: ``Event.record()``
#: without a stream asks for it at every call, 10.7 against 3.0 µs on an H100 host). Tests put simulated ones here.
EVENT: Dict[str, Callable[[], Any]] = {"factory": lambda: torch.cuda.Event(enable_timing=True),
                                       "stream": lambda: torch.cuda.current_stream()}
_STREAM: List[Any] = []


def clock_now() -> Any:
    """The probes' clock. On CPU the training thread's CPU time, in seconds. On CUDA a timing event recorded on the
    current stream, with no synchronize: the host runs ahead of the device as it would without the probe, and the
    distance of two events (``seconds_between``, read after the run) is the wall time of the steps between them as
    the device ran them. A synchronize at each mark, as this clock did from 2026-11-23, made the loop wait for the
    device at every batch end: the host work of every hook after it then came out as wall time even on a GPU-bound
    step (the H100 run of 2026-11-24: +206 µs, 1.9%, on an 11 ms step)."""
    if DEVICE["kind"] == "cuda":
        if not _STREAM:
            _STREAM.append(EVENT["stream"]())
        event = EVENT["factory"]()
        event.record(_STREAM[0])
        return event
    return CLOCK["fn"]()


def seconds_between(a: Any, b: Any) -> float:
    """Seconds from mark ``a`` to mark ``b`` of ``clock_now`` (CUDA events: once the device has passed ``b``; ``a``,
    recorded before it on the same stream, has passed too)."""
    if not hasattr(b, "elapsed_time"):  # a number: the host clock
        return b - a
    b.synchronize()
    return a.elapsed_time(b) / 1000.0


class StepClock(Callback):
    """The same probe in every configuration: training-thread CPU time of every step after step `skip`, from the
    end of one step to the end of the next (time.thread_time: what this thread ran, not what the machine's other
    processes took; every hook, log step and periodic fold falls in one of these intervals); on CUDA wall time, from
    one event recorded at each mark (``clock_now``)."""

    def __init__(self, skip: int) -> None:
        self.skip, self.steps = skip, 0
        self.marks: List[Any] = []
        self.process_cpu = [0.0, 0.0]  # process CPU (every thread: a logger's writer too) at the first and last mark

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps += 1
        if self.steps >= self.skip:
            self.marks.append(clock_now())
            if len(self.marks) == 1:
                self.process_cpu[0] = time.process_time()
            self.process_cpu[1] = time.process_time()

    def us_per_step(self) -> "StepTimes":
        times = [seconds_between(a, b) for a, b in zip(self.marks, self.marks[1:])]
        return StepTimes(1e6 * statistics.mean(times), 1e6 * statistics.median(times),
                         1e6 * (self.process_cpu[1] - self.process_cpu[0]) / len(times))


class StepTimes(tuple):
    """(mean, median, process CPU mean) µs of one run's steps: the mean includes every log step and periodic fold;
    process CPU adds what other threads of the process (TensorBoard's writer) spent meanwhile."""

    def __new__(cls, mean: float, median: float, process: float = float("nan")) -> "StepTimes":
        return super().__new__(cls, (mean, median, process))

    @property
    def mean(self) -> float:
        return self[0]

    @property
    def median(self) -> float:
        return self[1]

    @property
    def process(self) -> float:
        return self[2]


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


#: The step hooks a spin is spread over, in this order: ``--spin-hooks 1`` spins at the batch end alone.
SPIN_HOOKS = ("on_train_batch_end", "on_train_batch_start", "on_before_zero_grad", "on_before_backward",
              "on_after_backward", "on_before_optimizer_step")


def spin_name(us: float, hooks: int = 1) -> str:
    """The A/B's name of the configuration ``--spin-us us --spin-hooks hooks`` adds."""
    return f"spin {us:g} µs (calibration)" if hooks == 1 else f"spin {us:g} µs over {hooks} hooks (calibration)"


class Spin(Callback):
    """A calibration for the paired A/B: ``us`` µs spun at each step on ``perf_counter`` (a vDSO read: no system
    call, whose kernel entry would itself disturb the step; the thread's CPU time where it is not preempted), touching
    almost no memory, in ``hooks`` of the step hooks (:data:`SPIN_HOOKS`, the batch end first), ``us / hooks`` in
    each. Its A/B is that time plus its dispatch plus what a hook's work costs the step around it (caches, the branch
    predictor): a callback's A/B above its own time and dispatch compares with this, and the same µs over six hooks
    against one says what the places a callback's work runs in cost beyond the work."""

    def __init__(self, us: float, hooks: int = 1) -> None:
        self.us, self.hooks = us, hooks
        self.each_s = us * 1e-6 / hooks
        for name in SPIN_HOOKS[:hooks]:
            setattr(self, name, self._spin)  # Lightning looks the hook up on the instance

    def _spin(self, *args: Any) -> None:
        clock = time.perf_counter
        end = clock() + self.each_s
        while clock() < end:
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

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


class ManualBusy(Busy):
    """``Busy`` under manual optimization with two optimizers (first and last layers; a GAN's two nets): one
    ``manual_backward`` and two ``opt.step()`` a batch (``--manual``)."""

    def __init__(self, width: int = 384) -> None:
        super().__init__(width)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        opts = self.optimizers()
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in opts:
            opt.step()
        return loss

    def configure_optimizers(self):
        params = list(self.parameters())
        return torch.optim.SGD(params[:2], lr=1e-3), torch.optim.SGD(params[2:], lr=1e-3)


class ValClock(Callback):
    """Training-thread CPU time from the start of the first validation batch to the end of the last (listed first,
    so a callback's batch-start work is inside)."""

    def __init__(self) -> None:
        self.start, self.end, self.batches = None, None, 0

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.start is None:
            self.start = time.thread_time()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.batches += 1
        self.end = time.thread_time()

    def us_per_batch(self) -> float:
        return 1e6 * (self.end - self.start) / self.batches


def validation_cost(batches: int, rounds: int, root: str) -> Dict[str, List[float]]:
    """µs per validation batch under ``torch.no_grad`` (``Trainer(inference_mode=False)``, as validation inside fit
    runs), without and with EvalNoGradGuard, in interleaved rounds."""
    x = torch.randn(batches * 16, 384)
    loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=16)
    model = Busy()
    out: Dict[str, List[float]] = {"without": [], "with EvalNoGradGuard": []}
    for r in range(rounds):
        for name in (list(out) if r % 2 == 0 else list(out)[::-1]):
            clock = ValClock()
            callbacks = [clock] + ([lightning_perf.EvalNoGradGuard()] if name != "without" else [])
            trainer = Trainer(accelerator="cpu", devices=1, inference_mode=False, logger=False, default_root_dir=root,
                              callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False)
            trainer.validate(model, loader, verbose=False)
            out[name].append(clock.us_per_batch())
    return out


#: Scalars the four default callbacks log at one report on CPU (a burst in ``tensorboard_cost``).
REPORT_SCALARS = 18


def tensorboard_cost(root: str, queues: tuple = (10, 1000), reports: int = 60, scalars: int = REPORT_SCALARS,
                     gap_ms: float = 10.0) -> Dict[Optional[int], tuple]:
    """What one logged scalar costs through Lightning's TensorBoardLogger, per ``max_queue`` (10 is TensorBoard's
    default): bursts of ``scalars`` (what the four default callbacks log at one report on CPU) with ``gap_ms`` of
    torch work between them, as in training. Returns {max_queue: (µs per scalar inside ``log_metrics`` on the
    training thread, process CPU µs per scalar: the whole loop, writer thread and final flush included, less the same
    loop without a logger (key None))}."""
    a = torch.randn(256, 256)
    out: Dict[Optional[int], tuple] = {}
    for q in (None,) + tuple(queues):
        logger = TensorBoardLogger(root, name=f"tb_queue_{q}", max_queue=q) if q is not None else None
        metrics = {f"bench/scalar_{i}": float(i) for i in range(scalars)}
        in_call, cpu = 0.0, time.process_time()
        for step in range(reports):
            end = time.perf_counter() + gap_ms / 1000
            while time.perf_counter() < end:
                a = torch.tanh(a @ a)  # releases the GIL, as training's kernels do: the writer thread runs meanwhile
            if logger is not None:
                t = time.perf_counter()
                logger.log_metrics(metrics, step=step)
                in_call += time.perf_counter() - t
        if logger is not None:
            logger.finalize("success")
        out[q] = (1e6 * in_call / (reports * scalars), 1e6 * (time.process_time() - cpu) / (reports * scalars))
    base = out[None][1]
    return {q: (call, cpu - base) for q, (call, cpu) in out.items() if q is not None}


_HOOKS = ("setup", "on_train_start", "on_train_epoch_start", "on_train_batch_start", "on_train_batch_end",
          "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
          "on_train_epoch_end", "on_validation_start", "on_validation_end", "on_train_end")


def step_hooks(cb: Callback) -> List[str]:
    """The hooks of the step path that ``cb``'s class defines (calling Lightning's empty ones is the dispatch cost,
    counted apart)."""
    return [hook for hook in _HOOKS if hook not in ("setup", "on_train_start", "on_train_end")
            and getattr(type(cb), hook, None) is not getattr(Callback, hook, None)]


def timed(fn: Callable[..., Any], record: Callable[[float], Any]) -> Callable[..., Any]:
    """``fn`` with the seconds of each call passed to ``record``, read with perf_counter (vDSO, ~50 ns).
    thread_time would leave out a wait for the GIL (a logger's writer thread holds it at times), but it is a system
    call that costs several times more between two steps' torch work than in a tight loop, so no calibration takes
    it off: it added ~0.75 µs to every hook call."""
    clock = time.perf_counter

    def wrapped(*a: Any, **k: Any) -> Any:
        t = clock()
        try:
            return fn(*a, **k)
        finally:
            record(clock() - t)

    return wrapped


def wrap_step_path(callbacks: List[Callback], wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replaces each callback's step-path hooks, and a SectionProfiler's marks outside Lightning's hooks (in the
    strategy's ``batch_to_device``, where its iterations close, with the periodic fold and report; where the fetch
    starts and returns), with ``wrap(method)``. Before the fit: the marks are installed at setup from these
    attributes."""
    for cb in callbacks:
        for hook in step_hooks(cb):
            setattr(cb, hook, wrap(getattr(cb, hook)))
        for member in [cb, *getattr(cb, "callbacks", [])]:
            if isinstance(member, lightning_perf.SectionProfiler):
                # (torch's step hooks under manual optimization: the attributes are read when they are installed)
                for mark in ("_batch_transfer", "_fetch_started", "_fetch_stopped", "_optimizer_step_starts",
                             "_optimizer_step_ends"):
                    if hasattr(member, mark):
                        setattr(member, mark, wrap(getattr(member, mark)))


def time_hooks(callbacks: List[Callback], spent: List[float]) -> None:
    """Wraps the step path of each callback (:func:`wrap_step_path`) to add the seconds spent inside it to
    ``spent[0]`` and count the calls in ``spent[1]`` (each call's share of the clock reads themselves is taken off by
    ``hook_cost``)."""

    def add(seconds: float) -> None:
        spent[0] += seconds
        spent[1] += 1

    wrap_step_path(callbacks, lambda fn: timed(fn, add))


def clock_bias_s(calls: int = 100_000) -> float:
    """What one timed call adds by itself: the same wrapper around a function that does nothing (the call of an
    empty hook is in the dispatch cost). Measured once per process."""
    times: List[float] = []
    empty = timed(lambda *a: None, times.append)
    for _ in range(calls):
        empty(None, None, None, None, 0)
    return statistics.median(times)


def profile_hooks(name: str, steps: int, root: str, top: int = 25) -> None:
    """cProfile of what one callback does inside its step hooks (and nothing else), printed by own time."""
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    cb = getattr(lightning_perf, name)()
    for hook in step_hooks(cb):

        def wrapped(*a, _f=getattr(cb, hook), **k):
            profiler.enable()
            try:
                return _f(*a, **k)
            finally:
                profiler.disable()

        setattr(cb, hook, wrapped)
    run([cb], steps=steps, skip=1, root=root)
    print(f"\n{name}: inside its step hooks over {steps} steps (cProfile, so times are inflated)")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def per_hook(names: List[str], steps: int, root: str) -> None:
    """Median and mean µs of each step hook of each named callback (or ``PerfSuite``, the four defaults in one), timed
    one call at a time in the loop itself: a few Python lines right after the step's torch work cost several times
    what they cost in a tight loop, and this is where the step path's time goes. SectionProfiler's marks outside
    the hooks too (its fetch's start and return, where iterations close and fold, its ``batch_to_device`` wrapper,
    where a due report is made), and each line's µs a step (its calls' sum over the steps)."""
    LOGGER["on"] = False
    bias = clock_bias_s()
    for name in names:
        cb = lightning_perf.PerfSuite() if name == "PerfSuite" else getattr(lightning_perf, name)()
        calls: Dict[str, List[float]] = {hook: [] for hook in step_hooks(cb)}
        for hook, times in calls.items():
            setattr(cb, hook, timed(getattr(cb, hook), times.append))
        for child in getattr(cb, "callbacks", [cb]):
            if isinstance(child, lightning_perf.SectionProfiler):  # (bound at its setup: wrapped before it)
                for mark in ("_fetch_started", "_fetch_stopped", "_batch_transfer", "_report_window",
                             *(("_optimizer_step_starts", "_optimizer_step_ends") if DEVICE["manual"] else ())):
                    times = calls[f"SectionProfiler.{mark}"] = []
                    setattr(child, mark, timed(getattr(child, mark), times.append))
        run([cb], steps=steps, skip=1, root=root)
        loop = (("the CPU loop" + (" (simulated device)" if DEVICE["simulated"] else "")) if DEVICE["kind"] == "cpu"
                else f"the {'host' if DEVICE['light'] else 'GPU'}-bound CUDA loop")
        print(f"\n{name}: µs per call inside each step hook, {steps} steps on {loop}, logger=False (less"
              f" {1e6 * bias:.2f} µs of the timing wrapper)")
        for hook, times in calls.items():
            if len(times) >= steps // 2 or hook.endswith("_report_window"):
                print(f"  {hook:<36}{len(times):>7} calls   median {1e6 * (statistics.median(times) - bias):7.2f}"
                      f"   mean {1e6 * (statistics.mean(times) - bias):7.2f}"
                      f"   µs a step {1e6 * (sum(times) - bias * len(times)) / steps:6.2f}")
        if any(hook.startswith("SectionProfiler.") for hook in calls):
            print("  (a report is made inside the batch_to_device wrapper: its line is part of that one's)")


def hook_cost(make: Callable[[], List[Callback]], steps: int, rounds: int, root: str) -> float:
    """Median µs per step spent inside the given callbacks' step hooks and SectionProfiler's mark in the strategy's
    ``batch_to_device`` (where its iterations close, with the periodic fold and report): a direct measure, free of
    run-to-run noise, less what the timing wrapper's own clock reads add to each call."""
    bias = clock_bias_s()
    costs = []
    for _ in range(rounds):
        spent = [0.0, 0]
        callbacks = make()
        time_hooks(callbacks, spent)
        run(callbacks, steps=steps, skip=1, root=root)
        costs.append(1e6 * max(0.0, spent[0] - bias * spent[1]) / steps)
    return statistics.median(costs)


class _TimeTransfer(Callback):
    """Listed after SectionProfiler: times every call of the strategy's ``batch_to_device``, every other one through
    the profiler's wrapper and the rest straight to the strategy's own method, in one run (so both see the same
    machine, caches and batches)."""

    def __init__(self) -> None:
        self.marked: List[float] = []
        self.plain: List[float] = []

    def setup(self, trainer, pl_module, stage):
        strategy = trainer.strategy
        wrapped, plain = strategy.batch_to_device, type(strategy).batch_to_device.__get__(strategy)
        clock, calls = time.perf_counter, [0]

        def alternate(*a: Any, **k: Any) -> Any:
            calls[0] += 1
            fn, times = (wrapped, self.marked) if calls[0] % 2 else (plain, self.plain)
            t = clock()
            try:
                return fn(*a, **k)
            finally:
                times.append(clock() - t)

        self.saved, strategy.batch_to_device = wrapped, alternate

    def on_train_end(self, trainer, pl_module):
        trainer.strategy.batch_to_device = self.saved  # off before the profiler's teardown, as in a real fit


def transfer_boundary_us(steps: int, rounds: int, root: str) -> float:
    """What SectionProfiler's ``transfer`` section adds to each batch: its wrapper around the strategy's
    ``batch_to_device`` and its section switch. Per run, the median time of a transfer through the wrapper less the
    median of one straight to the strategy's method, batches alternating; the median over runs."""
    costs = []
    for _ in range(rounds):
        probe = _TimeTransfer()
        run([lightning_perf.SectionProfiler(print_reports=False), probe], steps=steps, skip=1, root=root)
        costs.append(1e6 * (statistics.median(probe.marked) - statistics.median(probe.plain)))
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


#: The loop: "cpu", a ~1 ms CPU step; "cuda", a ~10 ms GPU-bound step (4096 x 4096 layers on a 3072 batch), or
#: with light=True a host-bound CUDA step (256 x 256 layers), where the time inside a hook is its host cost.
#: "simulated": on the CPU loop, SectionProfiler and IterationTimer get a device clock of SimulatedEvents.
DEVICE = {"kind": "cpu", "light": False, "simulated": False, "manual": False}


def _host_event() -> type:
    """tests/helpers.py's HostEvent, from this benchmark's own checkout (it reads the measured package's clock)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("lightning_perf_test_helpers", os.path.join(CHECKOUT, "tests",
                                                                                                "helpers.py"))
    helpers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helpers)
    return helpers.HostEvent


class SimulatedEvent(_host_event()):
    """A CUDA event stand-in (``--simulated-device``): the tests' host-clock event, which also counts the records of
    the process (``records``) and spins ``price_s`` after each (``--event-us``)."""

    __slots__ = ()
    records = 0
    #: ``--event-us``: seconds each record spins first, the host's price of a real one
    price_s = 0.0

    def record(self, *args: Any) -> None:
        SimulatedEvent.records += 1
        super().record()  # (the measured package's ``now``: perf_counter)
        if SimulatedEvent.price_s:
            end = self.t + SimulatedEvent.price_s
            while time.perf_counter() < end:
                pass


class SimulatedClocks(Callback):
    """Listed after ``callbacks``: at train start, each SectionProfiler and IterationTimer among them (a PerfSuite's
    too) gets a device clock of SimulatedEvents, as its on_train_start gives one on CUDA."""

    def __init__(self, callbacks: List[Callback]) -> None:
        kinds = (lightning_perf.SectionProfiler, lightning_perf.IterationTimer)
        self.targets = [cb for member in callbacks for cb in [member, *getattr(member, "callbacks", [])]
                        if isinstance(cb, kinds)]

    def on_train_start(self, trainer, pl_module):
        from lightning_perf.measure.timing.clock import DeviceIntervalClock

        for cb in self.targets:
            clock = DeviceIntervalClock(event_factory=SimulatedEvent)
            if hasattr(cb, "_use_clock"):  # SectionProfiler: its device marks are decided with the clock
                cb._use_clock(clock)
                continue
            cb._clock = clock
            if isinstance(cb, lightning_perf.SectionProfiler):  # a checkout before SectionProfiler taped on CUDA
                cb._taping = False
                if hasattr(cb, "_marks_near"):
                    cb._marks_near = cb._near_timed()


def run(callbacks: List[Callback], steps: int, skip: int, profiler: Any = None, root: str = ".") -> float:
    clock = StepClock(skip)
    fit([clock, *callbacks], steps, profiler, root)
    return clock.us_per_step()


def fit(callbacks: List[Callback], steps: int, profiler: Any = None, root: str = ".") -> None:
    """The benchmark's loop: ``steps`` training steps of ``Busy`` (or its CUDA variants) with these callbacks."""
    if DEVICE["simulated"]:
        callbacks = [*callbacks, SimulatedClocks(callbacks)]
    if DEVICE["kind"] == "cuda":
        batch, width = (256, 256) if DEVICE["light"] else (3072, 4096)
        loader: Any = GpuBatches(steps, batch=batch, width=width)
        model = Busy(width=width)
    else:
        x = torch.randn(steps * 16, 384)
        loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=16)
        model = ManualBusy() if DEVICE["manual"] else Busy()
    trainer = Trainer(
        # (under --manual the global step counts both optimizers' steps: ``steps`` batches make twice as many)
        accelerator="gpu" if DEVICE["kind"] == "cuda" else "cpu", devices=1,
        max_steps=2 * steps if DEVICE["manual"] else steps,
        logger=TensorBoardLogger(root, name="bench") if LOGGER["on"] else False, default_root_dir=root,
        callbacks=callbacks, profiler=profiler, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, log_every_n_steps=50,
    )
    trainer.fit(model, loader)


class _BlocksHead(Callback):
    """First in the Trainer's list: notes the instance attributes of the strategy and the profiler before the measured
    callbacks' setup, so that :class:`Blocks` knows what they put there (SectionProfiler's ``batch_to_device`` wrapper,
    its watch on the profiler's ``start``)."""

    def __init__(self, blocks: "Blocks") -> None:
        self.blocks = blocks

    def setup(self, trainer, pl_module, stage):
        self.blocks.before = [(obj, set(vars(obj))) for obj in (trainer.strategy, trainer.profiler)]


class Blocks(Callback):
    """A paired A/B inside one fit: the measured callbacks take part in alternate blocks of ``block`` steps and are out
    of the Trainer's list in the others, together with the instance attributes they put on the strategy and the
    profiler at setup and train start. A drift of the machine's speed (one run's median step moved by tens of
    percent from one run to the next here) then falls alike on the steps with and without them.

    Last in the Trainer's list. At a batch start, once every other callback has run its own (EvalNoGradGuard has
    taken its forward hook out of torch's dict), it switches at a block's first step; at a batch end, after every
    other callback's, it reads the probes' clock (``clock_now``). A step runs from one read to the next, all of it in one
    state except for a block's first step (its fetch, transfer and batch start ran in the other): that step is left
    out of both. The measured callbacks count only the steps they see (``block`` an on block, its first included), so
    their periodic work (folds, reports, every 50 of their steps) moves through the positions of a block only where
    ``block`` is prime to its period (the default 7 is to 50); Lightning's own log steps (every 50 global steps) fall
    in both states alike for the same reason. At the last step the callbacks are given back for the end of
    training."""

    def __init__(self, callbacks: List[Callback], block: int, skip: int) -> None:
        self.measured, self.block, self.skip = list(callbacks), block, skip
        self.before: List[Any] = []
        self.added: List[Any] = []  # (object, attribute name): what the measured callbacks set up
        self.taken: List[Any] = []  # (object, name, value) taken out for the current off block
        self.steps, self.on, self.first, self.last = 0, True, False, None
        self.marks: List[Any] = []  # (state, block, mark at the step's start, mark at its end): read after the run

    def setup(self, trainer, pl_module, stage):
        self.added = [(obj, name) for obj, names in self.before for name in set(vars(obj)) - names]
        self.with_list = list(trainer.callbacks)
        self.without_list = [cb for cb in self.with_list if not any(cb is m for m in self.measured)]

    def on_train_start(self, trainer, pl_module):
        # and what they put there at the train start (EvalNoGradGuard's mark of the step's end on the strategy)
        self.added = [(obj, name) for obj, names in self.before for name in set(vars(obj)) - names]

    def _set(self, trainer, on: bool) -> None:
        # rebound, not changed in place: Lightning's loop over the old list, at this callback (the last), ends here
        trainer.callbacks = list(self.with_list if on else self.without_list)
        if on:
            for obj, name, value in self.taken:
                setattr(obj, name, value)
            self.taken = []
        else:
            self.taken = [(obj, name, vars(obj)[name]) for obj, name in self.added if name in vars(obj)]
            for obj, name, _ in self.taken:
                delattr(obj, name)
        self.on = on

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.steps += 1
        index = self.steps - self.skip - 1
        self.first = index >= 0 and index % self.block == 0
        if self.first and (index // self.block % 2 == 1) != self.on:  # even blocks without, odd ones with
            self._set(trainer, not self.on)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        t = clock_now()
        if self.last is not None and self.steps > self.skip and not self.first:
            self.marks.append((self.on, (self.steps - self.skip - 1) // self.block, self.last, t))
        self.last = t
        if self.steps == trainer.max_steps and not self.on:
            self._set(trainer, True)  # the end of training (epoch end, train end, teardown) with the callbacks

    def blocks(self) -> Dict[bool, Dict[int, List[float]]]:
        """State (with the callbacks or not) -> block -> its steps' seconds."""
        out: Dict[bool, Dict[int, List[float]]] = {True: {}, False: {}}
        for on, block, start, end in self.marks:
            out[on].setdefault(block, []).append(seconds_between(start, end))
        return out


def paired_overhead(blocks: "Blocks", resamples: int = 1000, seed: int = 0) -> Dict[str, Any]:
    """Mean and median step (µs) with and without the callbacks, their differences, and 95% CIs of the differences
    from a bootstrap over pairs of adjacent blocks (a block without, the next one with)."""
    import random

    steps = blocks.blocks()
    without, with_ = steps[False], steps[True]
    pairs = [(without[b], with_[b + 1]) for b in sorted(without) if b + 1 in with_]
    if not pairs:
        raise ValueError("no pair of blocks: run more steps or use smaller blocks")

    def figures(chosen: List[Any]) -> tuple:
        off = [x for pair in chosen for x in pair[0]]
        on = [x for pair in chosen for x in pair[1]]
        return (1e6 * (statistics.fmean(on) - statistics.fmean(off)),
                1e6 * (statistics.median(on) - statistics.median(off)), off, on)

    mean, median, off, on = figures(pairs)
    rng = random.Random(seed)
    draws = [figures(rng.choices(pairs, k=len(pairs)))[:2] for _ in range(resamples)]
    ci = []
    for i in (0, 1):
        values = sorted(d[i] for d in draws)
        ci.append((values[int(0.025 * resamples)], values[int(0.975 * resamples) - 1]))
    return {"mean": mean, "median": median, "mean_ci": ci[0], "median_ci": ci[1], "pairs": len(pairs),
            "without_mean": 1e6 * statistics.fmean(off), "without_median": 1e6 * statistics.median(off),
            "steps": (len(off), len(on))}


def run_paired(callbacks: List[Callback], steps: int, skip: int, block: int, profiler: Any = None,
               root: str = ".") -> Dict[str, Any]:
    """One fit of ``steps`` with ``callbacks`` in and out in alternate blocks (:class:`Blocks`): its figures."""
    blocks = Blocks(callbacks, block, skip)
    fit([_BlocksHead(blocks), *callbacks, blocks], steps, profiler, root)
    return paired_overhead(blocks)


def paired_ab(configs: Dict[str, Callable[[], Dict[str, Any]]], loops: List[tuple], args: argparse.Namespace,
              root: str) -> Dict[str, Dict[str, Dict[str, Any]]]:
    """The paired A/B of every configuration but bare (the steps without callbacks are its bare), on each loop;
    a configuration with a profiler runs without it, and says so in its name."""
    results: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for loop, light in loops:
        DEVICE["light"] = light
        rows = results[loop] = {}
        run(steps=args.steps // 4, skip=1, root=root, callbacks=[])  # warm the process up before measuring
        for name, make in configs.items():
            if name == "bare":
                continue
            config = make()
            if config.get("profiler") is not None:
                name = f"{name.split(' (')[0]} ({len(config['callbacks'])}, no profiler)"
            rows[name] = run_paired(config["callbacks"], args.paired_steps, skip=args.paired_steps // 10,
                                    block=args.block, root=root)
            print(f"{loop} paired: {name} done", file=sys.stderr)
    return results


def print_paired(results: Dict[str, Dict[str, Dict[str, Any]]], args: argparse.Namespace) -> None:
    unit = "wall" if args.device == "cuda" else "thread CPU"
    for loop, rows in results.items():
        print(f"\nPaired A/B on the {loop} loop: one fit of {args.paired_steps} steps per configuration, its"
              f" callbacks in and out of the Trainer in alternate blocks of {args.block} steps (the first step of"
              f" each block left out; {unit} µs; 95% CI from a bootstrap over pairs of adjacent blocks):")
        print(f"{'configuration':<30}{'step without':>13}{'mean +':>9}{'[95% CI]':>18}{'% step':>8}"
              f"{'median +':>10}{'[95% CI]':>18}{'pairs':>7}")
        for name, r in rows.items():
            print(f"{name:<30}{r['without_mean']:>13.1f}{r['mean']:>9.1f}  [{r['mean_ci'][0]:6.1f}, {r['mean_ci'][1]:6.1f}]"
                  f"{100 * r['mean'] / r['without_mean']:>7.1f}%{r['median']:>10.1f}"
                  f"  [{r['median_ci'][0]:6.1f}, {r['median_ci'][1]:6.1f}]{r['pairs']:>7}")
        print("Without the callbacks a step is the bare loop (but for what stays installed: IterationTimer's gc"
              " callback, SectionProfiler's section sink); with them, everything the configuration adds: Lightning's"
              " dispatch of their hooks, the hooks, SectionProfiler's transfer wrapper. Lightning's monitors are its"
              " ThroughputMonitor, DeviceStatsMonitor and Timer (with a 12-hour limit, checked every step).")


def print_ab(ab: Dict[str, Dict[str, List["StepTimes"]]], args: argparse.Namespace) -> None:
    """The A/B tables: per loop, each configuration's mean and median step and its overhead over bare."""
    unit = "wall" if args.device == "cuda" else "thread CPU"
    for loop, results in ab.items():
        bare_runs = results["bare"]
        step = statistics.median(b.mean for b in bare_runs)
        where = f" on {torch.cuda.get_device_name(0)}" if args.device == "cuda" else ""
        print(f"\nA/B on a {loop} loop of {step / 1000:.2f} ms a step{where}, {args.rounds} interleaved rounds of"
              f" {args.steps} steps ({unit} µs; overhead = median over rounds of the difference from bare in the same"
              " round, [min, max] over rounds):")
        print(f"{'configuration':<30}{'mean step':>10}{'overhead':>10}{'[min, max]':>17}{'% step':>8}"
              f"{'median step':>13}{'overhead':>10}{'[min, max]':>17}{'process CPU':>13}")
        for name, values in results.items():
            row = f"{name:<30}"
            for field in ("mean", "median"):
                diffs = [getattr(v, field) - getattr(b, field) for v, b in zip(values, bare_runs)]
                mid = statistics.median(diffs)
                row += (f"{statistics.median(getattr(v, field) for v in values):>{10 if field == 'mean' else 13}.1f}"
                        f"{mid:>10.1f}  [{min(diffs):6.1f}, {max(diffs):6.1f}]")
                if field == "mean":
                    row += f"{100 * mid / step:>7.1f}%"
            proc = statistics.median(v.process - b.process for v, b in zip(values, bare_runs))
            print(row + f"{proc:>13.1f}")
        print("'process CPU': the overhead in CPU time of every thread of the process (a logger's writer thread"
              " included), mean per step.")


def _suite_of(name: str) -> Callable[[], List[Callback]]:
    """The callbacks of one in-hook figure: one callback with defaults, or ``PerfSuite``: the five in one."""
    if name == "PerfSuite":
        return lambda: [lightning_perf.PerfSuite(suite())]
    return lambda: [getattr(lightning_perf, name)()]


def hooks_only(args: argparse.Namespace) -> int:
    """``--hooks-only``: each named callback's in-hook µs a step (as in the benchmark's table; on CUDA on the light,
    host-bound step). With ``--against``, this checkout's and the other's alternate, one run of each a round, each
    run a fresh process of this script (the two versions cannot share one), and the table gives both per round and
    their medians; a run that fails stops it with that run's own error."""
    names = args.hooks_only
    if args.against is None:
        DEVICE["light"] = True
        with tempfile.TemporaryDirectory() as root:
            run(steps=args.steps // 4, skip=1, root=root, callbacks=[])  # warm the process up before measuring
            figures = {name: hook_cost(_suite_of(name), args.steps, HOOK_ROUNDS, root) for name in names}
        for name, value in figures.items():
            print(f"in hooks {name}: {value:.2f} µs/step ({lightning_perf.__file__})")
        if DEVICE["simulated"]:
            print(f"simulated device: {SimulatedEvent.records} events recorded"
                  + (f", each priced {SimulatedEvent.price_s * 1e6:g} µs" if SimulatedEvent.price_s else ""))
        return 0
    import re
    import subprocess

    here = CHECKOUT
    checkouts = {"this checkout": here, "--against": os.path.abspath(args.against)}
    figures: Dict[str, Dict[str, List[float]]] = {label: {name: [] for name in names} for label in checkouts}
    for r in range(args.rounds):
        order = list(checkouts)[::-1] if r % 2 == 0 else list(checkouts)  # the other's first: fails fast
        for label in order:
            env = dict(os.environ, **{SOURCE_ENV: checkouts[label]})
            simulated = ["--simulated-device"] if DEVICE["simulated"] else []
            if SimulatedEvent.price_s:
                simulated += ["--event-us", repr(SimulatedEvent.price_s * 1e6)]
            simulated += ["--manual"] if DEVICE["manual"] else []
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--steps", str(args.steps), "--device",
                                   args.device, *simulated, "--hooks-only", *names], env=env, capture_output=True,
                                  text=True)
            found = dict(re.findall(r"^in hooks (\S+): ([0-9.]+) µs/step", proc.stdout, re.M))
            if proc.returncode != 0 or set(found) != set(names):
                tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
                sys.exit(f"--hooks-only {' '.join(names)} with the lightning_perf of {checkouts[label]} ({label})"
                         f" failed (exit code {proc.returncode}) in round {r + 1} of {args.rounds}; its output ends:\n{tail}")
            for name, value in found.items():
                figures[label][name].append(float(value))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"in hooks, µs a step, {args.rounds} alternating round{'s' if args.rounds > 1 else ''} of {HOOK_ROUNDS} runs"
          f" of {args.steps} steps each{', simulated device' if DEVICE['simulated'] else ''}"
          f"{f' ({SimulatedEvent.price_s * 1e6:g} µs a record)' if SimulatedEvent.price_s else ''}"
          f" (this checkout: {here}; --against: {checkouts['--against']})")
    for name in names:
        for label in checkouts:
            values = figures[label][name]
            print(f"  {name:<18}{label:<15} median {statistics.median(values):6.1f}   rounds"
                  f" {' '.join(f'{v:.1f}' for v in values)}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=None, help="steps per run (600 on CPU, 300 on CUDA)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (7 on CPU, 8 on CUDA)")
    parser.add_argument("--quick", action="store_true", help="200 steps, 2 rounds")
    parser.add_argument("--ab-only", action="store_true",
                        help="only the A/B table (no in-hook, dispatch, validation and TensorBoard figures)")
    parser.add_argument("--configs", nargs="+", metavar="NAME",
                        help="only the A/B configurations whose names contain one of these (bare always runs)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: a ~1 ms CPU step in thread CPU time; cuda: a ~10 ms GPU step in wall time")
    parser.add_argument("--per-hook", metavar="CALLBACK", choices=lightning_perf.CALLBACKS + ("PerfSuite",), nargs="+",
                        help="instead of the benchmark: median and mean µs of each step hook (and SectionProfiler's"
                             " marks), timed call by call in the loop")
    parser.add_argument("--profile", metavar="CALLBACK", choices=lightning_perf.CALLBACKS, nargs="+",
                        help="instead of the benchmark: a cProfile of what these callbacks do inside their step hooks"
                             " (on CUDA, on the light host-bound step)")
    parser.add_argument("--hooks-only", metavar="CALLBACK", choices=lightning_perf.CALLBACKS + ("PerfSuite",),
                        nargs="+", help="instead of the benchmark: each named callback's µs a step in its hooks (the"
                                        " benchmark's in-hook figure; PerfSuite: the five in one)")
    parser.add_argument("--against", metavar="CHECKOUT",
                        help="with --hooks-only: the same figures of the lightning_perf in CHECKOUT (another clone or"
                             " git worktree), in runs alternating with this checkout's, --rounds of each (without"
                             " --against, --hooks-only makes one run): where the machine's speed drifts, only"
                             " alternating runs compare two versions")
    parser.add_argument("--simulated-device", action="store_true",
                        help="with --hooks-only or --per-hook on the CPU loop: SectionProfiler and IterationTimer"
                             " run their CUDA path on a device clock whose events read the host clock")
    parser.add_argument("--event-us", type=float, default=None, metavar="US",
                        help="with --simulated-device: each event record spins US µs first, the host's price of a"
                             " real one (3.04 on an H100 host, benchmarks/cuda_calls.py)")
    parser.add_argument("--paired", action="store_true",
                        help="only the paired A/B: one fit per configuration, its callbacks in and out in alternate"
                             " blocks of steps (the full benchmark prints it after the A/B)")
    parser.add_argument("--paired-steps", type=int, default=None,
                        help="steps of each paired fit (4000 on CPU, 2000 on CUDA; 400 with --quick)")
    parser.add_argument("--spin-us", type=float, nargs="+", metavar="US", default=[],
                        help="add configurations that spin US µs a step (at the batch end, or over --spin-hooks):"
                             " what a hook of known cost reads in the A/B (a calibration; with --configs, name them"
                             " 'spin')")
    parser.add_argument("--spin-hooks", type=int, nargs="+", metavar="N", default=[1],
                        help="with --spin-us: spread each spin over N of the six step hooks (US / N µs in each;"
                             " default 1, the batch end): '--spin-hooks 1 6' adds both, so the A/B shows what"
                             " the places cost beyond the work")
    parser.add_argument("--block", type=int, default=7,
                        help="steps per block of the paired A/B (default 7: prime to the callbacks' and Lightning's"
                             " 50-step log cadences, so their periodic work falls on every step of a block and in"
                             " both states alike)")
    parser.add_argument("--manual", action="store_true",
                        help="with --hooks-only or --per-hook on the CPU loop: the step under manual optimization"
                             " with two optimizers (one manual_backward, two opt.step() a batch)")
    args = parser.parse_args(argv)
    if args.manual and not ((args.hooks_only or args.per_hook) and args.device == "cpu"):
        parser.error("--manual runs with --hooks-only or --per-hook on the CPU loop: name the callbacks, leave out"
                     " --device cuda")
    DEVICE["manual"] = args.manual
    if args.against is not None and not args.hooks_only:
        parser.error("--against compares --hooks-only figures: name the callbacks with --hooks-only")
    if args.against is not None and not os.path.isdir(args.against):
        parser.error(f"--against {args.against!r} is not a directory: expected a checkout of lightning_perf")
    if args.against is not None and not os.path.isfile(os.path.join(args.against, "lightning_perf", "__init__.py")):
        parser.error(f"--against {args.against!r}: no lightning_perf package (lightning_perf/__init__.py) in that"
                     " directory; expected a checkout of lightning_perf")
    if args.simulated_device and not (args.hooks_only or args.per_hook):
        parser.error("--simulated-device runs with --hooks-only or --per-hook (in-hook figures): name the callbacks")
    if args.simulated_device and args.device != "cpu":
        parser.error("--simulated-device stands in for a GPU on the CPU loop: leave out --device cuda")
    if args.event_us is not None and not args.simulated_device:
        parser.error("--event-us prices the simulated device's event records: give --simulated-device too")
    if args.event_us is not None and not (0.0 <= args.event_us <= 1000.0):
        parser.error(f"--event-us must be between 0 and 1000 µs, got {args.event_us}")
    DEVICE["simulated"] = args.simulated_device
    SimulatedEvent.price_s = (args.event_us or 0.0) / 1e6
    default_steps, default_rounds = (300, 8) if args.device == "cuda" else (600, 7)
    if args.quick:
        default_steps, default_rounds = 200, 2
    args.steps = default_steps if args.steps is None else args.steps
    args.rounds = default_rounds if args.rounds is None else args.rounds
    if args.steps < 10 or args.rounds < 1:
        parser.error(f"--steps must be >= 10 and --rounds >= 1, got {args.steps} and {args.rounds}")
    other_mode = args.ab_only or args.hooks_only or args.per_hook or args.profile  # modes without the paired A/B
    if args.paired and other_mode:
        parser.error("--paired runs the paired A/B alone: leave out --ab-only, --hooks-only, --per-hook and --profile")
    if any(not 0 < us <= 100_000 for us in args.spin_us):
        parser.error(f"--spin-us must be > 0 and <= 100000 (µs), got {args.spin_us}")
    if len({spin_name(us) for us in args.spin_us}) < len(args.spin_us):
        parser.error(f"--spin-us names one value twice: {args.spin_us}")
    if any(not 1 <= n <= len(SPIN_HOOKS) for n in args.spin_hooks):
        parser.error(f"--spin-hooks must be between 1 and {len(SPIN_HOOKS)} (the step hooks), got {args.spin_hooks}")
    if len(set(args.spin_hooks)) < len(args.spin_hooks):
        parser.error(f"--spin-hooks names one value twice: {args.spin_hooks}")
    if args.spin_hooks != [1] and not args.spin_us:
        parser.error("--spin-hooks spreads the spins of --spin-us: give --spin-us too")
    if args.spin_us and (args.hooks_only or args.per_hook or args.profile):
        parser.error("--spin-us adds configurations to the A/B: leave out --hooks-only, --per-hook and --profile")
    if args.spin_us and args.configs and not any(c in spin_name(us, n) for us in args.spin_us
                                                 for n in args.spin_hooks for c in args.configs):
        parser.error(f"--spin-us: --configs {' '.join(args.configs)} leaves out the spin configurations; add"
                     " 'spin' to --configs")
    if args.paired_steps is None:
        args.paired_steps = 400 if args.quick else 2000 if args.device == "cuda" else 4000
    paired_runs = not other_mode
    if paired_runs and args.block < 2:
        parser.error(f"--block must be >= 2 (a block's first step is left out), got {args.block}")
    elif paired_runs and args.paired_steps < 4 * args.block + 10:
        parser.error(f"--paired-steps must be >= 4 * --block + 10 (two pairs of blocks after the warm-up), got"
                     f" {args.paired_steps} with --block {args.block}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device here")
        DEVICE["kind"] = "cuda"
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    import logging

    # Lightning's INFO lines, SectionProfiler's periodic tables among them, are built and logged as in a user's run
    # (INFO is Lightning's default) and written to the null device: what they cost is in the figures, and this
    # script's own tables stay readable
    for handler in logging.getLogger("lightning.pytorch").handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(open(os.devnull, "w"))  # noqa: SIM115 - for the process's life
    if args.hooks_only:
        return hooks_only(args)
    if args.per_hook:
        DEVICE["light"] = True  # on CUDA, the host-bound step: on the GPU-bound one, launch waits land in hooks
        with tempfile.TemporaryDirectory() as root:
            run(steps=args.steps // 4, skip=1, root=root, callbacks=[])
            per_hook(args.per_hook, args.steps, root)
        return 0
    if args.profile:
        DEVICE["light"] = True
        with tempfile.TemporaryDirectory() as root:
            run(steps=args.steps // 4, skip=1, root=root, callbacks=[])
            for name in args.profile:
                profile_hooks(name, args.steps, root)
        return 0
    n = len(suite())
    configs: Dict[str, Callable[[], Dict[str, Any]]] = {
        "bare": lambda: {"callbacks": []},
        "1 no-op callback": lambda: {"callbacks": [Noop()]},
        f"{n} no-op callbacks": lambda: {"callbacks": [Noop() for _ in range(n)]},
        "Lightning monitors (2)": lambda: {"callbacks": lightning_monitors(timer=False)},
        "Lightning monitors (3)": lambda: {"callbacks": lightning_monitors(timer=True)},
        f"lightning_perf suite ({n})": lambda: {"callbacks": suite()},
        f"PerfSuite ({n} in one)": lambda: {"callbacks": [lightning_perf.PerfSuite(suite())]},
    }
    for cb in suite():
        name = type(cb).__name__
        configs[f"  {name} alone"] = lambda name=name: {"callbacks": [getattr(lightning_perf, name)()]}
    for us in args.spin_us:
        for hooks in args.spin_hooks:
            configs[spin_name(us, hooks)] = lambda us=us, hooks=hooks: {"callbacks": [Spin(us, hooks)]}
    if args.configs:
        configs = {k: v for k, v in configs.items() if k == "bare" or any(c in k for c in args.configs)}
    # on CUDA the A/B runs twice: a host-bound step (small layers: every host µs is a wall µs) and a GPU-bound one
    loops = [("host-bound", True), ("GPU-bound", False)] if args.device == "cuda" else [("CPU", False)]
    if args.paired:
        with tempfile.TemporaryDirectory() as root:
            print_paired(paired_ab(configs, loops, args, root), args)
        return 0
    ab: Dict[str, Dict[str, List[StepTimes]]] = {}
    with tempfile.TemporaryDirectory() as root:
        for loop, light in loops:
            DEVICE["light"] = light
            results: Dict[str, List[StepTimes]] = {k: [] for k in configs}
            ab[loop] = results
            names = list(configs)
            run(steps=args.steps // 4, skip=1, root=root, callbacks=[])  # warm the process up before measuring
            for r in range(args.rounds):
                # rotate the order each round, so that no configuration always runs first or last
                for name in names[r % len(names):] + names[: r % len(names)]:
                    results[name].append(run(steps=args.steps, skip=args.steps // 5, root=root, **configs[name]()))
                print(f"{loop} round {r + 1}/{args.rounds} done", file=sys.stderr)
        if args.ab_only:
            print_ab(ab, args)
            return 0
        # on CUDA the host-bound loop only: there every host µs is a wall µs; the GPU-bound step's share is the
        # interleaved A/B's (its fits of ~10 ms steps would add minutes)
        paired = paired_ab(configs, [loop for loop in loops if loop[0] != "GPU-bound"], args, root)
        DEVICE["light"] = True  # host cost on CUDA: a step that never fills the launch queue (see the docstring)
        if args.device == "cuda":
            run(steps=args.steps // 4, skip=1, root=root, callbacks=[])
        inside = hook_cost(suite, args.steps, HOOK_ROUNDS, root)
        inside_one = hook_cost(_suite_of("PerfSuite"), args.steps, HOOK_ROUNDS, root)
        inside_each = {name: hook_cost(_suite_of(name), args.steps, HOOK_ROUNDS, root)
                       for name in lightning_perf.CALLBACKS}
        LOGGER["on"] = False  # the same hooks without a logger: what writing the logged scalars costs
        unlogged_one = hook_cost(_suite_of("PerfSuite"), args.steps, HOOK_ROUNDS, root)
        unlogged_each = {name: hook_cost(_suite_of(name), args.steps, HOOK_ROUNDS, root) for name in inside_each}
        transfer = transfer_boundary_us(args.steps, HOOK_ROUNDS, root)
        LOGGER["on"] = True
        per_step = dispatch_counts(args.steps // 2, root)
        validation = validation_cost(2 * args.steps, 2 * args.rounds, root) if args.device == "cpu" else None
        tensorboard = tensorboard_cost(root)
    call_us = dispatch_cost_us()
    calls = sum(per_step.values())
    dispatch = calls * call_us
    print_ab(ab, args)
    print_paired(paired, args)
    print(f"\nLightning calls {calls:.0f} callback hooks per training step on every callback"
          f" ({', '.join(f'{k} {v:g}' for k, v in sorted(per_step.items()))}),")
    print(f"each {call_us:.2f} µs on a callback that does nothing: {dispatch:.1f} µs per callback per step.\n")
    where = " (host cost, on a host-bound CUDA step)" if args.device == "cuda" else ""
    print(f"{'per callback':<26}{'dispatch':>10}{'in hooks':>10}{'total':>10}{'no logger':>11}   µs/step{where}")
    for name, value in inside_each.items():
        print(f"  {name:<24}{dispatch:>10.1f}{value:>10.1f}{dispatch + value:>10.1f}"
              f"{dispatch + unlogged_each[name]:>11.1f}")
    separate = n * dispatch + inside
    together = dispatch + inside_one
    print(f"  {'suite, separate':<24}{n * dispatch:>10.1f}{inside:>10.1f}{separate:>10.1f}")
    print(f"  {'suite in one PerfSuite':<24}{dispatch:>10.1f}{inside_one:>10.1f}{together:>10.1f}"
          f"{dispatch + unlogged_one:>11.1f}")
    print("'no logger': the same hooks with Trainer(logger=False); the difference is the logger writing the scalars"
          " the callbacks log (TensorBoard: one event per scalar, see docs/perf_suite.md).")
    print(f"SectionProfiler's transfer boundary (its batch_to_device wrapper and one section switch, the median"
          f" batch; 'in hooks' above holds its mean, with the closes, folds and reports there): {transfer:.2f} µs per"
          f" batch{where}, goal <= 2 µs")
    for label, total in (("separate", separate), ("PerfSuite", together)):
        print(f"suite ({label}): {100 * total / 10_000:.2f}% of a 10 ms step, {100 * total / 1_000:.1f}% of a 1 ms step")
    if validation is not None:
        base, guarded_runs = validation["without"], validation["with EvalNoGradGuard"]
        ratios = [100.0 * (g - b) / b for g, b in zip(guarded_runs, base)]
        lo, hi = bootstrap_median_ci(ratios)
        print(f"validation under no_grad ({2 * args.steps} batches, {statistics.median(base):.0f} µs a batch without):"
              f" EvalNoGradGuard {statistics.median(ratios):+.2f}% (95% CI {lo:+.2f}% to {hi:+.2f}%), goal within 2%")
    (small_call, small_cpu), (big_call, big_cpu) = tensorboard[10], tensorboard[1000]
    print(f"TensorBoard, per logged scalar (bursts of {REPORT_SCALARS}, 10 ms of torch work apart): TensorBoardLogger(max_queue=10),"
          f" the default: {small_call:.1f} µs in log_metrics, {small_cpu:.1f} µs process CPU; max_queue=1000:"
          f" {big_call:.1f} and {big_cpu:.1f} µs ({small_call / big_call:.1f}x and {small_cpu / big_cpu:.1f}x less)")
    print("goal: the five callbacks in one PerfSuite <= 40 µs/step on the CPU loop (mean and median step), each"
          " callback <= 15 µs/step in its hooks; on CUDA <= 60 µs/step host-bound, < 0.1% of a GPU-bound step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
