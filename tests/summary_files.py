"""Real summary files for the readers' tests: two short fits with every callback of the suite."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Tuple

from helpers import ImageModel, fit


class NamedImageModel(ImageModel):
    """Logs a loss too, so the report's loss columns and `logged.values` are filled."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return loss


def write_two_runs(root: Any) -> Tuple[str, str]:
    """``root/base/perf_summary.json`` and ``root/cand/perf_summary.json``: every section, metrics and losses."""
    from lightning_perf import EvalNoGradGuard, IterationTimer, QualityGate, SectionProfiler, VRAMMonitor

    paths = []
    for name in ("base", "cand"):
        path = os.path.join(str(root), name, "perf_summary.json")
        callbacks = [IterationTimer(warmup_steps=1, summary_path=path, run_notes=f"{name} notes"),
                     SectionProfiler(warmup_steps=1, print_reports=False), VRAMMonitor(nvml_interval_s=0.01),
                     EvalNoGradGuard(), QualityGate(metrics=["psnr", "l1"])]
        fit(os.path.join(str(root), name), callbacks, model=NamedImageModel(), max_epochs=3)
        paths.append(path)
    return paths[0], paths[1]


def read(path: str) -> Dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)
