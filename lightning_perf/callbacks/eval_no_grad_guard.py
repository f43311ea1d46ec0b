"""EvalNoGradGuard: catch evaluation that runs with autograd on, and measure what it costs."""

from __future__ import annotations

import difflib
from typing import Any, Dict, List, Optional, Sequence

import torch

from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer

from lightning_perf.callbacks._arguments import bad_argument, check_bool
from lightning_perf.callbacks._base import PerfCallback, guarded, reads_state
from lightning_perf.callbacks._scalars import log_scalars
from lightning_perf.callbacks._state import StateError, StateReader
from lightning_perf.errors import PerfCheckFailed
from lightning_perf.measure.autograd import EvalForwardWatch, find_retained_graphs

MODES = ("warn", "raise", "fix")
MB = 1024.0 * 1024.0


def known_hooks() -> List[str]:
    """Names a user may allow: every Callback and LightningModule hook (``on_*``) and the ``*_step`` methods."""
    names = {n for cls in (Callback, LightningModule) for n in dir(cls)
             if n.startswith("on_") or n.endswith("_step")}
    return sorted(names)


def _fmt_bytes(n: float) -> str:
    if n >= 1024 * MB:
        return f"{n / MB / 1024:.2f} GB"
    return f"{n / MB:.1f} MB" if n >= MB else f"{n / 1024:.1f} kB"


