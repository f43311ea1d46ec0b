"""QualityGate: PSNR, SSIM, LPIPS and L1 (or any logged metric) against a baseline, so speed never costs quality
silently."""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence, Union

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info

from lightning_perf.callbacks.core.arguments import bad_argument, check_bool, check_path, check_positive_int
from lightning_perf.callbacks.core.base import PerfCallback, guarded, reads_state
from lightning_perf.callbacks.core.scalars import log_scalars
from lightning_perf.callbacks.core.state import StateError, StateReader
from lightning_perf.callbacks.core.summary_book import check_writable, error_message
from lightning_perf.callbacks.quality_gate.check_schedule import check_at_steps, is_due, schedule_text, unreachable
from lightning_perf.callbacks.quality_gate.tolerance import (
    DEFAULT_TOLERANCE_MODE,
    MAX_TOLERANCE,
    TOLERANCE_MODES,
    check_tolerance,
    check_tolerance_mode,
    per_metric,
)
from lightning_perf.errors import PerfCheckFailed, PerfConfigError
from lightning_perf.measure.quality.image_quality import (
    IMAGE_METRICS,
    LPIPS_NETS,
    LpipsUnavailable,
    build_image_metrics,
    load_lpips,
)
from lightning_perf.measure.quality.image_scoring import compute_scores, image_pair, score_batch
from lightning_perf.summary.baseline import DEFAULT_TOLERANCE, BaselineError, gate_baseline, verdict, write_baseline
from lightning_perf.summary.fields import IMAGE_METRIC_DIRECTIONS
from lightning_perf.summary.quality_verdict import failure_message, on_never_checked, times, verdict_line

__all__ = ["QualityGate", "ACTIONS", "MODES", "TOLERANCE_MODES", "DEFAULT_TOLERANCE_MODE", "MAX_TOLERANCE"]

ACTIONS = ("warn", "fail", "stop")
MODES = ("max", "min")
_MAX_FAILED_RECORDS = 100


