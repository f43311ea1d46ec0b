"""Scoring a validation's outputs with image metrics: the (preds, target) pair read from one step's outputs, each
batch given to the metrics, the evaluation's values computed. A metric that cannot score is recorded, never raised."""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Sequence, Tuple

import torch
from torchmetrics import Metric

from lightning_perf.errors import PerfConfigError

#: Why a metric scored nothing: the reason of a check that is not made.
NO_IMAGE = "scored no image in this validation (no validation batch gave one)"


#: An exception's message as the summary records it (the callbacks pass theirs: bounded, safe from a broken __str__).
ErrorText = Callable[[BaseException], str]


def could_not_score(err: BaseException, message: ErrorText) -> str:
    return f"could not score the validation outputs ({type(err).__name__}: {message(err)})"


def image_pair(outputs: Any, preds_key: str, target_key: str, metrics: Sequence[str],
               lpips_built: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(preds, target) from what ``validation_step`` returned: a dict with the two keys or a 2-tuple.

    Raises:
        PerfConfigError: outputs of another form, not tensors, of different shapes, not (N, C, H, W) where SSIM or
            LPIPS is scored, or not 3 channels where LPIPS is (``lpips_built``).
    """
    if isinstance(outputs, dict):
        missing = [k for k in (preds_key, target_key) if k not in outputs]
        if missing:
            raise PerfConfigError(
                f"QualityGate: validation_step's output has no {', '.join(map(repr, missing))}; it has keys"
                f" {sorted(map(str, outputs))}. Return {{{preds_key!r}: preds, {target_key!r}: target}}"
                " or set `preds_key`/`target_key`.")
        preds, target = outputs[preds_key], outputs[target_key]
    elif isinstance(outputs, (tuple, list)) and len(outputs) == 2:
        preds, target = outputs
    else:
        raise PerfConfigError(
            f"QualityGate: validation_step returned a {type(outputs).__name__}; expected a dict with"
            f" {preds_key!r} and {target_key!r} or a (preds, target) tuple.")
    if not isinstance(preds, torch.Tensor) or not isinstance(target, torch.Tensor):
        raise PerfConfigError("QualityGate: preds and target must be tensors, got"
                              f" {type(preds).__name__} and {type(target).__name__}.")
    if preds.shape != target.shape:
        raise PerfConfigError(f"QualityGate: preds and target differ in shape: {tuple(preds.shape)} vs"
                              f" {tuple(target.shape)}; expected the same (N, C, H, W).")
    needs_images = [m for m in ("ssim", "lpips") if m in metrics]
    if needs_images and preds.dim() != 4:
        raise PerfConfigError(f"QualityGate: {', '.join(needs_images)} need images shaped (N, C, H, W); got"
                              f" {tuple(preds.shape)}.")
    if lpips_built and preds.shape[1] != 3:
        raise PerfConfigError(f"QualityGate: LPIPS needs 3-channel images; got {preds.shape[1]} channels.")
    return preds, target


def score_batch(metrics: Dict[str, Metric], preds: torch.Tensor, target: torch.Tensor,
                unscored: Dict[str, str], message: ErrorText = str) -> int:
    """Gives one batch to every metric not yet in ``unscored`` (a metric whose update raises goes there, with why);
    returns how many images the batch holds."""
    with torch.no_grad():
        # channels_last or strided outputs: torchmetrics' L1 views them flat and fails; scored as the same images
        preds, target = preds.detach().contiguous(), target.detach().contiguous()
        for name, metric in metrics.items():
            if name in unscored:
                continue
            try:
                metric.update(preds, target)
            except Exception as err:  # noqa: BLE001 - the measurement broke, not the model: said, not gated
                unscored[name] = could_not_score(err, message)
    return int(preds.shape[0]) if preds.dim() > 0 else 1


def compute_scores(metrics: Dict[str, Metric], images: int, unscored: Dict[str, str],
                   message: ErrorText = str) -> Dict[str, float]:
    """Each metric's value over the evaluation, then reset; a metric that scored no image, or not every batch (in
    ``unscored``), has no value: a part of the images is no figure to gate. NaN and inf are kept: they fail a check.
    ``compute()`` syncs across ranks, so every rank calls it for the same metrics."""
    values: Dict[str, float] = {}
    for name, metric in metrics.items():
        value = math.nan
        if metric.update_count > 0:  # as on every rank: compute() is the same collective everywhere
            try:
                value = float(metric.compute())
            except Exception as err:  # noqa: BLE001 - e.g. the state of updates that all failed
                unscored.setdefault(name, could_not_score(err, message))
        if name not in unscored and (metric.update_count == 0 or images == 0):
            unscored[name] = NO_IMAGE
        if name not in unscored:
            values[name] = value
        metric.reset()
    return values