class EvalNoGradGuard(PerfCallback):
    r"""Finds evaluation that runs with autograd on, says where, and measures the memory it keeps.

    Watches, outside the training step (from the end of each training batch to the start of the next, and through
    validation, test and predict), for forwards of modules in eval mode while ``torch.is_grad_enabled()``: sampling or
    evaluating an EMA model from ``on_train_batch_end``, metrics under ``torch.enable_grad()`` or
    ``Trainer(inference_mode=False)``. For each it records the site (the Lightning hook or callback it ran from), the
    module class, how often, and the bytes autograd saved for a backward that never ran. At the end of each training
    and validation epoch it scans the LightningModule's lists, dicts and tuples for tensors that carry an autograd
    graph (``self.outputs.append(loss)``) and reports the attribute, count and bytes kept alive.

    Args:
        mode: ``"warn"`` one warning per site with the fix; ``"raise"`` fail at the first finding (for CI);
            ``"fix"`` run such forwards under ``torch.no_grad()`` and report that it did.
        allow: hook names where grad in eval is wanted (e.g. ``["on_test_batch_end"]``); see also
            :func:`lightning_perf.allow_grad_in_eval`.
        scan_retained: scan the module's attributes for retained graphs at epoch ends.
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.

    Logged metrics (at the end of each training epoch and of fit): ``guard/grad_enabled_eval_forwards`` (count so
    far), ``guard/saved_for_backward_mb`` (MB saved for backward by those forwards so far).

    Raises:
        ValueError: for an unknown ``mode`` or an unknown hook name in ``allow``.

    Example::

        trainer = Trainer(callbacks=[EvalNoGradGuard(mode="raise", allow=["on_test_batch_end"])])
    """

    section_name = "eval_no_grad_guard"

    def __init__(self, mode: str = "warn", allow: Optional[Sequence[str]] = None, scan_retained: bool = True,
                 summary_path: Optional[str] = None, run_name: Optional[str] = None,
                 run_notes: Optional[str] = None) -> None:
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
        self._watch = EvalForwardWatch(self._on_finding, self._is_allowed, fix=(mode == "fix"),
                                       hooks=frozenset(hooks), owners=(Callback, LightningModule, LightningDataModule))
        self._reset()

    def _reset(self) -> None:
        self._findings: Dict[tuple, Dict[str, Any]] = {}
        self._retained: Dict[str, Dict[str, Any]] = {}
        self._events = 0  # findings so far, all sites
        self._eval_batches = 0  # batches of the evaluation run in progress
        self._eval_start_events = 0  # findings before its first batch
        self._automatic = True  # the module's automatic_optimization, read at train start

    def _is_allowed(self, hook: Optional[str]) -> bool:
        return hook is not None and hook in self.allow

    # -- findings ------------------------------------------------------------------------------------------------
    def _on_finding(self, site: str, hook: Optional[str], module: str, saved: int, fixed: bool) -> None:
        key = (site, module)
        entry = self._findings.get(key)
        first = entry is None
        if first:
            entry = self._findings[key] = {"site": site, "hook": hook, "module": module, "count": 0,
                                           "saved_for_backward_bytes": 0, "fixed": fixed}
        entry["count"] += 1
        entry["saved_for_backward_bytes"] += saved
        self._events += 1
        if fixed:
            if first:
                self._warn_once(f"fix:{site}", f"{site} ran {module}.forward in eval mode with autograd on;"
                                " mode='fix' ran it under torch.no_grad() (and will each time).")
            return
        allow_it = (f"`EvalNoGradGuard(allow=[{hook!r}])` or `with lightning_perf.allow_grad_in_eval():`" if hook else
                    "`with lightning_perf.allow_grad_in_eval():` (no Callback or LightningModule hook method was on"
                    " the stack, so `allow=` cannot name this site)")
        message = (
            f"{site} ran {module}.forward in eval mode with autograd on: {_fmt_bytes(saved)} of activations were"
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

    @guarded
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # read once, after the module's own setup, configure_model and on_fit_start could set it: a property costs
        # ~1 µs right after a backward
        self._automatic = pl_module.automatic_optimization

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        try:
            self._watch.disarm()  # the training step's own forward takes PyTorch's fast path
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_train_batch_start", err)

    def on_after_backward(self, trainer: Trainer, pl_module: LightningModule) -> None:
        try:
            # Automatic optimization: the training step is over once backward returns, so callbacks listed before
            # this one are watched in their on_train_batch_end. Under manual optimization more forwards may follow
            # inside training_step (an eval-mode discriminator with grad on is legitimate there).
            if self._automatic:
                self._watch.arm()
        except Exception as err:  # noqa: BLE001 - `guarded`, inline (its docstring says why)
            self._record_failure("on_after_backward", err)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        try:
            watch = self._watch
            if not watch.armed:  # armed after the backward already, under automatic optimization
                watch.arm()
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
        self._eval_batches += 1

    def _eval_run_start(self) -> None:
        self._eval_batches = 0
        self._watch.refresh()

    @guarded
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_run_start()

    @guarded
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_run_start()

    @guarded
    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._eval_run_start()

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

    @guarded
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._watch.arm()
        self._scan(pl_module, "on_train_epoch_end")
        self._log(trainer)

    @guarded
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._scan(pl_module, "on_validation_epoch_end")

    @guarded
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._log(trainer)

    def _log(self, trainer: Trainer) -> None:
        log_scalars(trainer, {
            "guard/grad_enabled_eval_forwards": float(sum(f["count"] for f in self._findings.values())),
            "guard/saved_for_backward_mb": sum(f["saved_for_backward_bytes"] for f in self._findings.values()) / MB,
        })

    @guarded
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write_summary(trainer)

    @guarded
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._watch.disarm()
        self._flush_summary(trainer)

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._watch.disarm()  # no teardown hook follows an exception
        self._write_summary(trainer, exception)

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
        return {
            "mode": self.mode,
            "allow": list(self.allow),
            "clean": not findings and not retained,
            "grad_enabled_eval_forwards": sum(f["count"] for f in findings),
            "saved_for_backward_mb": sum(f["saved_for_backward_mb"] for f in findings),
            "findings": findings,
            "retained_graphs": retained,
        }

    def state_dict(self) -> Dict[str, Any]:
        return {"findings": self.findings, "retained": self.retained}

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        s = StateReader(state_dict)
        findings = {}
        for f in s.records("findings"):
            entry = {"site": f.text("site", allow_none=False), "hook": f.text("hook"),
                     "module": f.text("module", allow_none=False), "count": f.count("count"),
                     "saved_for_backward_bytes": f.count("saved_for_backward_bytes"), "fixed": f.flag("fixed")}
            if entry["site"] is None or entry["module"] is None:
                raise StateError(f"{f.where} lacks its site or module")
            findings[(entry["site"], entry["module"])] = {**f.data, **entry}
        retained = {}
        for r in s.records("retained"):
            record = {"attribute": r.text("attribute", allow_none=False), "seen_at": r.text("seen_at"),
                      "max_count": r.count("max_count"), "max_bytes_kept": r.count("max_bytes_kept"),
                      "epochs_seen": r.count("epochs_seen")}
            if record["attribute"] is None:
                raise StateError(f"{r.where} lacks its attribute")
            retained[record["attribute"]] = {**r.data, **record}
        self._findings.update(findings)  # all read: nothing is assigned from a state that fails halfway
        self._retained.update(retained)
