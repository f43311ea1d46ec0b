"""PerfSuite: one Lightning callback that drives several lightning_perf callbacks, so Lightning dispatches each hook
once for all of them."""

from __future__ import annotations

import warnings
import weakref
from typing import Any, Dict, List, Optional

from lightning.pytorch import Callback

from lightning_perf.callbacks.core.arguments import bad_argument
from lightning_perf.callbacks.core.base import HeldStateKey, PerfCallback, callback_states
from lightning_perf.callbacks.core.rank_gather import close_gather_batch, open_gather_batch
from lightning_perf.callbacks.core.scalars import WAITING, close_log_batch, drain_scalars, flush_scalars, open_log_batch
from lightning_perf.errors import PerfCheckFailed, PerfConfigError

#: Every hook Lightning calls on a callback with (trainer, pl_module, ...): state_dict/load_state_dict are not here,
#: nor on_load_checkpoint, which the suite answers itself (it knows where Lightning delivers each callback's state).
_HOOKS = tuple(sorted(name for name in dir(Callback) if (name.startswith("on_") or name in ("setup", "teardown"))
                      and callable(getattr(Callback, name)) and name != "on_load_checkpoint"))

#: The hooks of the training step, each with the attribute that holds its (method, callback) pairs: these hooks run
#: their loop themselves (``_step_failed`` only where one raised), with no ``_forward`` frame and no dict lookup.
_STEP_HOOKS = {name: f"_step_{name}" for name in ("on_train_batch_start", "on_train_batch_end", "on_before_backward",
                                                   "on_after_backward", "on_before_optimizer_step",
                                                   "on_before_zero_grad")}

#: Suites not yet set up, by the state key each holds: two suites of the same callbacks in one Trainer get distinct
#: keys until ``setup`` (see ``PerfSuite._compute_state_key``).
_UNSET_KEYS: "weakref.WeakValueDictionary[str, PerfSuite]" = weakref.WeakValueDictionary()


