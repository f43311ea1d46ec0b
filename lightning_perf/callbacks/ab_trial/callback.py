"""ABTrial: try a change inside one fit, in alternating blocks of iterations, and read its speed-up with a paired
interval and its effect on validation quality."""

from __future__ import annotations

import itertools
import os
import traceback
from typing import Any, Callable, Dict, List, Optional

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lightning_perf.callbacks.core.arguments import bad_argument, check_bool, check_positive_int
from lightning_perf.callbacks.core.base import PerfCallback, guarded, reads_state
from lightning_perf.callbacks.core.scalars import log_scalars
from lightning_perf.callbacks.core.state import StateError, StateReader
from lightning_perf.callbacks.core.summary_book import error_message
from lightning_perf.errors import PerfConfigError
from lightning_perf.measure.timing import clock
from lightning_perf.measure.trials.blocks import OFF, ON, ORDERS, BlockSchedule, TrialBlocks, paired_ratio
from lightning_perf.measure.trials.changes import Change, Setting, UserChange, make_change
from lightning_perf.measure.trials.quality import compare_arms, score_batches
from lightning_perf.summary.baseline import DEFAULT_TOLERANCE
from lightning_perf.summary.fields import IMAGE_METRIC_DIRECTIONS

#: What each built-in change targets: the diagnosis verdict whose ceiling its gain is read beside.
#: The trial's statuses (docs/trials.md); a longer fit resumed from an ``incomplete`` one goes on with it.
STATUSES = ("not-started", "running", "done", "incomplete", "stopped")
TARGETS = {"cudnn_benchmark": "compute-bound", "tf32": "compute-bound", "matmul_precision": "compute-bound",
           "channels_last": "compute-bound", "autocast_bf16": "compute-bound", "autocast_fp16": "compute-bound"}


def _batch_size(batch: Any) -> Optional[int]:
    """The first dimension of the batch's first tensor (in a tuple, list or dict), or None."""
    for _ in range(3):
        if hasattr(batch, "shape") and len(batch.shape) > 0:
            return int(batch.shape[0])
        if isinstance(batch, dict):
            batch = next(iter(batch.values()), None)
        elif isinstance(batch, (list, tuple)):
            batch = batch[0] if batch else None
        else:
            return None
    return None


def _raised_at(err: BaseException) -> str:
    """`` at model.py:42``: where the error was raised (its traceback's last frame), or nothing."""
    frames = traceback.extract_tb(err.__traceback__)
    return f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def speed_words(speedup: float, low: float, high: float) -> str:
    """``1.12x faster`` / ``1.05x slower`` / ``no difference``, by the interval: within noise where it holds 1."""
    if low <= 1.0 <= high:
        return f"within noise ({speedup:.3f}x)"
    return f"{speedup:.2f}x faster" if speedup > 1 else f"{1 / speedup:.2f}x slower"


