"""Quality per arm of an A/B trial: the first validation batches scored once with the change off and once on.

No Lightning import: the callback hands over the module, the batches (already on the device) and how to score.
What ``validation_step`` logs is captured (``module.log`` is held for the pass), and where a QualityGate is in the
run, its image metrics are computed from the step's outputs as the gate computes them.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from lightning_perf.measure.quality.image_quality import build_image_metrics

__all__ = ["score_batches", "compare_arms"]


def _number(value: Any) -> Optional[float]:
    try:
        value = float(value.detach().float().mean()) if isinstance(value, torch.Tensor) else float(value)
    except (TypeError, ValueError, RuntimeError):
        return None
    return value if math.isfinite(value) else None


def _pair(outputs: Any, preds_key: str, target_key: str) -> Optional[tuple]:
    if isinstance(outputs, dict) and preds_key in outputs and target_key in outputs:
        return outputs[preds_key], outputs[target_key]
    if isinstance(outputs, (tuple, list)) and len(outputs) == 2:
        return tuple(outputs)
    return None


def score_batches(module: Any, batches: Sequence[Any], image_metrics: Sequence[str] = (), data_range: float = 1.0,
                  preds_key: str = "preds", target_key: str = "target",
                  step: Optional[Callable[[Any, int], Any]] = None) -> Dict[str, float]:
    """Runs ``validation_step`` (or ``step``) on ``batches`` in eval mode without autograd and returns each metric's
    mean: the scalars it logs (mean over batches) and the image metrics (``psnr``, ``ssim``, ``l1``) of its
    outputs. The module's training mode and its ``log`` are put back."""
    logged: Dict[str, List[float]] = {}

    def capture(name: str, value: Any, *args: Any, **kwargs: Any) -> None:
        number = _number(value)
        if number is not None:
            logged.setdefault(name, []).append(number)

    def capture_dict(values: Dict[str, Any], *args: Any, **kwargs: Any) -> None:
        for name, value in values.items():
            capture(name, value)

    metrics = build_image_metrics([m for m in image_metrics if m != "lpips"], data_range)
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    metrics = {name: metric.to(device) for name, metric in metrics.items()}
    step = step or module.validation_step
    was_training = module.training
    held = {name: module.__dict__.get(name) for name in ("log", "log_dict")}
    module.log, module.log_dict = capture, capture_dict
    try:
        module.eval()
        with torch.no_grad():
            for index, batch in enumerate(batches):
                pair = _pair(step(batch, index), preds_key, target_key)
                if pair is not None and metrics:
                    preds, target = (t.detach().float().contiguous() for t in pair)
                    for metric in metrics.values():
                        metric.update(preds, target)
    finally:
        for name, value in held.items():
            if value is None:
                module.__dict__.pop(name, None)
            else:
                setattr(module, name, value)
        module.train(was_training)
    out = {name: sum(values) / len(values) for name, values in logged.items()}
    for name, metric in metrics.items():
        value = _number(metric.compute()) if metric.update_count else None
        if value is not None:
            out[name] = value
    return out


def compare_arms(off: Dict[str, float], on: Dict[str, float], tolerance: Dict[str, float],
                 directions: Dict[str, str], default_tolerance: float) -> Dict[str, Dict[str, Any]]:
    """Per metric scored under both arms: both values, the relative change on/off in %, the tolerance (relative)
    and whether the change is outside it in the bad direction (either direction where the better one is not
    known)."""
    rows: Dict[str, Dict[str, Any]] = {}
    for name in sorted(set(off) & set(on)):
        a, b = off[name], on[name]
        change = None if a == 0 else 100.0 * (b - a) / abs(a)
        allowed = float(tolerance.get(name, default_tolerance))
        direction = directions.get(name)
        if change is None:
            degraded = None
        elif direction == "max":
            degraded = change < -100.0 * allowed
        elif direction == "min":
            degraded = change > 100.0 * allowed
        else:
            degraded = abs(change) > 100.0 * allowed
        rows[name] = {"off": a, "on": b, "change_pct": change, "tolerance_pct": 100.0 * allowed,
                      "direction": direction, "degraded": degraded}
    return rows
