"""EvalNoGradGuard: catch evaluation that runs with autograd on or with modules in training mode, and say what it
costs."""

from __future__ import annotations

import difflib
import weakref
from typing import Any, Dict, List, Optional, Sequence

import torch

from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer

from lightning_perf.callbacks.core import strategy_marks
from lightning_perf.callbacks.core.arguments import bad_argument, check_bool
from lightning_perf.callbacks.core.base import PerfCallback, guarded, reads_state
from lightning_perf.callbacks.core.scalars import log_scalars
from lightning_perf.callbacks.eval_no_grad_guard.messages import MB, TRAIN_HOOKS, train_mode_message
from lightning_perf.callbacks.eval_no_grad_guard.messages import fmt_bytes as _fmt_bytes
from lightning_perf.callbacks.eval_no_grad_guard.messages import how_it_ran as _how
from lightning_perf.callbacks.eval_no_grad_guard.state import read_state
from lightning_perf.errors import PerfCheckFailed
from lightning_perf.measure.evaluation.autograd import EvalForwardWatch, calling_site, find_retained_graphs
from lightning_perf.measure.evaluation.train_mode import MAX_MODULE_NAMES, ModesBetweenSteps, TrainModeWatch
from lightning_perf.measure.memory.user_phases import add_listener, remove_listener

MODES = ("warn", "raise", "fix")


def known_hooks() -> List[str]:
    """Names a user may allow: every Callback and LightningModule hook (``on_*``) and the ``*_step`` methods."""
    names = {n for cls in (Callback, LightningModule) for n in dir(cls)
             if n.startswith("on_") or n.endswith("_step")}
    return sorted(names)