class ABTrial(PerfCallback):
    r"""Switches a change on and off in alternating blocks of training iterations and times each arm.

    After ``warmup`` iterations (the first half with the change off, the rest on: each arm's first-time costs are
    paid uncounted), ``blocks`` blocks of ``block`` iterations run in pairs, one block an arm, each pair's order
    ``"random"`` (a seeded coin) or ``"abba"``. An iteration is timed from one iteration's end to the next, on the
    clock IterationTimer uses (``lightning_perf.measure.timing.clock.now``); the first ``settle`` iterations of each
    block, iterations that span a validation, and the switches themselves are counted in neither arm (the switches' time
    is reported). The result is the ratio of the arms' mean times with a paired interval over the block pairs
    (docs/trials.md). After the last block the change is off and stays off; where the run has a validation loop,
    its first ``quality_batches`` batches are scored once under each arm (the QualityGate's image metrics where
    one is in the run, and whatever ``validation_step`` logs) and compared within the gate's tolerance.
    A resume from a checkpoint saved mid-trial goes on with the trial; one that had ended is kept as it was.

    Args:
        change: a built-in change (``cudnn_benchmark``, ``tf32``, ``matmul_precision``, ``channels_last``,
            ``autocast_bf16``, ``autocast_fp16``), a name of your own with ``switch_on`` and ``switch_off``, or your
            switches by import path, imported here: ``"mypkg.switches:on,off"`` (two functions) or
            ``"mypkg.switches:Change"`` (an object or class with ``switch_on`` and ``switch_off`` methods).
        warmup: iterations before the first block.
        block: iterations a block.
        blocks: blocks in all, even, at least 4.
        order: ``"random"`` or ``"abba"``.
        settle: iterations at the start of each block counted in neither arm.
        seed: the seed of the random order.
        value: the precision for ``matmul_precision`` (``high`` by default, or ``medium``).
        switch_on, switch_off: your change's functions of ``(trainer, pl_module)``, called between iterations.
        targets: the diagnosis verdict your change targets (``input-bound``...), for the ceiling beside its gain;
            the built-in changes target ``compute-bound``.
        quality_batches: validation batches scored under each arm; 0: none.
        confidence: of the interval.
        verbose: print the result line.
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.

    Logged metrics: ``trial/off_ms_per_iter``, ``trial/on_ms_per_iter``, ``trial/speedup``, ``trial/speedup_low``,
    ``trial/speedup_high``, once, at the trial's end.

    Raises:
        ValueError: at construction, for a bad block setting.
        PerfConfigError: at construction for an unknown change or switches by import path that cannot be imported
            or used; at set-up for a change that cannot be tried in this run (autocast under a mixed precision
            Trainer, a CUDA-only flag on CPU, a flag already on).

    Example::

        Trainer(callbacks=[ABTrial(change="channels_last", block=10, blocks=24)])
    """

    section_name = "trial"
    _transient = ("_module", "_trainer")

    def __init__(self, change: str, warmup: int = 20, block: int = 10, blocks: int = 24, order: str = "random",
                 settle: int = 1, seed: int = 0, value: Optional[str] = None,
                 switch_on: Optional[Callable[..., Any]] = None, switch_off: Optional[Callable[..., Any]] = None,
                 targets: Optional[str] = None, quality_batches: int = 4, confidence: float = 0.95,
                 verbose: bool = True, summary_path: Optional[str] = None) -> None:
        super().__init__(summary_path=summary_path)
        owner = type(self).__name__
        if not isinstance(change, str) or not change:
            raise bad_argument(owner, "change", change, "Expected the name of a change.")
        check_positive_int(owner, "warmup", warmup, minimum=0)
        check_positive_int(owner, "block", block, minimum=2)
        check_positive_int(owner, "blocks", blocks, minimum=4)
        check_positive_int(owner, "settle", settle, minimum=0)
        check_positive_int(owner, "quality_batches", quality_batches, minimum=0)
        if blocks % 2:
            raise bad_argument(owner, "blocks", blocks, "Expected an even number (pairs of one block an arm).")
        if settle >= block:
            raise bad_argument(owner, "settle", settle, f"Expected fewer than `block` ({block}).")
        if order not in ORDERS:
            raise bad_argument(owner, "order", order, f"Possible choices are: {', '.join(ORDERS)}.")
        if isinstance(confidence, bool) or not isinstance(confidence, float) or not 0.5 <= confidence < 1:
            raise bad_argument(owner, "confidence", confidence, "Expected a float in [0.5, 1).")
        self.change_name = change
        self.change: Change = make_change(change, value, switch_on, switch_off)
        self.schedule = BlockSchedule(warmup, block, blocks, order, settle, seed)
        self.targets = targets if targets is not None else TARGETS.get(change)
        self.quality_batches = quality_batches
        self.confidence = confidence
        self.verbose = check_bool(owner, "verbose", verbose)
        #: Set by ``lightning-perf run`` / ``matrix --trial``: a change this run cannot try is recorded in the
        #: section (``status: not-started``, ``reason``) instead of refusing the set-up of the whole attached suite.
        self.record_refusal = False
        self._reset()

    def _reset(self) -> None:
        self._blocks = TrialBlocks(self.schedule)
        self._iteration = 0
        self._arm = OFF
        self._last: Optional[float] = None
        self._samples: Optional[int] = 0  # the iteration in progress, every micro-batch's (None: a size unknown)
        self._broken = False
        self._last_step = -1
        self._switches = 0
        self._switch_s = 0.0
        self._status = "not-started"
        self._reason: Optional[str] = None
        self._quality: Optional[Dict[str, Any]] = None
        self._quality_reason: Optional[str] = None
        self._module: Any = None
        self._cuda: Optional[torch.device] = None  # the device synchronised at each block's end
        self._trainer: Any = None
        self._wrapper: Any = None
        self._held_step: Any = None

    # -- set-up --------------------------------------------------------------------------------------------------
    @guarded
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._reset()
        self._start_run(trainer)
        setting = Setting(pl_module, trainer.strategy.root_device.type, str(trainer.precision))
        try:
            self.change.check(setting)
        except PerfConfigError as err:  # the run cannot try this change
            if not self.record_refusal:
                raise
            self._reason = str(err)  # attached by `run`/`matrix --trial`: the others measure on; the section says why
            self._warn_once("refused", f"{err}; the fit runs without the trial")
            return
        if isinstance(self.change, UserChange):
            self.change.trainer = trainer

    @guarded
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._status in ("done", "stopped") or self._reason is not None:
            return  # refused at set-up (record_refusal), or a trial that ended before the checkpoint resumed from
        self._module, self._trainer = pl_module, trainer
        self._last_step = trainer.global_step
        device = trainer.strategy.root_device
        self._cuda = device if device.type == "cuda" else None
        first = self.schedule.arm(self._iteration)  # not 0 after a resume mid-trial (load_state_dict)
        if first is None:
            return
        self._wrap_step(pl_module)  # every change: a step that raises under it is handled (_step_raised)
        self._status = "running"
        if first == ON:
            self._switch(ON)
        self._broken = self._iteration > 0  # a resume: its first iteration holds the fit's start-up
        self._samples = 0
        self._last = clock.now()

    def _wrap_step(self, pl_module: LightningModule) -> None:
        """``training_step`` runs inside the change's ``around_step`` (where it has one) while the change is on, and a
        step that raises under the change is handled here (:meth:`_step_raised`); the module's own method comes back
        at the trial's end (an instance attribute: the class is not touched)."""
        self._held_step = pl_module.__dict__.get("training_step")
        inner = pl_module.training_step
        trial = self

        def training_step(*args: Any, **kwargs: Any) -> Any:
            if trial._arm != ON:
                return inner(*args, **kwargs)
            try:
                around = trial.change.around_step
                return inner(*args, **kwargs) if around is None else around(inner, args, kwargs)
            except Exception as err:  # noqa: BLE001 - the step broke under the change: the trial stops
                return trial._step_raised(err, inner, args, kwargs)

        self._wrapper = training_step
        pl_module.training_step = training_step

    def _step_raised(self, err: Exception, inner: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """The trial stops and the change goes off. Under automatic optimization ``training_step`` holds the forward
        and the loss only (backward and the optimizer step come after it returns), so the step is run again without
        the change: training goes on, or, where it raises again, that error is the step's own and goes to the fit.
        Under manual optimization the step may have stepped an optimizer before it raised, and a change that cannot
        be switched off would run it under the change again: there it is not run again, and the error goes to the
        fit."""
        what = f"training_step raised under the change ({type(err).__name__}: {error_message(err)}{_raised_at(err)})"
        if not self._module.automatic_optimization:
            self._stop(f"{what}; under manual optimization the step is not run again (it may have stepped an"
                       " optimizer already)", after="raises")
            raise err
        self._stop(what, warn=False)
        if self._arm == ON:  # it could not be switched off: a second run would be under the change again
            self._warn_stopped("raises")
            raise err
        self._reason = f"{what}; that step ran again without the change"
        try:
            out = inner(*args, **kwargs)
        except Exception:
            self._reason = f"{what} and again without it: the step's own error, not the change's"
            self._warn_stopped("raises")
            raise
        self._warn_stopped("goes_on")
        return out

    def _unwrap_step(self) -> None:
        module, self._wrapper, wrapper = self._module, None, self._wrapper
        if module is None or wrapper is None or module.__dict__.get("training_step") is not wrapper:
            return
        if self._held_step is None:
            del module.__dict__["training_step"]
        else:
            module.training_step = self._held_step

    # -- the blocks ----------------------------------------------------------------------------------------------
    def _switch(self, arm: str) -> bool:
        """Switches the change to ``arm`` between two iterations, timed apart; a change that raises stops the trial
        (False): one that raised switching on is left off; one that raised switching off is not tried again (it
        stays on)."""
        start = clock.now()
        try:
            (self.change.on if arm == ON else self.change.off)(self._module)
        except Exception as err:  # noqa: BLE001 - a measurement never raises into training
            self._stop(f"switching the change {arm} raised {type(err).__name__}: {error_message(err)}",
                       off_failed=arm == OFF)
            return False
        self._switch_s += clock.now() - start
        self._switches += 1
        self._arm = arm
        return True

    def _stop(self, reason: str, after: str = "goes_on", warn: bool = True, off_failed: bool = False) -> None:
        """Ends the trial early: the change goes off (unless switching it off is what failed), the reason is kept and
        said in one warning; ``after``: what the fit does next (:meth:`_warn_stopped`)."""
        self._status = "stopped"
        if self._arm == ON and not off_failed:
            try:
                self.change.off(self._module)
                self._arm = OFF
            except Exception as err:  # noqa: BLE001
                reason += f"; switching it off raised {type(err).__name__}: {error_message(err)}"
                off_failed = True
        if off_failed:
            reason += "; the change stays on (ABTrial cannot switch it off)"
        self._reason = reason
        self._last = None
        self._unwrap_step()
        if warn:
            self._warn_stopped(after)

    def _warn_stopped(self, after: str) -> None:
        """The one warning of a stopped trial, in words that match what the fit does next: ``goes_on`` (training goes
        on), ``raises`` (the fit stops with an error) or ``ended``."""
        state = "on" if self._arm == ON else "off"
        then = {"goes_on": f"Training goes on with the change {state}.",
                "raises": f"The change is {state}; the fit stops with that error."}.get(after,
                                                                                        f"The change is {state}.")
        self._warn_once("stopped", f"the trial of {self.change_name!r} stopped: {self._reason}. {then}")

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        try:
            if self._status != "running":
                return
            size, samples = _batch_size(batch), self._samples
            self._samples = None if size is None or samples is None else samples + size
            if pl_module.automatic_optimization:
                step = trainer.global_step
                if step == self._last_step:
                    return  # still accumulating: the iteration ends with the optimizer step
                self._last_step = step
            i = self._iteration
            block, counted = self.schedule.where(i)
            if self._cuda is not None and self.schedule.where(i + 1)[0] != block:
                # Once a block (a warm-up) ends: the host runs up to ~20 CUDA steps ahead, so without it an arm's
                # queued kernels would run in the next block; opt-in, one sync a block, never per step.
                torch.cuda.synchronize(self._cuda)
            t = clock.now()
            if counted and not self._broken and self._last is not None:
                self._blocks.add(block, t - self._last, self._samples)
            self._broken, self._samples = False, 0
            self._iteration = i + 1
            arm = self.schedule.arm(i + 1)
            if arm is None:
                self._finish(trainer, pl_module, "done")
                return
            if arm != self._arm and not self._switch(arm):
                return
            self._last = clock.now()  # the switch is in neither arm
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (a step hook)
            self._record_failure("on_train_batch_end", err)

    @guarded
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._broken = True  # the iteration that spans a validation is in neither arm

    # -- the end -------------------------------------------------------------------------------------------------
    def _finish(self, trainer: Trainer, pl_module: LightningModule, status: str) -> None:
        switched_off = self._arm != ON or self._switch(OFF)
        self._unwrap_step()
        if self._status == "running":
            self._status = status
        self._last = None
        if self.quality_batches and not switched_off:
            self._quality_reason = "the change could not be switched off, so the arms cannot be compared"
        elif self.quality_batches:
            self._score_quality(trainer, pl_module)
        result = self._result()
        if result.get("speedup") is not None:
            log_scalars(trainer, {"trial/off_ms_per_iter": result["arms"][OFF]["ms_per_iter"],
                                  "trial/on_ms_per_iter": result["arms"][ON]["ms_per_iter"],
                                  "trial/speedup": result["speedup"], "trial/speedup_low": result["speedup_low"],
                                  "trial/speedup_high": result["speedup_high"]})
        if self.verbose and trainer.is_global_zero:
            rank_zero_info(self.result_line())

    @guarded
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._status == "running":
            self._reason = (f"the fit ended after {self._iteration} of the trial's {self.schedule.total} iterations;"
                            " the pairs measured so far are reported")
            self._finish(trainer, pl_module, "incomplete")

    @guarded
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write_summary(trainer)

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if self._status == "running":
            self._stop(f"the fit raised {type(exception).__name__}: {error_message(exception)}", after="raises")
        self._write_summary(trainer, exception)

    def teardown(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        if self._status == "running":
            self._stop("the fit ended without its end hooks", after="ended")
        self._unwrap_step()
        super().teardown(trainer, pl_module, stage)

    # -- checkpoint state --------------------------------------------------------------------------------------------
    def _schedule_key(self) -> List[Any]:
        s = self.schedule
        return [s.warmup, s.block, s.blocks, s.order, s.settle, s.seed]

    def state_dict(self) -> Dict[str, Any]:
        """What a resume needs to go on with the trial (or to keep one that ended): where it is and its blocks."""
        blocks = self._blocks
        return {"change": self.change_name, "schedule": self._schedule_key(), "status": self._status,
                "reason": self._reason, "iteration": self._iteration, "block_seconds": list(blocks.seconds),
                "block_iterations": list(blocks.iterations), "block_samples": list(blocks.samples),
                "switches": self._switches, "switch_s": self._switch_s, "quality": self._quality,
                "quality_reason": self._quality_reason}

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        s = StateReader(state_dict)
        change, schedule = s.text("change"), s.data.get("schedule")
        if change != self.change_name or list(schedule or ()) != self._schedule_key():
            raise StateError(f"it is a trial of {change!r} on the schedule {schedule}, this one is of"
                             f" {self.change_name!r} on {self._schedule_key()} (warmup, block, blocks, order, settle,"
                             " seed)")
        status = s.text("status", allow_none=False)
        if status not in STATUSES:
            raise StateError(f"status is {status!r}, expected one of {', '.join(STATUSES)}")
        iteration = s.count("iteration")
        n = self.schedule.blocks
        lists = {key: s.data.get(key) for key in ("block_seconds", "block_iterations", "block_samples")}
        if any(not isinstance(v, list) or len(v) != n for v in lists.values()) or iteration > self.schedule.total:
            raise StateError(f"its blocks or iteration ({iteration}) do not fit the schedule of {n} blocks")
        blocks = TrialBlocks(self.schedule)
        for i in range(n):
            item = StateReader({"s": lists["block_seconds"][i], "n": lists["block_iterations"][i],
                                "k": lists["block_samples"][i]}, f"block {i}")
            blocks.seconds[i], blocks.iterations[i] = item.number("s"), item.count("n")
            blocks.samples[i] = None if item.data["k"] is None else item.count("k")
        quality = s.data.get("quality")
        if quality is not None and not isinstance(quality, dict):
            raise StateError(f"quality is a {type(quality).__name__}, expected a dict or None")
        switches, switch_s = s.count("switches"), s.number("switch_s")
        reason, quality_reason = s.text("reason"), s.text("quality_reason")
        if status == "not-started" or (self._status == "not-started" and self._reason is not None):
            return  # nothing measured yet, or this run refused the change at set-up: its refusal stands
        if status == "incomplete":  # the last fit ended first: this one goes on with the trial
            status, reason, quality, quality_reason = "running", None, None, None
        self._status, self._reason, self._iteration, self._blocks = status, reason, iteration, blocks
        self._switches, self._switch_s, self._quality, self._quality_reason = (switches, switch_s, quality,
                                                                               quality_reason)

    # -- quality per arm -----------------------------------------------------------------------------------------
    def _gate(self, trainer: Trainer) -> Any:
        """The run's QualityGate (given to the Trainer or inside a PerfSuite), found by its section name: callbacks
        do not import each other."""
        for cb in trainer.callbacks:
            for inner in [cb, *getattr(cb, "callbacks", ())]:
                if getattr(inner, "section_name", None) == "quality_gate":
                    return inner
        return None

    def _score_quality(self, trainer: Trainer, pl_module: LightningModule) -> None:
        try:
            loaders = trainer.val_dataloaders
            loader = loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders
            if loader is None or not callable(getattr(type(pl_module), "validation_step", None)):
                self._quality_reason = "the run has no validation loop"
                return
            device = trainer.strategy.root_device
            batches = [pl_module.transfer_batch_to_device(b, device, 0)
                       for b in itertools.islice(loader, self.quality_batches)]
            gate = self._gate(trainer)
            kwargs: Dict[str, Any] = {}
            if gate is not None:
                kwargs = dict(image_metrics=list(gate.metrics), data_range=gate.data_range,
                              preds_key=gate.preds_key, target_key=gate.target_key)
            scores = {}
            for arm in (OFF, ON):
                if arm == ON and not self._switch(ON):
                    return
                try:
                    step = (lambda b, i: self.change.around_step(pl_module.validation_step, (b, i), {})) \
                        if arm == ON and self.change.around_step is not None else None
                    scores[arm] = score_batches(pl_module, batches, step=step, **kwargs)
                finally:
                    if arm == ON:
                        self._switch(OFF)
            tolerance = dict(gate.tolerance) if gate is not None else {}
            for name, mode in (dict(gate.tolerance_mode) if gate is not None else {}).items():
                if mode == "absolute" and name in tolerance and scores[OFF].get(name):  # as a share of the off arm
                    tolerance[name] = tolerance[name] / abs(scores[OFF][name])
            directions = {**IMAGE_METRIC_DIRECTIONS, **(dict(gate.modes) if gate is not None else {})}
            self._quality = {"batches": len(batches), "source": "quality_gate" if gate is not None else "logged",
                             "metrics": compare_arms(scores[OFF], scores[ON], tolerance, directions,
                                                     DEFAULT_TOLERANCE)}
        except Exception as err:  # noqa: BLE001 - a measurement never raises into training
            self._quality_reason = f"the quality pass failed ({type(err).__name__}: {error_message(err)})"

    # -- results -------------------------------------------------------------------------------------------------
    def _result(self) -> Dict[str, Any]:
        totals = self._blocks.arm_totals()
        arms: Dict[str, Dict[str, Any]] = {}
        for arm in (OFF, ON):
            t = totals[arm]
            n, seconds, samples = t["iterations"], t["seconds"], t["samples"]
            ms = 1000.0 * seconds / n if n and seconds > 0 else None
            arms[arm] = {"iterations": n, "ms_per_iter": ms, "it_per_s": 1000.0 / ms if ms else None,
                         "samples_per_s": samples / seconds if samples is not None and seconds > 0 else None}
        pairs = self._blocks.pair_means()
        ratio = paired_ratio(pairs, self.confidence)
        out: Dict[str, Any] = {"arms": arms, "pairs": len(pairs), "blocks": 2 * len(pairs),
                               "pair_off_ms": [1000.0 * off for off, _ in pairs],
                               "pair_on_ms": [1000.0 * on for _, on in pairs],
                               "time_ratio": None, "speedup": None, "speedup_low": None, "speedup_high": None,
                               "verdict": None}
        if ratio is None:
            out["unavailable"] = {"speedup": f"{len(pairs)} complete pair(s) of blocks measured; the interval needs 2"}
            return out
        r, low, high = ratio
        out.update(time_ratio=r, speedup=1 / r, speedup_low=1 / high, speedup_high=1 / low,
                   verdict="faster" if high < 1 else "slower" if low > 1 else "within-noise")
        return out

    def result_line(self) -> str:
        """``ABTrial: with channels_last: 1.12x faster (95% CI 1.09–1.15, paired over 24 blocks), psnr -0.1%
        (within 0.5%)``."""
        result = self._result()
        head = f"ABTrial: with {self.change_name}: "
        if result["speedup"] is None:
            return head + f"no result ({result['unavailable']['speedup']}" + (
                f"; {self._reason})" if self._reason else ")")
        low, high = result["speedup_low"], result["speedup_high"]
        interval = (f"{1 / high:.2f}–{1 / low:.2f}x slower" if result["verdict"] == "slower"  # in the words' terms
                    else f"{low:.2f}–{high:.2f}")
        line = head + (f"{speed_words(result['speedup'], low, high)} ({100 * self.confidence:g}% CI {interval},"
                       f" paired over {result['blocks']} blocks)")
        for name, row in ((self._quality or {}).get("metrics") or {}).items():
            if row["change_pct"] is None:
                continue
            word = "OUTSIDE" if row["degraded"] else "within"
            line += f", {name} {row['change_pct']:+.1f}% ({word} {row['tolerance_pct']:g}%)"
        if self._status != "done":
            line += f" [{self._status}: {self._reason}]"
        return line

    def _summary_section(self) -> Dict[str, Any]:
        result = self._result()
        quality = self._quality
        degraded = sorted(n for n, r in ((quality or {}).get("metrics") or {}).items() if r["degraded"])
        unavailable = dict(result.pop("unavailable", {}))
        if self._quality_reason:
            unavailable["quality"] = self._quality_reason
        s = self.schedule
        return {"change": self.change_name, "targets": self.targets, "status": self._status, "reason": self._reason,
                "warmup": s.warmup, "block": s.block, "blocks_planned": s.blocks, "order": s.order,
                "settle": s.settle, "seed": s.seed, "confidence": self.confidence, **result,
                "switches": self._switches, "switch_ms_mean": 1000.0 * self._switch_s / self._switches
                if self._switches else None, "switch_s_total": self._switch_s,
                "quality": quality, "quality_degraded_on": degraded, "line": self.result_line(),
                "unavailable": unavailable or None}