class PerfSuite(Callback):
    r"""Runs several lightning_perf callbacks behind one Lightning callback.

    Lightning calls every hook of every callback on every step (about 1.7 µs a call with its profiler context):
    five separate callbacks pay that five times. Inside a ``PerfSuite`` they pay it once; each hook (written out
    below, under "hooks") is forwarded only to the callbacks that define it. The callbacks keep their arguments,
    summary sections, logged keys and checkpoint state (under the suite's ``state_key``, one entry per callback by its
    own ``state_key``; a resume finds each callback's state by its own key in a checkpoint of separate callbacks or
    of another suite too). A check that
    is asked to fail (``QualityGate(action="fail")``, ``EvalNoGradGuard(mode="raise")``) still fails the fit, after
    every callback has run that hook.

    Args:
        callbacks: lightning_perf callbacks; default ``IterationTimer``, ``SectionProfiler``, ``VRAMMonitor`` and
            ``EvalNoGradGuard`` with their defaults (``QualityGate`` needs to know what to gate: add it yourself).

    Raises:
        ValueError: for something that is not a lightning_perf callback, or two callbacks with one ``state_key``
            (their checkpoint state would collide); ``PerfConfigError`` at setup when a callback's key is also used
            by another lightning_perf callback of the Trainer (beside the suite or in another suite), naming
            ``PerfSuite(callbacks=...)`` when two suites of one Trainer hold the same callbacks (``PerfSuite()``
            twice).

    Example::

        trainer = Trainer(callbacks=[PerfSuite([IterationTimer(target_steps=30_000), SectionProfiler(),
                                                VRAMMonitor(), EvalNoGradGuard()])])

    In a LightningCLI config::

        trainer:
          callbacks:
            - class_path: lightning_perf.PerfSuite
              init_args:
                callbacks:
                  - class_path: lightning_perf.IterationTimer
                    init_args: {warmup_steps: 10}
                  - class_path: lightning_perf.VRAMMonitor
    """

    def __init__(self, callbacks: Optional[List[Callback]] = None) -> None:
        super().__init__()
        if callbacks is None:
            from lightning_perf.callbacks.eval_no_grad_guard.callback import EvalNoGradGuard
            from lightning_perf.callbacks.iteration_timer.callback import IterationTimer
            from lightning_perf.callbacks.section_profiler.callback import SectionProfiler
            from lightning_perf.callbacks.vram_monitor.callback import VRAMMonitor

            callbacks = [IterationTimer(), SectionProfiler(), VRAMMonitor(), EvalNoGradGuard()]
        if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, (list, tuple)):
            raise bad_argument("PerfSuite", "callbacks", callbacks, "Expected a list of lightning_perf callbacks.")
        strangers = [type(cb).__name__ for cb in callbacks if not isinstance(cb, PerfCallback)]
        if strangers:
            raise bad_argument("PerfSuite", "callbacks", callbacks,
                               f"Only lightning_perf callbacks can be driven; got {', '.join(strangers)}: pass"
                               " other callbacks to the Trainer.")
        keys = [cb.state_key for cb in callbacks]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise bad_argument("PerfSuite", "callbacks", callbacks,
                               f"Two callbacks share the state key {', '.join(twice)}: give them different"
                               " `summary_path`s or keep one.")
        self.callbacks: List[PerfCallback] = list(callbacks)
        self._set_up = False
        self._build_dispatch()

    #: Lightning formats ``f"[Callback]{callback.state_key}.{hook}"`` for its profiler on every hook call, so the key
    #: is held on the suite, built at its first read after the dispatch is built and after ``setup`` begins (a
    #: callback's ``summary_path`` set since). Built at each read it cost 32 µs a step (3 paired fits of 40,000 steps:
    #: `python benchmarks/toggle_ab.py suite-key --steps 40000 --reps 3`).
    state_key = HeldStateKey()

    def _build_dispatch(self) -> None:
        # (hook, callback) of the callbacks that override each hook: the step path touches nothing else
        self._by_hook: Dict[str, List[Any]] = {}
        for name in _HOOKS:
            base = getattr(Callback, name)
            # (getattr on the instance: an instance attribute wins, as it would for Lightning)
            fns = [(getattr(cb, name), cb) for cb in self.callbacks if getattr(type(cb), name, base) is not base]
            if fns:
                self._by_hook[name] = fns
        for name in _STEP_HOOKS:  # (read by the step hooks themselves: no dict lookup, no ``_forward`` frame)
            setattr(self, _STEP_HOOKS[name], tuple(self._by_hook.get(name, ())))
        self.__dict__.pop("state_key", None)
        for cb in self.callbacks:
            cb._in_suite = True  # the suite drains the window scalars they defer, once a batch end

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._copied = True  # a copy is its original's twin by design: keyed as the original (`_compute_state_key`)
        self._build_dispatch()  # bound methods point at the copies, not the originals

    def __getstate__(self) -> Dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_by_hook", "state_key", *_STEP_HOOKS.values()):
            state.pop(name, None)
        return state

    def _compute_state_key(self) -> str:
        """``PerfSuite`` with the state keys of its callbacks, so two suites of different callbacks in one Trainer
        keep their checkpoint state apart. A resume finds each callback's state by the callback's own key, in any
        suite's entry or beside it, so a suite whose callbacks changed (or a checkpoint of an older version, saved
        under ``PerfSuite``) still resumes.

        Two suites of the same callbacks (``PerfSuite()`` twice) would share that key, and Lightning refuses them in
        ``Trainer(...)`` with its own "more than one stateful callback" error, before any hook of ours runs. So until
        its ``setup``, a suite (not a copy) whose key another suite not yet set up holds gets it with ``copy=N``: the
        Trainer is built, and ``setup`` refuses the pair with a ``PerfConfigError`` naming the argument. From
        ``setup`` on (where the key is built again, before Lightning restores a checkpoint) every suite has its plain
        key, so a checkpoint's entry never depends on which suites were alive when it was built."""
        keys = [cb.state_key for cb in self.callbacks]
        key, copy = self._generate_state_key(callbacks=keys), 1
        while not getattr(self, "_set_up", True) and not getattr(self, "_copied", False):
            holder = _UNSET_KEYS.get(key)
            if holder is None or holder is self or getattr(holder, "_set_up", True):
                _UNSET_KEYS[key] = self
                break
            copy += 1
            key = self._generate_state_key(callbacks=keys, copy=copy)
        return key

    def _refuse_a_twin(self, trainer: Any) -> None:
        """At setup: another suite of this Trainer with callbacks of the same keys is refused, naming the argument.
        Their callbacks would share checkpoint entries and summary sections (the callbacks' own check would say
        so too, naming a callback; this names the suites, which is what the user wrote twice)."""
        mine = [cb.state_key for cb in self.callbacks]
        for other in getattr(trainer, "callbacks", ()):
            if isinstance(other, PerfSuite) and other is not self and [cb.state_key for cb in other.callbacks] == mine:
                other._set_up = True  # refused with this one: its copy key no longer sets later suites apart
                other.__dict__.pop("state_key", None)
                names = ", ".join(type(cb).__name__ for cb in self.callbacks) or "none"
                raise PerfConfigError(
                    f"PerfSuite(callbacks=...): this Trainer has two PerfSuites with the same callbacks ({names}, of"
                    " the same state keys); their checkpoint state and summary sections would collide. Keep one"
                    " PerfSuite, or give the callbacks of one different `summary_path`s.")

    def state_dict(self) -> Dict[str, Any]:
        return {cb.state_key: cb.state_dict() for cb in self.callbacks}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        for cb in self.callbacks:
            if not isinstance(state_dict, dict):
                cb.load_state_dict(state_dict)  # not readable: each callback says so and starts fresh
            elif cb.state_key in state_dict:
                cb.load_state_dict(state_dict[cb.state_key])

    def _record_failure(self, cb: Optional[PerfCallback], where: str, err: BaseException) -> None:
        """A failure of the suite's own work (logging, a gather) on ``cb``, else on its first callback; a suite with
        none (``PerfSuite([])``) warns once instead: it never raises into training."""
        target = cb or (self.callbacks[0] if self.callbacks else None)
        if target is not None:
            target._record_failure(where, err)
        elif not getattr(self, "_warned_empty", False):
            self._warned_empty = True
            warnings.warn(f"lightning_perf: PerfSuite {where} failed: {type(err).__name__}: {err}", stacklevel=2)

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        """Lightning gives ``load_state_dict`` only the suite's own entry: a callback whose state is not there (the
        checkpoint was saved with separate callbacks, or by another suite) finds it by its own ``state_key``."""
        for cb in self.callbacks:
            try:
                mine = callback_states(checkpoint).get(self.state_key)
                if mine and (not isinstance(mine, dict) or cb.state_key in mine):
                    continue  # Lightning delivers it through load_state_dict
            except Exception as err:  # noqa: BLE001 - a checkpoint's measurements must never stop a resume
                cb._state_unreadable(err)
                continue
            cb._restore_state(trainer, checkpoint, delivered_from=self.state_key)

    # -- hooks: each forwards to the callbacks that define it (``_forward``) ---------------------------------------
    def _forward(self, name: str, *args: Any) -> None:
        """Calls ``name`` on each callback that defines it; a check asked to fail (``PerfCheckFailed``) is raised
        after every callback has run the hook, any other failure is recorded on its callback."""
        failed: Optional[BaseException] = None
        for fn, cb in self._by_hook.get(name, ()):
            try:
                fn(*args)
            except PerfCheckFailed as err:  # the one error a hook lets through: after every callback has run
                failed = failed or err
            except Exception as err:  # noqa: BLE001 - a measurement must never stop training
                cb._record_failure(name, err)
        if failed is not None:
            raise failed

    def _step_failed(self, name: str, pair: Any, err: BaseException, *args: Any) -> None:
        """A step hook's loop stopped at ``pair`` (method, callback) with ``err``: handled as ``_forward`` handles it
        (recorded on that callback, or a failed check raised once every callback has run the hook), then the
        callbacks after it run the hook."""
        pairs = getattr(self, _STEP_HOOKS[name])
        failed: Optional[BaseException] = err if isinstance(err, PerfCheckFailed) else None
        if failed is None:
            pair[1]._record_failure(name, err)
        for fn, cb in pairs[next(i for i, p in enumerate(pairs) if p is pair) + 1:]:
            try:
                fn(*args)
            except PerfCheckFailed as later:
                failed = failed or later
            except Exception as later:  # noqa: BLE001 - a measurement must never stop training
                cb._record_failure(name, later)
        if failed is not None:
            raise failed

    def _forward_logging(self, name: str, trainer: Any, *args: Any) -> None:
        """``_forward`` in a phase-end hook where the callbacks log: what they log goes to each logger in one call,
        and at ``on_train_end`` what they gather across ranks in one all_gather."""
        if name not in self._by_hook:
            return
        gathers = name == "on_train_end"
        open_log_batch(trainer)
        if gathers:
            open_gather_batch(trainer)
        try:
            self._forward(name, trainer, *args)
        finally:
            if gathers:  # also after a failed check: every rank must reach the one collective
                try:
                    for cb, err in close_gather_batch(trainer):
                        self._record_failure(cb, name, err)
                except Exception as err:  # noqa: BLE001
                    self._record_failure(None, f"{name} (gather)", err)
            try:
                close_log_batch(trainer)
                if WAITING.count and gathers:  # the end of training: everything still queued
                    flush_scalars(trainer)
            except Exception as err:  # noqa: BLE001 - a logger failing must not stop training either
                self._record_failure(None, f"{name} (logging)", err)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._set_up = True  # the plain key from here on (see `_compute_state_key`)
        self.__dict__.pop("state_key", None)  # a callback's key may have changed since (its summary_path)
        self._refuse_a_twin(trainer)
        self._forward("setup", trainer, pl_module, stage)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Forwarded, then the loggers get what the callbacks queued (a few scalars a batch end, see ``core.scalars``).
        Not a logging hook: it runs only while fitting."""
        pair = None
        try:
            for pair in self._step_on_train_batch_end:
                pair[0](trainer, pl_module, outputs, batch, batch_idx)
        except Exception as err:  # noqa: BLE001 - recorded, or a failed check raised once the rest have run
            self._step_failed("on_train_batch_end", pair, err, trainer, pl_module, outputs, batch, batch_idx)
        finally:
            if WAITING.count:
                try:
                    drain_scalars(trainer, batch_end=True)
                except Exception as err:  # noqa: BLE001 - a logger failing must not stop training either
                    self._record_failure(None, "on_train_batch_end (logging)", err)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._forward_logging("on_train_epoch_end", trainer, pl_module)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._forward_logging("on_validation_end", trainer, pl_module)

    def on_validation_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._forward_logging("on_validation_epoch_end", trainer, pl_module)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._forward_logging("on_train_end", trainer, pl_module)

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        pair = None
        try:
            for pair in self._step_on_after_backward:
                pair[0](trainer, pl_module)
        except Exception as err:  # noqa: BLE001 - see ``_step_failed``
            self._step_failed("on_after_backward", pair, err, trainer, pl_module)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        pair = None
        try:
            for pair in self._step_on_before_backward:
                pair[0](trainer, pl_module, loss)
        except Exception as err:  # noqa: BLE001 - see ``_step_failed``
            self._step_failed("on_before_backward", pair, err, trainer, pl_module, loss)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        pair = None
        try:
            for pair in self._step_on_before_optimizer_step:
                pair[0](trainer, pl_module, optimizer)
        except Exception as err:  # noqa: BLE001 - see ``_step_failed``
            self._step_failed("on_before_optimizer_step", pair, err, trainer, pl_module, optimizer)

    def on_before_zero_grad(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        pair = None
        try:
            for pair in self._step_on_before_zero_grad:
                pair[0](trainer, pl_module, optimizer)
        except Exception as err:  # noqa: BLE001 - see ``_step_failed``
            self._step_failed("on_before_zero_grad", pair, err, trainer, pl_module, optimizer)

    def on_exception(self, trainer: Any, pl_module: Any, exception: Any) -> None:
        self._forward("on_exception", trainer, pl_module, exception)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_fit_end", trainer, pl_module)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_fit_start", trainer, pl_module)

    def on_predict_batch_end(self, trainer: Any, pl_module: Any, outputs: Any,
                             batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._forward("on_predict_batch_end", trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_predict_batch_start(self, trainer: Any, pl_module: Any,
                               batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._forward("on_predict_batch_start", trainer, pl_module, batch, batch_idx, dataloader_idx)

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_predict_end", trainer, pl_module)

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_predict_epoch_end", trainer, pl_module)

    def on_predict_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_predict_epoch_start", trainer, pl_module)

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_predict_start", trainer, pl_module)

    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_sanity_check_end", trainer, pl_module)

    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_sanity_check_start", trainer, pl_module)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
        self._forward("on_save_checkpoint", trainer, pl_module, checkpoint)

    def on_test_batch_end(self, trainer: Any, pl_module: Any, outputs: Any,
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._forward("on_test_batch_end", trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_test_batch_start(self, trainer: Any, pl_module: Any,
                            batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._forward("on_test_batch_start", trainer, pl_module, batch, batch_idx, dataloader_idx)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_test_end", trainer, pl_module)

    def on_test_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_test_epoch_end", trainer, pl_module)

    def on_test_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_test_epoch_start", trainer, pl_module)

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_test_start", trainer, pl_module)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        pair = None
        try:
            for pair in self._step_on_train_batch_start:
                pair[0](trainer, pl_module, batch, batch_idx)
        except Exception as err:  # noqa: BLE001 - see ``_step_failed``
            self._step_failed("on_train_batch_start", pair, err, trainer, pl_module, batch, batch_idx)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_train_epoch_start", trainer, pl_module)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_train_start", trainer, pl_module)

    def on_validation_batch_end(self, trainer: Any, pl_module: Any, outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._forward("on_validation_batch_end", trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)

    def on_validation_batch_start(self, trainer: Any, pl_module: Any,
                                  batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._forward("on_validation_batch_start", trainer, pl_module, batch, batch_idx, dataloader_idx)

    def on_validation_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_validation_epoch_start", trainer, pl_module)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._forward("on_validation_start", trainer, pl_module)

    def teardown(self, trainer: Any, pl_module: Any, stage: Any) -> None:
        self._forward("teardown", trainer, pl_module, stage)
