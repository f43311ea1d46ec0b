"""A paired A/B of one per-step speed trick inside one fit: the trick on and off in alternate blocks of 7 steps.

``benchmarks/overhead.py --paired`` puts callbacks in and out of the Trainer; this keeps them in and switches one
trick of theirs, so both sides of the difference run in one process, on the same loop, interleaved: a drift of
the machine's speed (5 people on 2 cores) falls alike on both. The step is ``overhead.py``'s CPU loop (~1 ms,
torch on one thread, thread CPU time). The first step of each block is left out; 'on - off' is the mean and
median difference of a step with the trick and without it, with 95% CIs from a bootstrap over pairs of adjacent
blocks (``overhead.paired_overhead``). A trick that saves under 2 µs a step goes.

Tricks:

- ``suite-guard``: a checkout whose PerfSuite called a ``@guarded`` hook of its callbacks without that hook's own
  guard (its forwarder has one; up to 32bae39); off: through it.
- ``suite-key``: PerfSuite's ``state_key`` held on the instance (``HeldStateKey``), which Lightning reads at every
  hook call; off: built at each read, as a property.
- ``step-events``: a checkout whose SectionProfiler kept its step's switches in a list until the next event (up to
  61500f1: ``LIGHTNING_PERF_BENCH_SOURCE=<that checkout>``, as for ``overhead.py``); off: applied live.
- ``held-switches``: SectionProfiler's switches from a batch's return to its end held in the ledger's list and
  applied at the batch end (``SectionLedger.apply_held``); off: each applied at once, as where a device mark is due
  (the ledger given a marker that does nothing: ~9 calls of an empty function a step count against off).
- ``held-to-fold``: the held switches kept across iterations and applied in one loop at the fold (every 64
  iterations); off: applied by each batch end's switch, with the close's switch at once (a checkout whose ledger
  has that choice, ``defer``: 31a47ce, ``LIGHTNING_PERF_BENCH_SOURCE=<that checkout>``).

- ``suite-step-loop``: PerfSuite's six step hooks loop over their callbacks themselves (``PerfSuite._step_failed``
  only where one raised); off: each through ``PerfSuite._forward``, a frame and a dict lookup more, as before.

- ``step-frames``: the step path's own tests made before its calls (IterationTimer's batch size followed in its hook,
  SectionProfiler's close and between-batches work called only where due, the ledger's held switch appended where
  it is read); off: the methods of the checkout before (``--old CHECKOUT``, e.g. a worktree of f6235a7), in a
  PerfSuite.

- ``fold``: SectionProfiler's fold (``SectionLedger.fold``, at each window report and every 64 iterations) of the
  measured checkout; off: the ``fold`` of the ``--old`` checkout, in a PerfSuite. The fold by columns (measured: a
  checkout of e2d6425; ``--old``: one of d94eaad) saved ~2 µs an iteration in a loop of the ledger alone, not a step's
  time that 3 paired fits could tell (see docs/perf_suite.md, "Hooks").

    python benchmarks/toggle_ab.py suite-guard --steps 50000 --reps 3     # ~1 minute a rep on an idle core
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import warnings
from typing import Any, Callable, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402 - benchmarks/overhead.py, which puts the measured checkout on the path

import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402

import lightning_perf  # noqa: E402
from lightning_perf.callbacks.perf_suite import callback as perf_suite  # noqa: E402


class Toggle(overhead.Blocks):
    """``overhead.Blocks`` that keeps every callback in and calls ``on()`` or ``off()`` where a block starts."""

    def __init__(self, on: Callable[[], None], off: Callable[[], None], block: int, skip: int,
                 each_step: bool = False) -> None:
        super().__init__([], block, skip)
        self.turn_on, self.turn_off, self.each_step = on, off, each_step

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        pass  # (no callback leaves the Trainer)

    def _set(self, trainer: Any, on: bool) -> None:
        self.on = on
        (self.turn_on if on else self.turn_off)()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        if self.each_step and not self.on:
            self.turn_off()  # (a trick decided at each batch start, after the measured callback's hook)


def trick(name: str) -> Tuple[List[Callback], Callable[[], None], Callable[[], None], bool]:
    """The callbacks of the fit, and how to turn the trick on and off."""
    if name == "held-switches":
        profiler = lightning_perf.SectionProfiler()

        def on() -> None:
            profiler._ledger.marker = None
            profiler._held = profiler._ledger.held

        def off() -> None:
            profiler._ledger.marker = lambda *marks: None
            profiler._held = None
        return [profiler], on, off, True
    if name == "held-to-fold":
        profiler = lightning_perf.SectionProfiler()
        if not hasattr(profiler._ledger, "defer"):
            raise SystemExit("held-to-fold: this checkout always holds them to the fold (measure 31a47ce)")
        return ([profiler], lambda: setattr(profiler._ledger, "defer", True),
                lambda: setattr(profiler._ledger, "defer", False), True)
    if name == "step-events":
        profiler = lightning_perf.SectionProfiler()
        if not hasattr(profiler, "_deferring"):
            raise SystemExit("step-events: this checkout has no list of step events (measure one up to 61500f1)")
        return [profiler], lambda: None, lambda: setattr(profiler, "_deferring", False), True
    suite = lightning_perf.PerfSuite()
    if name == "suite-step-loop":
        return [suite], *_through_forward(), False
    if name == "step-frames":
        holder = _TrainerOf()
        return [suite, holder], *_step_frames(suite, holder), False
    if name == "fold":
        return [suite], *_fold(), False
    if name == "suite-guard":
        unguarded = suite._by_hook
        guarded = {hook: [(getattr(cb, hook), cb) for _, cb in fns] for hook, fns in unguarded.items()}
        if unguarded == guarded:
            raise SystemExit("suite-guard: this checkout calls each hook through its guard (measure one up to 32bae39)")
        return ([suite], lambda: setattr(suite, "_by_hook", unguarded), lambda: setattr(suite, "_by_hook", guarded),
                False)
    held = perf_suite.PerfSuite.__dict__["state_key"]
    built = property(lambda self: self._compute_state_key())
    return ([suite], lambda: setattr(perf_suite.PerfSuite, "state_key", held),
            lambda: setattr(perf_suite.PerfSuite, "state_key", built), False)


def _through_forward() -> Tuple[Callable[[], None], Callable[[], None]]:
    """On: PerfSuite's own step hooks; off: hooks of the same names that call ``_forward``, as the suite did."""
    from lightning_perf.callbacks.core.scalars import WAITING, drain_scalars

    def on_train_batch_end(self: Any, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        try:
            self._forward("on_train_batch_end", trainer, pl_module, outputs, batch, batch_idx)
        finally:
            if WAITING.count:
                try:
                    drain_scalars(trainer, batch_end=True)
                except Exception as err:  # noqa: BLE001
                    self._record_failure(None, "on_train_batch_end (logging)", err)

    def on_train_batch_start(self: Any, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._forward("on_train_batch_start", trainer, pl_module, batch, batch_idx)

    def on_before_backward(self: Any, trainer: Any, pl_module: Any, loss: Any) -> None:
        self._forward("on_before_backward", trainer, pl_module, loss)

    def on_after_backward(self: Any, trainer: Any, pl_module: Any) -> None:
        self._forward("on_after_backward", trainer, pl_module)

    def on_before_optimizer_step(self: Any, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._forward("on_before_optimizer_step", trainer, pl_module, optimizer)

    def on_before_zero_grad(self: Any, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        self._forward("on_before_zero_grad", trainer, pl_module, optimizer)

    cls = perf_suite.PerfSuite
    old = {fn.__name__: fn for fn in (on_train_batch_end, on_train_batch_start, on_before_backward, on_after_backward,
                                      on_before_optimizer_step, on_before_zero_grad)}
    new = {name: cls.__dict__[name] for name in old}
    return (lambda: [setattr(cls, k, v) for k, v in new.items()] and None,
            lambda: [setattr(cls, k, v) for k, v in old.items()] and None)


#: ``--old``: the checkout whose methods ``step-frames`` runs in its off blocks
OLD: List[str] = []


class _TrainerOf(Callback):
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.trainer = trainer


def _old_module(relative: str) -> Any:
    """A module of the ``--old`` checkout, run under another name beside this checkout's (its imports are ours)."""
    import importlib.util

    if not OLD:
        raise SystemExit("step-frames, fold: give --old CHECKOUT, a checkout before the change (f6235a7,"
                         " d94eaad)")
    path = os.path.join(OLD[0], relative)
    spec = importlib.util.spec_from_file_location("old_" + relative.replace("/", "_")[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _step_frames(suite: Any, holder: Any) -> Tuple[Callable[[], None], Callable[[], None]]:
    """On: this checkout's methods; off: ``--old``'s, the same names swapped on the classes (and the bound ones the
    loop holds: the suite's step tuples, the fetch marks on the data fetcher, the transfer mark)."""
    import types

    from lightning_perf.callbacks.iteration_timer.callback import IterationTimer
    from lightning_perf.callbacks.section_profiler.callback import SectionProfiler
    from lightning_perf.measure.sections.ledger import SectionLedger

    old_it = _old_module("lightning_perf/callbacks/iteration_timer/callback.py").IterationTimer
    old_sp = _old_module("lightning_perf/callbacks/section_profiler/callback.py").SectionProfiler
    old_ledger = _old_module("lightning_perf/measure/sections/ledger.py").SectionLedger
    swaps = [(IterationTimer, ("on_train_batch_end",), old_it),
             (SectionProfiler, ("_fetch_started", "_batch_transfer", "on_train_batch_start"), old_sp),
             (SectionLedger, ("batch_end", "fetch_returned", "transfer", "batch_start"), old_ledger)]
    new = {(cls, name): cls.__dict__[name] for cls, names, _ in swaps for name in names}
    old = {(cls, name): source.__dict__[name] for cls, names, source in swaps for name in names}
    profiler = next(cb for cb in suite.callbacks if isinstance(cb, SectionProfiler))

    def use(methods: Any) -> Callable[[], None]:
        def switch() -> None:
            for (cls, name), fn in methods.items():
                setattr(cls, name, fn)
            suite._build_dispatch()
            fetcher = getattr(getattr(getattr(holder, "trainer", None), "fit_loop", None), "_data_fetcher", None)
            marks = profiler._fetch_marks
            if fetcher is not None and marks is not None and marks.loop is not None:
                started = types.MethodType(SectionProfiler._fetch_started, profiler)
                fetcher._start_profiler = started
                setattr(marks.loop, marks.names[0], started)  # (read again at an epoch's start)
            if profiler._transfer is not None:
                profiler._transfer.mark = types.MethodType(SectionProfiler._batch_transfer, profiler)
        return switch

    return use(new), use(old)


def _fold() -> Tuple[Callable[[], None], Callable[[], None]]:
    """On: this checkout's ``SectionLedger.fold``; off: ``--old``'s."""
    from lightning_perf.measure.sections.ledger import SectionLedger

    new = SectionLedger.__dict__["fold"]
    old = _old_module("lightning_perf/measure/sections/ledger.py").SectionLedger.fold
    return lambda: setattr(SectionLedger, "fold", new), lambda: setattr(SectionLedger, "fold", old)


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trick", choices=("suite-guard", "suite-key", "suite-step-loop", "step-frames", "fold",
                                          "step-events", "held-switches",
                                          "held-to-fold"))
    parser.add_argument("--steps", type=int, default=50_000, help="steps of each fit (default 50000)")
    parser.add_argument("--reps", type=int, default=3, help="fits, one after the other (default 3)")
    parser.add_argument("--block", type=int, default=7, help="steps per block (default 7, as overhead.py's)")
    parser.add_argument("--old", help="step-frames, fold: the checkout before the change, whose methods the"
                        " off blocks run")
    args = parser.parse_args(argv)
    OLD[:] = [args.old] if args.old else []
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    for handler in logging.getLogger("lightning.pytorch").handlers:  # (built and logged, as overhead.py does)
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(open(os.devnull, "w"))  # noqa: SIM115 - for the process's life
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as root:
        overhead.run(steps=300, skip=1, root=root, callbacks=[])  # warm the process up
        for rep in range(args.reps):
            callbacks, on, off, each_step = trick(args.trick)
            toggle = Toggle(on, off, args.block, args.steps // 10, each_step)
            overhead.fit([*callbacks, toggle], args.steps, None, root)
            on()
            r = overhead.paired_overhead(toggle)
            print(f"{args.trick} fit {rep + 1}: step without {r['without_mean']:.1f} µs; on - off: mean"
                  f" {r['mean']:+.2f} [{r['mean_ci'][0]:+.2f}, {r['mean_ci'][1]:+.2f}], median {r['median']:+.2f}"
                  f" [{r['median_ci'][0]:+.2f}, {r['median_ci'][1]:+.2f}], {r['pairs']} pairs", flush=True)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
