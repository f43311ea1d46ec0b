"""Seed 001's eval memory spike, before and after: evaluation from a training hook without torch.no_grad().

A callback renders the held-out photo crops every 40 steps (``--every``) and keeps every rendering for its metrics,
as the seed's metric loop did. Without no_grad, autograd keeps each rendering's whole graph alive. EvalNoGradGuard says
where and how much; VRAMMonitor shows the peak; the fixed run does the same work under torch.no_grad().

    python examples/eval_no_grad_story.py [--max-steps 120] [--every 40]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from lightning.pytorch import Callback, Trainer, seed_everything  # noqa: E402

from denoise import DenoiseDataModule, DenoiseNet  # noqa: E402
from lightning_perf import EvalNoGradGuard, VRAMMonitor  # noqa: E402


class HeldOutRender(Callback):
    """Renders the held-out crops every `every` steps and keeps all of them to compute PSNR at the end."""

    def __init__(self, every: int = 40, no_grad: bool = False) -> None:
        self.every, self.no_grad = every, no_grad
        self.psnr = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (trainer.global_step % self.every) != 0:
            return
        pl_module.eval()
        renders, targets = [], []
        with torch.no_grad() if self.no_grad else contextlib.nullcontext():
            for noisy, clean in trainer.datamodule.val_dataloader():
                renders.append(pl_module(noisy))
                targets.append(clean)
            mse = torch.stack([((r - t) ** 2).mean() for r, t in zip(renders, targets)]).mean()
        self.psnr.append(float(-10 * torch.log10(mse.detach())))
        pl_module.train()


def run(out: str, fixed: bool, max_steps: int = 120, every: int = 40) -> None:
    seed_everything(0)
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, limit_val_batches=0, default_root_dir=out, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        callbacks=[HeldOutRender(every=every, no_grad=fixed), EvalNoGradGuard(), VRAMMonitor(nvml_interval_s=0.01)],
    )
    trainer.fit(DenoiseNet(), datamodule=DenoiseDataModule(batch_size=8, val_samples=64))


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] in ("before", "fixed"):  # one variant, in its own process
        if not os.environ.get("OMP_NUM_THREADS"):  # a count set there is the caller's (the tests set 1)
            torch.set_num_threads(2)
        run(sys.argv[2], sys.argv[1] == "fixed", int(sys.argv[3]), int(sys.argv[4]))
        return 0
    import argparse
    import subprocess

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=120, help="steps of each run (120: three renders)")
    parser.add_argument("--every", type=int, default=40, help="steps between two renders (40)")
    args = parser.parse_args()
    if args.every < 1:
        parser.error(f"--every {args.every}: expected a positive integer")
    if args.max_steps < args.every:
        parser.error(f"--max-steps {args.max_steps}: at least {args.every}, the steps between two renders"
                     " (--every)")

    rows = []
    with tempfile.TemporaryDirectory() as root:
        for name, variant in (("before: no torch.no_grad()", "before"), ("after: with torch.no_grad()", "fixed")):
            # a fresh process each, so that one run's freed heap does not count in the other's memory
            out = os.path.join(root, variant)
            subprocess.run([sys.executable, os.path.abspath(__file__), variant, out, str(args.max_steps),
                            str(args.every)], check=True)
            with open(os.path.join(out, "perf_summary.json")) as fh:
                summary = json.load(fh)
            guard, vram = summary["eval_no_grad_guard"], summary["vram"]
            rows.append((name, guard["grad_enabled_eval_forwards"], guard["saved_for_backward_mb"],
                         vram["phases"]["train"]["host_rss_peak_mb"], guard["findings"]))
    print()
    print(f"{'run':<30}{'eval forwards with grad':>25}{'saved for backward':>20}{'peak memory (RSS)':>20}")
    for name, count, saved, peak, _ in rows:
        print(f"{name:<30}{count:>25}{saved:>17.1f} MB{peak:>17.0f} MB")
    for finding in rows[0][4]:
        print(f"\nsite: {finding['site']} ({finding['module']}, {finding['count']} forwards)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