class QualityGate(PerfCallback):
    r"""Measures image quality during validation and gates it against a baseline within a tolerance.

    PSNR and SSIM (torchmetrics, with ``data_range``; PSNR is the mean of per-image PSNR), L1 (mean absolute
    error) and LPIPS (the ``lpips`` package, inputs in [0, data_range] mapped to [-1, 1]) are computed under
    ``torch.no_grad()`` from each ``validation_step``'s outputs — a dict with ``preds_key``/``target_key`` or a
    ``(preds, target)`` tuple — and accumulated over the validation epoch with torchmetrics, so DDP gives the numbers
    of one process. Any metric the module logs can be gated too (``monitor={"val/acc": "max"}``).

    Args:
        metrics: image metrics to compute, from ``psnr``, ``ssim``, ``l1``, ``lpips``; ``[]`` for none.
        monitor: logged metric name -> ``"max"`` or ``"min"`` (which way is better), gated like the image metrics.
        baseline: metric -> value, or a path to a baseline file (``record_baseline``) or to an earlier run's
            ``perf_summary.json``, read once, as the CLI reads summaries (its one-line errors). Every gated metric
            must be in it. None: measure and log, no verdict.
        tolerance: allowed loss in the bad direction, relative to the baseline (0.005 = 0.5%) or absolute; one number
            or metric -> number.
        tolerance_mode: ``"relative"`` or ``"absolute"``, or metric -> mode.
        action: ``"warn"``; ``"fail"`` (the fit ends with an error after the summary is written); ``"stop"`` (stop
            training at the first failing check, the same decision on every rank). A gate with a baseline that ran no
            check by the end of the fit has not passed (``passed: false``, ``reason: "never checked: ..."``): with
            ``"fail"`` the fit fails, with ``"warn"`` and ``"stop"`` it warns.
        at_steps: check only at validations run at these global steps; ``every_n_steps``: or at multiples of N.
            Neither: every validation run.
        record_baseline: write this run's last checked values to this path at fit end, as a baseline file.
        preds_key, target_key: keys of the dict ``validation_step`` returns.
        data_range: the value range of images (1.0 for [0, 1], 255 for bytes).
        lpips_net: LPIPS backbone: ``alex``, ``vgg``, ``squeeze``.
        lpips_weights_dir: a torch hub folder whose ``checkpoints/`` holds torchvision's backbone weights, for
            machines without internet. A load that fails is tried once per process.
        lpips_pretrained: False uses a random backbone (``pnet_rand=True``): plumbing tests only, not LPIPS.
        require_same_step: a check at another global step than the baseline's (a baseline file's ``step``, an
            earlier summary's ``quality_gate.step``) fails, naming both steps; False (default): it warns once and
            is gated. A baseline without a step (a dict) is not checked for it.
        summary_path: where the run's summary goes; default ``<trainer.log_dir>/perf_summary.json``.

    Logged metrics: ``quality/psnr``, ``quality/ssim``, ``quality/lpips``, ``quality/l1`` and ``quality/gate_passed``
    (1 or 0, when a baseline is set), all of one validation at one step (``trainer.global_step``) to every logger;
    the metric values also go to ``trainer.callback_metrics`` (``pl_module.log(..., logger=False)``), so
    ``ModelCheckpoint(monitor="quality/psnr")`` works.

    Outputs in any memory layout (``channels_last``, strided views) are scored as their contiguous copy. A gated
    metric that is NaN or infinite from scored images (a diverged model) fails its check with the reason; one that
    could not score the outputs (its update raised, no image reached it) is not checked, with the error: a broken
    measurement is no verdict about the model, and with a baseline the gate has not passed (``reason``). The number
    of images scored is recorded, and a baseline that scored a different number is warned about (different
    validation sets make the gate meaningless). The image metrics (and LPIPS's backbone) are built at
    the first validation, so a fit without a validation loop never loads them.

    Raises:
        ValueError: at construction for an unknown metric, mode, action, tolerance mode or LPIPS net, a negative
            or infinite tolerance, a bad ``at_steps`` (``[]`` included)/``every_n_steps``/``data_range`` (infinite
            included), or a baseline that is missing, not JSON or
            lacks a gated metric; at the first validation batch (sanity check included) for outputs without the
            configured keys or preds and target of different shapes; at the first check for a monitored name that
            was not logged.

    Example::

        QualityGate(baseline="runs/base/perf_summary.json", tolerance=0.005, action="fail", at_steps=[3100])
    """

    section_name = "quality_gate"

    def __init__(
        self,
        metrics: Sequence[str] = ("psnr", "ssim", "l1", "lpips"),
        monitor: Optional[Dict[str, str]] = None,
        baseline: Optional[Union[str, Dict[str, float]]] = None,
        tolerance: Union[float, Dict[str, float]] = DEFAULT_TOLERANCE,
        tolerance_mode: Union[str, Dict[str, str]] = DEFAULT_TOLERANCE_MODE,
        action: str = "warn",
        at_steps: Optional[Sequence[int]] = None,
        every_n_steps: Optional[int] = None,
        record_baseline: Optional[str] = None,
        preds_key: str = "preds",
        target_key: str = "target",
        data_range: float = 1.0,
        lpips_net: str = "alex",
        lpips_weights_dir: Optional[str] = None,
        lpips_pretrained: bool = True,
        require_same_step: bool = False,
        summary_path: Optional[str] = None,
        run_name: Optional[str] = None,
        run_notes: Optional[str] = None,
    ) -> None:
        super().__init__(summary_path=summary_path, run_name=run_name, run_notes=run_notes)
        owner = "QualityGate"
        if isinstance(metrics, str) or any(m not in IMAGE_METRICS for m in metrics):
            raise bad_argument(owner, "metrics", metrics, f"Possible choices are: {', '.join(IMAGE_METRICS)}.")
        if monitor is not None and not isinstance(monitor, dict):
            raise bad_argument(owner, "monitor", monitor, "Expected a dict of logged metric name -> 'max' or 'min',"
                               " e.g. {'val/acc': 'max'}.")
        monitor = dict(monitor or {})
        if not list(metrics) and not monitor:
            raise bad_argument(owner, "metrics", metrics, "Nothing to gate: give image metrics (psnr, ssim, l1,"
                               " lpips) or `monitor={'val/acc': 'max'}`.")
        for name, mode in monitor.items():
            if mode not in MODES:
                raise bad_argument(owner, "monitor", monitor,
                                   f"Each monitored metric needs a direction: {name!r} -> 'max' or 'min'.")
        if action not in ACTIONS:
            raise bad_argument(owner, "action", action, f"Possible choices are: {', '.join(ACTIONS)}.")
        if lpips_net not in LPIPS_NETS:
            raise bad_argument(owner, "lpips_net", lpips_net, f"Possible choices are: {', '.join(LPIPS_NETS)}.")
        if (isinstance(data_range, bool) or not isinstance(data_range, (int, float)) or not data_range > 0
                or not math.isfinite(data_range)):
            raise bad_argument(owner, "data_range", data_range, "Expected a finite number > 0 (1.0 for [0, 1] images).")
        check_positive_int(owner, "every_n_steps", every_n_steps, allow_none=True)
        self.at_steps = check_at_steps(owner, at_steps)
        self.metrics = list(metrics)
        self.monitor = monitor
        self.gated = self.metrics + [m for m in monitor if m not in self.metrics]
        self.modes = {**{m: IMAGE_METRIC_DIRECTIONS[m] for m in self.metrics}, **monitor}
        self.tolerance = per_metric(owner, "tolerance", tolerance, self.gated, check_tolerance, DEFAULT_TOLERANCE)
        self.tolerance_mode = per_metric(owner, "tolerance_mode", tolerance_mode, self.gated, check_tolerance_mode,
                                         DEFAULT_TOLERANCE_MODE)
        self.baseline_source = baseline if isinstance(baseline, str) else ("dict" if baseline is not None else None)
        self.baseline: Optional[Dict[str, float]] = None
        self._baseline_meta: Dict[str, Any] = {}
        self._baseline_gaps: Dict[str, str] = {}
        if baseline is not None:
            try:  # a metric the baseline run could not measure (LPIPS offline) is not gated: a gap
                self.baseline, self._baseline_gaps, self._baseline_meta = gate_baseline(baseline, self.gated)
            except BaselineError as err:
                raise bad_argument(owner, "baseline", baseline, str(err)) from None
        self.action = action
        self.every_n_steps = every_n_steps
        self.record_baseline = check_path(owner, "record_baseline", record_baseline)
        self.lpips_pretrained = check_bool(owner, "lpips_pretrained", lpips_pretrained)
        self.require_same_step = check_bool(owner, "require_same_step", require_same_step)
        self.preds_key, self.target_key = preds_key, target_key
        self.data_range = float(data_range)
        self.lpips_net = lpips_net
        self.lpips_weights_dir = lpips_weights_dir
        self._lpips_model: Any = None
        self._lpips_reason: Optional[str] = None
        self._reset()

    def _reset(self) -> None:
        self._image_metrics: Dict[str, Any] = {}
        self._metrics_built = False
        self._outputs_checked = False
        self._active = False
        self._results: Dict[str, Dict[str, Any]] = {}
        self._pending: Dict[str, float] = {}  # image metrics of this validation, gated at its end
        self._images = 0  # images given to the metrics in this validation
        self._unscored: Dict[str, str] = {}  # metric -> why it could not score this validation's outputs
        self._not_checked: Optional[str] = None  # the first scheduled check that left a gated metric unscored
        self._not_checked_count = 0
        self._images_scored: Optional[int] = None  # in the last checked validation
        self._record_problem: Optional[str] = None
        self._checks = 0
        self._failed: List[Dict[str, Any]] = []
        self._failed_count = 0
        self._last_passed: Optional[bool] = None
        self._step: Optional[int] = None
        self._validation_runs = 0  # validations of this fit (sanity check not counted): why a gate never checked
        self._validation_steps: List[int] = []  # the global steps of the last few of them
        # set at fit end when a gate with a baseline did not check all it gates: "never checked: ...", "not checked
        # at N validations; first at step S: ..."
        self._unchecked: Optional[str] = None

    # -- set-up --------------------------------------------------------------------------------------------------
    @guarded
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit":
            self._carry_or_reset(trainer, self._reset)
            self._start_run(trainer)
            if self.record_baseline and trainer.is_global_zero:
                check_writable("QualityGate(record_baseline)", str(self.record_baseline))
            out_of_reach = unreachable(trainer.max_steps, self.at_steps, self.every_n_steps)
            if out_of_reach and self.baseline is not None:
                self._warn_once("unreachable", f"{out_of_reach}: this gate will not check in this run, and at fit end"
                                f" it counts as failed ({on_never_checked(self.action)}).")
            elif out_of_reach:  # no verdict to fail, but nothing will be measured (or recorded) either
                self._warn_once("unreachable", f"{out_of_reach}: nothing will be measured in this run" + (
                    f", and record_baseline={str(self.record_baseline)!r} will write no baseline"
                    if self.record_baseline else "") + ".")
        else:
            self._reset()
        for name, reason in self._baseline_gaps.items():
            self._warn_once(f"gap:{name}", f"{name} is measured but not gated: {reason}")

    def _build_metrics(self, trainer: Trainer) -> None:
        """At the first validation: a fit without a validation loop never loads LPIPS's backbone."""
        self._metrics_built = True
        if "lpips" in self.metrics and self._lpips_model is None and self._lpips_reason is None:
            try:
                self._lpips_model = load_lpips(self.lpips_net, self.lpips_pretrained, self.lpips_weights_dir)
            except LpipsUnavailable as err:
                self._lpips_reason = str(err)
                if not err.again:  # said once a process: a later run's summary still records it
                    self._warn_once("lpips", f"LPIPS is unavailable and not gated: {err} The other metrics go on.")
        self._image_metrics = {
            name: metric.to(trainer.strategy.root_device)
            for name, metric in build_image_metrics(self.metrics, self.data_range, self._lpips_model).items()
        }

    def _never_checked_reason(self, last_step: int) -> str:
        """Why a fit ended with no check: said in the summary, the warning and the error of action='fail'."""
        if self._validation_runs == 0:
            why = (f"no validation ran in this fit, which ended at step {last_step} (no validation loop,"
                   " `limit_val_batches=0`, or validation scheduled after the last step)")
        else:
            earlier = "..., " if self._validation_runs > len(self._validation_steps) else ""
            ran = f"validations ran at steps {earlier}{', '.join(map(str, self._validation_steps))}"
            why = unreachable(last_step, self.at_steps, self.every_n_steps)
            if self._not_checked:  # validations ran when scheduled, and scored nothing
                why = (f"the gated metrics scored nothing at {times(self._not_checked_count, 'validation')}"
                       f" ({ran}); first at {self._not_checked}")
            elif why is None and (self.at_steps is not None or self.every_n_steps is not None):
                why = f"no validation ran at {schedule_text(self.at_steps, self.every_n_steps)} ({ran})"
            elif why is None:
                why = f"no validation completed a check ({ran}; see measurement_failures)"
            else:
                why = f"{why} ({ran})"
        return f"never checked: {why}"

    # -- validation ----------------------------------------------------------------------------------------------
    @guarded
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._metrics_built:
            self._build_metrics(trainer)
        self._active = not trainer.sanity_checking and is_due(trainer.global_step, self.at_steps, self.every_n_steps)
        if not trainer.sanity_checking:
            self._validation_runs += 1
            self._validation_steps = (self._validation_steps + [trainer.global_step])[-5:]
        self._images = 0
        self._unscored = {}
        for metric in self._image_metrics.values():
            metric.reset()

    @guarded
    def on_validation_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        if not self._image_metrics or (self._outputs_checked and not self._active):
            return
        # checked on the first batch, sanity check included
        preds, target = image_pair(outputs, self.preds_key, self.target_key, self.metrics,
                                   lpips_built="lpips" in self._image_metrics)
        self._outputs_checked = True
        if self._active:  # in any memory layout (channels_last...), scored as the same images
            self._images += score_batch(self._image_metrics, preds, target, self._unscored, error_message)

    @guarded
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._active:
            return
        # compute() syncs across ranks: every rank is here; NaN and inf are kept, they fail the check
        values = compute_scores(self._image_metrics, self._images, self._unscored, error_message)
        for name, value in values.items():
            if math.isfinite(value):  # for ModelCheckpoint(monitor=...); loggers get them with the verdict
                pl_module.log(f"quality/{name}", value, sync_dist=False, rank_zero_only=False, logger=False)
        self._pending = values
        self._images_scored = self._images if values else 0
        baseline_images = self._baseline_images
        if baseline_images is not None and values and self._images != baseline_images:
            self._warn_once("images", f"this validation scored {self._images} images, the baseline scored"
                                      f" {baseline_images}: different validation sets make the gate meaningless.")

    @guarded
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._active:
            return
        self._active = False
        values, self._pending = self._pending, {}
        for name in self.monitor:
            if name not in trainer.callback_metrics:
                raise PerfConfigError(
                    f"QualityGate: monitored metric {name!r} was not logged in this validation; logged names are:"
                    f" {sorted(trainer.callback_metrics)}.")
            values[name] = float(trainer.callback_metrics[name])
        self._check(trainer, values)

    def _check(self, trainer: Trainer, values: Dict[str, float]) -> None:
        step = trainer.global_step
        # A metric that scored nothing (its update broke, no image reached it) is not checked: a broken measurement
        # says nothing about the model. LPIPS unavailable here was said once at load.
        unscored = {name: self._unscored.get(name, "produced no value in this validation") for name in self.gated
                    if name not in values and not (name == "lpips" and self._lpips_reason)}
        for name, why in unscored.items():
            self._results[name] = {"value": None, "mode": self.modes[name], "passed": None,
                                   "reason": f"not checked: {why}", "step": step}
        if unscored:
            self._note_not_checked(step, unscored)
        if not any(name in values for name in self.gated):
            return  # nothing scored: no check, and no verdict about the model
        self._step = step
        self._checks += 1
        failing = []
        mismatch = self._step_mismatch(step)
        for name in self.gated:
            if name not in values:
                continue
            if not math.isfinite(values[name]):  # images were scored: the model's outputs gave this
                self._results[name] = {"value": None, "mode": self.modes[name], "passed": False,
                                       "reason": f"is {values[name]} (a diverged model?)", "step": step}
                failing.append(name)
                continue
            if self.baseline is None or name in self._baseline_gaps:
                self._results[name] = {"value": values[name], "mode": self.modes[name], "passed": None}
                continue
            result = verdict(values[name], self.baseline[name], self.modes[name], self.tolerance[name],
                             self.tolerance_mode[name] == "relative")
            result["step"] = step
            if mismatch and self.require_same_step:
                result.update(passed=False, reason=mismatch)
            self._results[name] = result
            if not result["passed"]:
                failing.append(name)
        logged = {f"quality/{n}": r["value"] for n, r in self._results.items() if r.get("step", step) == step
                  and n in values and r["value"] is not None and n in self._image_metrics}
        if self.baseline is None:
            log_scalars(trainer, logged)
            if failing:  # no gate, but a NaN or a missing metric is still said
                self._warn_once(f"failed:{','.join(failing)}", failure_message(step, failing, self._results))
            return
        passed = not failing
        self._last_passed = False if failing else (None if unscored else True)
        # a check that left a gated metric unscored has no verdict to log, unless another metric failed it
        log_scalars(trainer, {**logged, **({"quality/gate_passed": 1.0 if passed else 0.0}
                                           if failing or not unscored else {})})
        if not passed:
            self._failed_count += 1
            if len(self._failed) < _MAX_FAILED_RECORDS:
                self._failed.append({"step": step, "metrics": failing,
                                     **({"reason": mismatch} if mismatch and self.require_same_step else {})})
            if self.action != "stop":
                self._warn_once(f"failed:{','.join(failing)}", failure_message(step, failing, self._results))
        if self.action == "stop":
            stop = trainer.strategy.reduce_boolean_decision(not passed, all=False)
            if stop:
                self._warn_once("stop", failure_message(step, failing or ["(another rank)"], self._results)
                                + " Training stops (action='stop').")
                trainer.should_stop = True

    def _note_not_checked(self, step: int, unscored: Dict[str, str]) -> None:
        """A scheduled check left gated metrics unscored: kept (the first) for the verdict, and warned about once."""
        self._not_checked_count += 1
        what = "; ".join(f"{name} {why}" for name, why in unscored.items())
        if self._not_checked is None:
            self._not_checked = f"step {step}: {what}"
        consequence = (f"the gate cannot pass ({on_never_checked(self.action)})" if self.baseline is not None
                       else "nothing is gated without a baseline")
        self._warn_once(f"unscored:{','.join(unscored)}", f"{what}. Not checked at step {step}: the measurement"
                        f" broke, which says nothing about the model; {consequence}.")

    def _step_mismatch(self, step: int) -> Optional[str]:
        """Why a check at ``step`` is not like for like with the baseline (None when the steps agree or the baseline
        has none); warned once unless ``require_same_step`` makes it fail the check."""
        recorded = self._baseline_meta.get("step")
        if self.baseline is None or recorded is None or recorded == step:
            return None
        reason = f"checked at step {step} against a baseline recorded at step {recorded}"
        if not self.require_same_step:
            self._warn_once("step", f"{reason}: a model at another step is not like for like; gate at step"
                            f" {recorded} (at_steps=[{recorded}]), or require_same_step=True to fail such a check.")
        return reason

    # -- end -----------------------------------------------------------------------------------------------------
    @guarded
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.baseline is not None and (self._checks == 0 or self._not_checked):
            # Fail closed: a gate asked for a verdict that did not decide everything it gates has not passed.
            self._unchecked = (self._never_checked_reason(trainer.global_step) if self._checks == 0
                               else self._partly_checked())
            if self.action != "fail":
                self._warn_once("never_checked", f"{self._unchecked}; the summary records the gate as not"
                                f" passed ({on_never_checked(self.action)}).")
        if self.record_baseline and trainer.is_global_zero:
            bad = [n for n, r in self._results.items() if r.get("value") is None]
            if not self._results or bad:
                self._record_problem = (f"not written: {', '.join(bad)} had no finite value" if bad
                                        else "not written: no validation was checked")
                self._warn_once("record", f"record_baseline={self.record_baseline!r} {self._record_problem}.")
            else:
                try:
                    write_baseline(self.record_baseline, self._results, self._step, self._images_scored)
                except Exception as err:  # noqa: BLE001 - the verdict and the summary must still come, and a fail
                    self._record_problem = f"not written: {type(err).__name__}: {error_message(err)}"
                    self._warn_once("record", f"record_baseline={self.record_baseline!r} {self._record_problem}.")
        self._write_summary(trainer)
        if trainer.is_global_zero:
            rank_zero_info(self.verdict())
        if self.action == "fail" and self._failed_count:
            first = self._failed[0]
            why = f" ({first['reason']})" if first.get("reason") else ""
            raise PerfCheckFailed(
                f"QualityGate: {self._failed_count} of {self._checks} checks failed (action='fail'); first at step"
                f" {first['step']}: {', '.join(first['metrics'])}{why}. See the quality_gate section of the summary.")
        if self.action == "fail" and self._unchecked:
            raise PerfCheckFailed(f"QualityGate: {self._unchecked} (action='fail'). See the quality_gate section"
                                  " of the summary.")

    def _partly_checked(self) -> Optional[str]:
        """Why checks ran but did not decide every gated metric (None when they did)."""
        if not self._not_checked:
            return None
        return f"not checked at {times(self._not_checked_count, 'validation')}; first at {self._not_checked}"

    @guarded
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._write_summary(trainer, exception)

    def verdict(self) -> str:
        """One line for the console: the final verdict and every failed check (the first 10, then a count)."""
        return verdict_line(self._results, self._checks, self._failed, self._failed_count, self.baseline is not None,
                            self._unchecked, self._not_checked)

    @property
    def _baseline_images(self) -> Optional[int]:
        return self._baseline_meta.get("images")

    @property
    def results(self) -> Dict[str, Dict[str, Any]]:
        """The last checked value of each gated metric, with its verdict when a baseline is set."""
        return {k: dict(v) for k, v in self._results.items()}

    def _summary_section(self) -> Dict[str, Any]:
        unavailable: Dict[str, str] = {}
        if self._lpips_reason:
            unavailable["lpips"] = self._lpips_reason
        for name, reason in self._baseline_gaps.items():
            unavailable.setdefault(f"{name}_verdict", reason)
        if self.baseline is None:
            unavailable["passed"] = "no baseline: metrics measured, nothing gated"
        if self._checks == 0:
            unavailable["metrics"] = (self._unchecked or self._partly_checked()
                                      or "no validation ran at a checked step")
        if self._record_problem:
            unavailable["recorded_baseline"] = self._record_problem
        # fail closed, also in a summary written before fit end (a crash): a metric left unchecked is no pass
        unchecked = self._unchecked or (self._partly_checked() if self.baseline is not None else None)
        if unchecked:
            passed: Optional[bool] = False
        else:
            passed = None if self.baseline is None or self._checks == 0 else self._failed_count == 0
        return {
            "passed": passed,
            "reason": unchecked,
            "last_check_passed": self._last_passed,
            "action": self.action,
            "metrics": self.results,
            "checks": self._checks,
            "failed_checks": list(self._failed),
            "failed_check_count": self._failed_count,
            "step": self._step,
            "images_scored": self._images_scored,
            "baseline_images": self._baseline_images,
            "baseline_step": self._baseline_meta.get("step"),
            "require_same_step": self.require_same_step,
            "baseline_source": self.baseline_source,
            "baseline": dict(self.baseline) if self.baseline else None,
            "recorded_baseline": self.record_baseline,
            "data_range": self.data_range,
            "lpips": {"net": self.lpips_net, "available": self._lpips_model is not None,
                      "backbone": None if self._lpips_model is None
                      else ("pretrained" if self.lpips_pretrained else "random (plumbing only, not LPIPS)")}
            if "lpips" in self.metrics else None,
            "unavailable": unavailable,
        }

    def state_dict(self) -> Dict[str, Any]:
        return {"results": self.results, "checks": self._checks, "failed": list(self._failed),
                "failed_count": self._failed_count, "step": self._step, "not_checked": self._not_checked,
                "not_checked_count": self._not_checked_count}

    @reads_state
    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        s = StateReader(state_dict)
        results: Dict[str, Dict[str, Any]] = {}
        for name, data in s.mapping("results").data.items():
            r = StateReader(data, f"results.{name}")
            if not isinstance(name, str) or r.text("mode", allow_none=False) not in MODES:
                raise StateError(f"results.{name} is not a metric's result (a name, and `mode` 'max' or 'min')")
            if r.text("tolerance_mode", "relative", allow_none=False) not in TOLERANCE_MODES:
                raise StateError(f"results.{name}.tolerance_mode is {data['tolerance_mode']!r}")
            if "passed" in r and r.data["passed"] is not None:
                r.flag("passed")
            numbers = {key: r.number(key, None, minimum=None, allow_none=True)
                       for key in ("value", "baseline", "delta", "delta_pct", "tolerance", "allowed_delta") if key in r}
            results[name] = {**data, **numbers, "value": numbers.get("value"), "reason": r.text("reason"),
                             **({"step": r.count("step")} if "step" in r else {})}
            if results[name]["reason"] is None:
                del results[name]["reason"]
        failed = []
        for f in s.records("failed"):
            metrics = f.data.get("metrics", [])
            if not isinstance(metrics, list) or not all(isinstance(m, str) for m in metrics):
                raise StateError(f"{f.where}.metrics is {metrics!r}, expected a list of metric names")
            failed.append({"step": f.count("step"), "metrics": list(metrics)})
        read = dict(_results=results, _checks=s.count("checks"), _failed=failed[:_MAX_FAILED_RECORDS],
                    _failed_count=s.count("failed_count", len(failed)),
                    _step=None if s.data.get("step") is None else s.count("step"),
                    _not_checked=s.text("not_checked"), _not_checked_count=s.count("not_checked_count", 0))
        for name, value in read.items():  # all read: nothing is assigned from a state that fails halfway
            setattr(self, name, value)