class EvalNoGradGuard(PerfCallback):
    r"""Finds evaluation that runs with autograd on or in training mode, says where, and measures what it costs.

    Watches, outside the training step (from the end of each training batch to the start of the next, and through
    validation, test and predict), for forwards of modules in eval mode while ``torch.is_grad_enabled()``: sampling or
    evaluating an EMA model from ``on_train_batch_end``, metrics under ``torch.enable_grad()`` or
    ``Trainer(inference_mode=False)``. For each it records the site (the Lightning hook or callback it ran from), the
    module class, how often, and the bytes autograd saved for a backward that never ran. At the end of each training
    and validation epoch it scans the LightningModule's lists, dicts and tuples for tensors that carry an autograd
    graph (``self.outputs.append(loss)``) and reports the attribute, count and bytes kept alive.

    With ``check_train_mode``, it also finds evaluation run with the LightningModule's mode-dependent modules in
    training mode (BatchNorm normalising with batch statistics and updating its running ones, Dropout dropping):
    in validation, test and predict runs, and in ``lightning_perf.phase("eval_in_train_hooks")``. For each it records
    the phase, the site (the hook that opened the phase), how many forwards, which modules (qualified names) and
    whether BatchNorm's running statistics changed (its ``num_batches_tracked`` counters, read at the phase's start
    and end).

    Between training steps (from the step's end, marked by the strategy's ``post_training_step`` or
    ``optimizer_step``, to the next batch's start) a forward of the LightningModule or of one of its modules with
    parameters is evaluation whatever the modes: with autograd on it is a finding (``training_mode`` where the
    module was in training mode: ``self.net.eval(); self(x)``), and with BatchNorm or Dropout in training mode a
    training-mode finding of phase ``train_hooks`` naming those that forward ran, with or without a ``phase``
    mark.

    Args:
        mode: ``"warn"`` one warning per site with the fix; ``"raise"`` fail at the first finding (for CI);
            ``"fix"`` run such forwards under ``torch.no_grad()`` and report that it did (training mode in
            evaluation is reported as in ``"warn"``: which mode a module should have is the user's to say).
        allow: hook names where grad in eval is wanted (e.g. ``["on_test_batch_end"]``); see also
            :func:`lightning_perf.allow_grad_in_eval`.
        scan_retained: scan the module's attributes for retained graphs at epoch ends.
        check_train_mode: find evaluation run with BatchNorm or Dropout in training mode.
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.

    Logged metrics (at the end of each training epoch and of fit): ``guard/grad_enabled_eval_forwards`` (count so
    far), ``guard/saved_for_backward_mb`` (MB saved for backward by those forwards so far),
    ``guard/train_mode_eval_forwards`` (evaluation forwards in training mode so far, with ``check_train_mode``).

    Raises:
        ValueError: for an unknown ``mode`` or an unknown hook name in ``allow``.

    Example::

        trainer = Trainer(callbacks=[EvalNoGradGuard(mode="raise", allow=["on_test_batch_end"])])
    """

    section_name = "eval_no_grad_guard"
    _transient = ("_module_ref", "_model_ids", "_ids_after_eval", "_between_now", "_step_end")

    def __init__(self, mode: str = "warn", allow: Optional[Sequence[str]] = None, scan_retained: bool = True,
                 summary_path: Optional[str] = None, run_name: Optional[str] = None,
                 run_notes: Optional[str] = None, check_train_mode: bool = True) -> None:
        super().__init__(summary_path=summary_path, run_name=run_name, run_notes=run_notes)
        if mode not in MODES:
            raise bad_argument("EvalNoGradGuard", "mode", mode, f"Possible choices are: {', '.join(MODES)}.")
        if isinstance(allow, str) or not all(isinstance(h, str) for h in (allow or [])):
            raise bad_argument("EvalNoGradGuard", "allow", allow, "Expected a list of hook names.")
        allow = list(allow or [])
        hooks = known_hooks()
        unknown = [h for h in allow if h not in hooks]
        if unknown:
            hints = {h: difflib.get_close_matches(h, hooks, n=1) for h in unknown}
            said = ", ".join(f"{h!r}" + (f" (did you mean {m[0]!r}?)" if m else "") for h, m in hints.items())
            raise bad_argument("EvalNoGradGuard", "allow", allow,
                               f"Unknown hook names: {said}. Possible choices are Lightning hook names such as"
                               " on_train_batch_end, on_validation_epoch_end, validation_step, test_step.")
        self.mode = mode
        self.allow = allow
        self.scan_retained = check_bool("EvalNoGradGuard", "scan_retained", scan_retained)
        self.check_train_mode = check_bool("EvalNoGradGuard", "check_train_mode", check_train_mode)
        self._train_mode = TrainModeWatch()
        self._module_ref: Any = None  # a weak reference to the LightningModule, for phases a training hook opens
        self._in_phase = False  # watching a `phase("eval_in_train_hooks")` the user's code opened
        self._watch = EvalForwardWatch(self._on_finding, self._is_allowed, fix=(mode == "fix"),
                                       hooks=frozenset(hooks), owners=(Callback, LightningModule, LightningDataModule))
        self._watch.on_model_forward = self._on_model_forward
        self._watch.on_model_forward_end = self._on_model_forward_end
        self._between_now: Any = None  # (site, modules in training mode) of the top-level forward between steps now
        self._step_end: Any = None  # the strategy method that marks the training step's end (see on_train_start)
        self._in_step = False  # inside the strategy's optimizer_step (automatic optimization)
        self._model_ids: Any = None  # the LightningModule's modules with parameters, found at the train start
        self._between_steps = ModesBetweenSteps()
        self._ids_after_eval: Any = None  # the watch's model ids to give back when an evaluation run ends
        self._reset()

    def _reset(self) -> None:
        self._findings: Dict[tuple, Dict[str, Any]] = {}
        self._retained: Dict[str, Dict[str, Any]] = {}
        self._events = 0  # findings so far, all sites
        self._eval_batches = 0  # batches of the evaluation run in progress
        self._eval_start_events = 0  # findings before its first batch
        self._automatic = True  # the module's automatic_optimization, read at train start
        self._train_mode_findings: Dict[tuple, Dict[str, Any]] = {}  # (phase, site) -> finding
        self._train_mode_problem: Optional[str] = None  # why the train-mode figures may be incomplete
        self._pending_failure: Optional[PerfCheckFailed] = None  # mode="raise", found where it cannot raise

    def _is_allowed(self, hook: Optional[str]) -> bool:
        return hook is not None and hook in self.allow

    # -- findings ------------------------------------------------------------------------------------------------
    def _on_finding(self, site: str, hook: Optional[str], module: str, saved: int, fixed: bool,
                    training_mode: bool = False) -> None:
        key = (site, module)
        entry = self._findings.get(key)
        first = entry is None
        if first:
            entry = self._findings[key] = {"site": site, "hook": hook, "module": module, "count": 0,
                                           "saved_for_backward_bytes": 0, "fixed": fixed,
                                           "training_mode": training_mode}
        entry["count"] += 1
        entry["saved_for_backward_bytes"] += saved
        self._events += 1
        how = _how(training_mode, self._watch.eval_inside)
        if fixed:
            if first:
                self._warn_once(f"fix:{site}", f"{site} ran {module}.forward {how};"
                                " mode='fix' ran it under torch.no_grad() (and will each time).")
            return
        allow_it = (f"`EvalNoGradGuard(allow=[{hook!r}])` or `with lightning_perf.allow_grad_in_eval():`" if hook else
                    "`with lightning_perf.allow_grad_in_eval():` (no Callback or LightningModule hook method was on"
                    " the stack, so `allow=` cannot name this site)")
        message = (
            f"{site} ran {module}.forward {how}: {_fmt_bytes(saved)} of activations were"
            " kept for a backward that never ran. Wrap the evaluation in `with torch.no_grad():` (or"
            f" torch.inference_mode()). If gradients are wanted here, allow it with {allow_it}."
        )
        if self.mode == "raise":
            raise PerfCheckFailed(f"EvalNoGradGuard: {message}")
        self._warn_once(f"site:{site}:{module}", message)

    def _scan(self, pl_module: LightningModule, hook: str) -> None:
        if not self.scan_retained:
            return
        for attr, found in find_retained_graphs(pl_module).items():
            kept = found["tensor_bytes"] + found["graph_bytes"]
            record = self._retained.setdefault(attr, {"attribute": attr, "seen_at": hook, "max_count": 0,
                                                      "max_bytes_kept": 0, "epochs_seen": 0})
            record["max_count"] = max(record["max_count"], found["count"])
            record["max_bytes_kept"] = max(record["max_bytes_kept"], kept)
            record["epochs_seen"] += 1
            message = (
                f"`{type(pl_module).__name__}.{attr}` holds {found['count']} tensors with autograd graphs at"
                f" {hook}, keeping {_fmt_bytes(kept)} alive. Store `.detach()`ed tensors (or"
                " `.item()` for scalars) instead."
            )
            if self.mode == "raise":
                raise PerfCheckFailed(f"EvalNoGradGuard: {message}")
            self._warn_once(f"retained:{attr}", message)

    # -- training mode in evaluation -----------------------------------------------------------------------------
    def _train_mode_failed(self, where: str, err: BaseException) -> None:
        self._record_failure(f"training-mode check ({where})", err)
        self._train_mode_problem = (f"the training-mode check failed at {where} ({type(err).__name__}: {err}); its"
                                    " figures may miss forwards")

    def _start_train_mode(self, pl_module: LightningModule, phase: str, site: Optional[str] = None) -> None:
        if not self.check_train_mode:
            return
        try:
            self._train_mode.start(pl_module, phase, site)
        except Exception as err:  # noqa: BLE001 - a measurement must never stop training
            self._train_mode.abandon()
            self._train_mode_failed(f"the start of {phase}", err)

    def _stop_train_mode(self, can_raise: bool = True) -> None:
        """Ends the evaluation run being watched; ``can_raise``: where ``mode="raise"`` may raise now (else at the
        next training batch start, validation start or epoch end)."""
        if not self._train_mode.running:
            return
        phase = self._train_mode.phase
        try:
            result = self._train_mode.stop()
        except Exception as err:  # noqa: BLE001 - a measurement must never stop training
            self._train_mode_failed(f"the end of {phase}", err)
            return
        if result is not None:
            self._on_train_mode_finding(result, can_raise)

    def _on_train_mode_finding(self, result: Dict[str, Any], can_raise: bool, runs: int = 1) -> None:
        """``runs``: evaluation runs this finding ends (0 for a forward between training steps, which is counted in
        ``forwards`` alone)."""
        phase, site = result["phase"], result["site"]
        entry = self._train_mode_findings.get((phase, site))
        if entry is None:
            entry = self._train_mode_findings[(phase, site)] = {
                "phase": phase, "site": site, "runs": 0, "forwards": None, "modules": [], "module_types": [],
                "module_count": 0, "running_stats_changed": False, "uncounted": []}
        entry["runs"] += runs
        if result["forwards"] is not None:
            entry["forwards"] = (entry["forwards"] or 0) + result["forwards"]
        for name in result["uncounted"]:
            if name not in entry["uncounted"] and len(entry["uncounted"]) < MAX_MODULE_NAMES:
                entry["uncounted"].append(name)
        for name, (kind, _) in result["modules"].items():
            if name not in entry["modules"] and len(entry["modules"]) < MAX_MODULE_NAMES:
                entry["modules"].append(name)
            if kind not in entry["module_types"] and len(entry["module_types"]) < MAX_MODULE_NAMES:
                entry["module_types"].append(kind)
        entry["module_count"] = max(entry["module_count"], len(result["modules"]))
        entry["running_stats_changed"] = entry["running_stats_changed"] or result["running_stats_changed"]
        message = train_mode_message(result)
        if self.mode == "raise":
            failure = PerfCheckFailed(f"EvalNoGradGuard: {message}")
            if can_raise:
                raise failure
            self._pending_failure = self._pending_failure or failure
            return
        self._warn_once(f"train_mode:{phase}:{site}", message)

    def _on_model_forward(self, module: Any) -> Any:
        """A top-level forward of the LightningModule's modules between training steps (the watch calls it): the ids
        of its mode-dependent modules in training mode, for the watch to note which of them this forward runs (None
        when there are none). Inside `phase("eval_in_train_hooks")` the phase's own check counts them."""
        self._between_now = None
        if not self.check_train_mode or self._in_phase:
            return None
        try:
            root = self._module_ref() if self._module_ref is not None else None
            training = self._between_steps.training(module, root)
            if training:  # the site while the user's hook is on the stack
                self._between_now = (calling_site(self._watch.hooks, self._watch.owners)[0], training)
                return training
        except Exception as err:  # noqa: BLE001 - a measurement must never stop training
            self._train_mode_failed("a forward between training steps", err)
        return None

    def _on_model_forward_end(self, module: Any, ran: Any) -> None:
        """Its end: with modules in training mode that it ran, a finding of phase ``train_hooks`` at the calling
        site. Never raises: ``mode="raise"`` raises at the next hook that can."""
        now, self._between_now = self._between_now, None
        if now is None:
            return
        try:
            found = self._between_steps.found(module, now[1], ran)
            if found is not None:
                self._on_train_mode_finding({**found, "phase": TRAIN_HOOKS, "site": now[0]}, can_raise=False, runs=0)
        except Exception as err:  # noqa: BLE001 - a measurement must never stop training
            self._train_mode_failed("a forward between training steps", err)

    def _raise_pending(self) -> None:
        failure, self._pending_failure = self._pending_failure, None
        if failure is not None:
            raise failure

    def _on_phase(self, name: str, entering: bool) -> None:
        """A phase the user's code opened (``with lightning_perf.phase("eval_in_train_hooks"):``) is an evaluation
        run of the LightningModule, watched unless a Lightning evaluation run already is. Its end cannot raise
        (phases never raise into the user's hook): ``mode="raise"`` raises at the next hook that can."""
        try:
            if entering:
                module = self._module_ref() if self._module_ref is not None else None
                if module is None or self._train_mode.running or not self.check_train_mode:
                    return
                site, _ = calling_site(self._watch.hooks, self._watch.owners)
                self._in_phase = True
                self._start_train_mode(module, name, site)
            elif self._in_phase:
                self._in_phase = False
                self._stop_train_mode(can_raise=False)
        except Exception as err:  # noqa: BLE001 - a measurement must never stop training
            self._train_mode_failed(f"phase {name!r}", err)

    def _train_mode_batch(self) -> None:
        """Dropout-like modules are hooked for the first batch of each evaluation run, and later only while one is
        in training mode or was found so in this run: a hook puts each call of its module on PyTorch's slow path.
        BatchNorm needs no hook: its own counters say how often it ran in training mode."""
        watch = self._train_mode
        if watch.note_modes():
            watch.watch()
        elif self._eval_batches > 0 and not watch.found_random:
            watch.quiet()

    # -- Lightning hooks -----------------------------------------------------------------------------------------
    @guarded
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._carry_or_reset(trainer, self._reset)
            self._start_run(trainer)
        else:
            self._reset()
        self._watch.refresh()
        self._watch.arm()
        self._module_ref = weakref.ref(pl_module)
        if self.check_train_mode:
            add_listener(self._on_phase)

    @guarded
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # read once, after the module's own setup, configure_model and on_fit_start could set it: a property costs
        # ~1 µs right after a backward
        self._automatic = pl_module.automatic_optimization
        # The modules a forward between training steps is evaluation of: those with parameters (a metric's update
        # in a batch-end hook builds no graph and is no evaluation).
        self._model_ids = frozenset(id(m) for m in pl_module.modules() if next(m.parameters(), None) is not None)
        self._between_steps.reset()
        # No hook marks the step's end before callbacks' on_train_batch_end: the strategy's methods do. Manual
        # optimization: post_training_step, right after training_step returns. Automatic: the end of optimizer_step
        # (an LBFGS closure runs training_step again inside it), or the backward of a batch that does not step.
        strategy_marks.uninstall(self._step_end)
        self._in_step = False
        if self._automatic:
            self._step_end = strategy_marks.install(trainer.strategy, "optimizer_step", self._step_starts,
                                                    self._step_over)
        else:
            self._step_end = strategy_marks.install(trainer.strategy, "post_training_step", self._step_over)

    def _step_starts(self) -> None:
        self._in_step = True

    def _step_over(self) -> None:
        """The training step is over: from here the LightningModule's forwards are evaluation, also in the
        ``on_train_batch_end`` of callbacks listed before this one (an image logger sampling every N batches)."""
        self._in_step = False
        try:
            if not self._watch.armed:
                self._watch.arm()
            self._watch.model_ids = self._model_ids
        except Exception as err:  # noqa: BLE001 - a measurement must never stop training
            self._record_failure("the end of the training step", err)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._pending_failure is not None:  # mode="raise": found in a phase the last batch's hooks opened
            self._raise_pending()
        try:
            watch = self._watch
            watch.disarm()  # the training step's own forward takes PyTorch's fast path
            watch.model_ids = None
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_train_batch_start", err)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        try:
            # Automatic optimization: the training step is over once backward returns, so callbacks listed before
            # this one are watched in their on_train_batch_end. Under manual optimization more forwards may follow
            # inside training_step (an eval-mode discriminator with grad on is legitimate there).
            if self._automatic:
                self._watch.arm()
                if self._step_end is not None and not self._in_step:  # a batch that accumulates: no step follows
                    self._watch.model_ids = self._model_ids
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_after_backward", err)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        try:
            watch = self._watch
            if not watch.armed:  # armed at the step's end already, where the strategy marks it
                watch.arm()
            # From here to the next batch's start the LightningModule's own forwards are evaluation too (also where
            # the strategy has no method to mark the step's end by)
            watch.model_ids = self._model_ids
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_train_batch_end", err)

    def _eval_batch(self) -> None:
        """Global module hooks put every nn.Module call on PyTorch's slow path, so an evaluation run is watched
        only where it can go wrong. Under inference mode (``trainer.validate/test/predict`` by default) no forward
        can build a graph, not even inside ``enable_grad()``: not watched. Under ``no_grad`` (validation during fit)
        a step may enable grad: the first batch of each run is watched, and the rest only if it found something."""
        if torch.is_inference_mode_enabled():
            self._watch.disarm()
        elif self._eval_batches == 0:
            self._eval_start_events = self._events
            self._watch.arm()
        elif self._eval_batches == 1 and self._events == self._eval_start_events:
            self._watch.disarm()  # the first batch found nothing: the rest of this run goes unwatched
        if self._train_mode.running:
            self._train_mode_batch()
        self._eval_batches += 1

    def _eval_run_start(self, pl_module: LightningModule, phase: str) -> None:
        self._eval_batches = 0
        # Lightning's evaluation runs have checks of their own; validation inside fit gives the gap back after it
        self._ids_after_eval, self._watch.model_ids = self._watch.model_ids, None
        self._watch.refresh()
        self._start_train_mode(pl_module, phase)  # after Lightning's model.eval(), before the first batch

    @guarded
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._raise_pending()
        self._eval_run_start(pl_module, "validation")

    @guarded
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_run_start(pl_module, "test")

    @guarded
    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_run_start(pl_module, "predict")

    @guarded
    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        self._eval_batch()

    @guarded
    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        self._eval_batch()

    @guarded
    def on_predict_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        self._eval_batch()

    @guarded
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._watch.arm()  # back to watching what runs between training steps
        self._watch.model_ids, self._ids_after_eval = self._ids_after_eval, None
        self._stop_train_mode()  # before Lightning's model.train()

    @guarded
    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_train_mode()

    @guarded
    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_train_mode()

    @guarded
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._raise_pending()
        self._watch.arm()
        self._scan(pl_module, "on_train_epoch_end")
        self._log(trainer)

    @guarded
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._scan(pl_module, "on_validation_epoch_end")

    @guarded
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._raise_pending()
        self._log(trainer)

    def _log(self, trainer: Trainer) -> None:
        scalars = {
            "guard/grad_enabled_eval_forwards": float(sum(f["count"] for f in self._findings.values())),
            "guard/saved_for_backward_mb": sum(f["saved_for_backward_bytes"] for f in self._findings.values()) / MB,
        }
        if self.check_train_mode:
            scalars["guard/train_mode_eval_forwards"] = float(
                sum(f["forwards"] for f in self._train_mode_findings.values()))
        log_scalars(trainer, scalars)

    @guarded
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write_summary(trainer)

    @guarded
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._watch.disarm()
        self._watch.model_ids = None
        self._between_steps.reset()  # it holds the model's modules
        self._between_now = None
        strategy_marks.uninstall(self._step_end)
        self._step_end = None
        self._end_watching()
        self._flush_summary(trainer)

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._watch.disarm()  # no teardown hook follows an exception
        self._watch.model_ids = None
        self._between_steps.reset()
        self._between_now = None
        strategy_marks.uninstall(self._step_end)
        self._step_end = None
        self._end_watching()
        self._write_summary(trainer, exception)

    def _end_watching(self) -> None:
        """An evaluation run cut short (an exception) is counted as far as it went; nothing raises here."""
        remove_listener(self._on_phase)
        self._in_phase = False
        self._stop_train_mode(can_raise=False)

    # -- results -------------------------------------------------------------------------------------------------
    @property
    def findings(self) -> List[Dict[str, Any]]:
        """Eval-mode forwards with grad on, one entry per (site, module)."""
        return [dict(f) for f in self._findings.values()]

    @property
    def retained(self) -> List[Dict[str, Any]]:
        """Module attributes found holding tensors with autograd graphs."""
        return [dict(r) for r in self._retained.values()]

    def _summary_section(self) -> Dict[str, Any]:
        findings = []
        for f in self._findings.values():
            entry = dict(f)
            entry["saved_for_backward_mb"] = entry.pop("saved_for_backward_bytes") / MB
            findings.append(entry)
        retained = []
        for r in self._retained.values():
            entry = dict(r)
            entry["max_mb_kept"] = entry.pop("max_bytes_kept") / MB
            retained.append(entry)
        train_mode = self.train_mode_findings
        unavailable = {}
        if not self.check_train_mode:
            unavailable["train_mode_eval_forwards"] = "not checked: EvalNoGradGuard(check_train_mode=False)"
        elif self._train_mode_problem is not None:
            unavailable["train_mode_eval_forwards"] = self._train_mode_problem
        elif any(f["uncounted"] for f in train_mode):
            names = sorted({n for f in train_mode for n in f["uncounted"]})
            unavailable["train_mode_eval_forwards"] = (
                f"{', '.join(names)} ran in training mode inside a torch.compile'd module, whose compiled code does"
                " not run the hooks that count their forwards")
        clean: Optional[bool] = not findings and not retained and not train_mode
        if clean and self.check_train_mode and self._train_mode_problem is not None:
            clean = None  # fails closed: a check that failed found nothing, which says nothing
        section = {
            "mode": self.mode,
            "allow": list(self.allow),
            "clean": clean,
            "grad_enabled_eval_forwards": sum(f["count"] for f in findings),
            "saved_for_backward_mb": sum(f["saved_for_backward_mb"] for f in findings),
            "findings": findings,
            "retained_graphs": retained,
            "check_train_mode": self.check_train_mode,
            "train_mode_eval_forwards": (None if unavailable else sum(f["forwards"] or 0 for f in train_mode)),
            "train_mode_findings": train_mode,
        }
        if unavailable:
            section["unavailable"] = unavailable
        return section

    @property
    def train_mode_findings(self) -> List[Dict[str, Any]]:
        """Evaluation run with modules in training mode, one entry per (phase, site)."""
        return [{**f, "modules": list(f["modules"]), "module_types": list(f["module_types"]),
                 "uncounted": list(f["uncounted"])} for f in self._train_mode_findings.values()]

    def state_dict(self) -> Dict[str, Any]:
        return {"findings": self.findings, "retained": self.retained, "train_mode_findings": self.train_mode_findings}

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        findings, retained, train_mode = read_state(state_dict)
        self._findings.update(findings)  # all read: nothing is assigned from a state that fails halfway
        self._retained.update(retained)
        self._train_mode_findings.update(train_mode)
