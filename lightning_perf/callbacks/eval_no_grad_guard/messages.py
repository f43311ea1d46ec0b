"""EvalNoGradGuard's words: the one-line findings it warns with, and the sizes in them."""

from __future__ import annotations

from typing import Any, Dict, List

from lightning_perf.measure.evaluation.train_mode import MAX_MODULE_NAMES
from lightning_perf.summary.model import TRAIN_HOOKS
MB = 1024.0 * 1024.0
TRAIN_MODE_FIX = ("Call `model.eval()` before evaluating and `model.train()` after (Lightning does it around its"
                  " evaluation loops; a hook or step that calls `train()` undoes it).")


def fmt_bytes(n: float) -> str:
    if n >= 1024 * MB:
        return f"{n / MB / 1024:.2f} GiB"
    return f"{n / MB:.1f} MiB" if n >= MB else f"{n / 1024:.1f} KiB"


def train_mode_message(result: Dict[str, Any]) -> str:
    """One line: where evaluation ran which modules in training mode, how often, what it did, and the fix."""
    modules = result["modules"]
    by_type: Dict[str, List[str]] = {}
    for name, (kind, _) in list(modules.items())[:MAX_MODULE_NAMES]:
        by_type.setdefault(kind, []).append(name or "(the module itself)")
    listed = "; ".join(f"{kind} {', '.join(names)}" for kind, names in by_type.items())
    if len(modules) > MAX_MODULE_NAMES:
        listed += f" and {len(modules) - MAX_MODULE_NAMES} more"
    effects = []
    if result["running_stats_changed"]:
        effects.append("BatchNorm normalised with batch statistics and changed its running statistics")
    if result["random_active"]:
        effects.append("dropout was active")
    where = (f"{result['site'] or 'code'} ran `phase({result['phase']!r})`" if result["phase"] == "eval_in_train_hooks"
             else f"{result['site'] or 'code'} ran the LightningModule's modules between training steps"
             if result["phase"] == TRAIN_HOOKS else f"{result['phase']} ran")
    forwards = result["forwards"]
    counted = ("forwards not counted" if forwards is None else f"{forwards} forward{'s' if forwards != 1 else ''}")
    if result["uncounted"]:
        counted += f" ({', '.join(result['uncounted'][:MAX_MODULE_NAMES])} inside torch.compile: not counted)"
    return (f"{where} with {len(modules)} module{'s' if len(modules) != 1 else ''} in training mode ({listed}):"
            f" {counted}; {' and '.join(effects)}. {TRAIN_MODE_FIX}")


def how_it_ran(training_mode: bool, eval_inside: bool = False) -> str:
    """How a grad finding's forward ran; ``eval_inside``: its module, in training mode, held eval-mode modules."""
    if not training_mode:
        return "in eval mode with autograd on"
    return ("with autograd on between training steps, in training mode (evaluation in a training hook"
            + ("; `self.net.eval()` leaves the module around it in training mode)" if eval_inside else ")"))
