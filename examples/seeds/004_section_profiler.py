"""Seed 004, "Training Pipeline Profiling": where each iteration's time goes, with the seed's sections.

Data loading, forward, backward and optimizer step are found by SectionProfiler itself; an EMA update, periodic
sampling and the metrics computation (gradient and parameter norms) are named with `profile_section`; checkpoints
are saved every 20 steps (``--every``). A report table every 20 steps (count, total, mean, min, max, share since
the last one), the final table, and insights. The sampling and the checkpoint of step 20 are in the report at step
20, those of the last step are counted too, and the final sampling in ``on_train_end`` is the line "after the last
iteration"; the script ends with the model's own count of sampling calls and the checkpoint files on disk beside
the counts in the summary. The hand-made profiler needed RECTIFIED_FLOW_PROFILE=1 and code in the loop;
LIGHTNING_PERF_PROFILE=0|1 switches this one too.

    python examples/seeds/004_section_profiler.py [--out runs/seeds/004] [--max-steps 60] [--every 20]
"""

from __future__ import annotations

import argparse
import copy
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

import torch  # noqa: E402
from lightning.pytorch import Trainer, seed_everything  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402

from denoise import DenoiseDataModule, DenoiseNet  # noqa: E402
from lightning_perf import IterationTimer, SectionProfiler, profile_section  # noqa: E402


class DenoiseWithEma(DenoiseNet):
    """The demo denoiser with what seed 004's training loop also did: EMA, norms, sampling."""

    def __init__(self, sample_every: int = 20) -> None:
        super().__init__()
        self.sample_every = sample_every
        self.ema = copy.deepcopy(self.body).requires_grad_(False)
        self.sampled = 0  # the model's own count, to hold the profiler's against

    def on_before_optimizer_step(self, optimizer) -> None:
        with profile_section("metrics_computation"):
            norms = [p.grad.norm() for p in self.parameters() if p.grad is not None]
            self.log("grad_norm", torch.stack(norms).norm())

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        with profile_section("ema_update"), torch.no_grad():
            for e, p in zip(self.ema.parameters(), self.body.parameters()):
                e.lerp_(p, 0.01)
        if self.trainer.global_step % self.sample_every == 0:
            with profile_section("sampling"), torch.no_grad():
                noisy, _ = batch
                self.ema.eval()
                self.ema(noisy[:4])
            self.sampled += 1

    def on_train_end(self) -> None:
        with profile_section("final_sampling"), torch.no_grad():  # after the last iteration: its own row
            self.ema(torch.rand(4, 3, 48, 48, device=self.device))


def main(argv: list = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/seeds/004")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=20, help="steps between reports, samplings and checkpoints")
    args = parser.parse_args(argv)
    if args.every < 1:
        parser.error(f"--every {args.every}: expected a positive integer")
    seed_everything(0)
    if not os.environ.get("OMP_NUM_THREADS"):  # a count set there is the caller's (the tests set 1)
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=args.max_steps, val_check_interval=args.max_steps,
        check_val_every_n_epoch=None, logger=TensorBoardLogger(args.out, name="profile", version=""),
        callbacks=[IterationTimer(warmup_steps=5), SectionProfiler(report_every_n_steps=args.every, warmup_steps=5),
                   ModelCheckpoint(dirpath=os.path.join(args.out, "ckpt"), every_n_train_steps=args.every,
                                   save_top_k=-1)],
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=10,
    )
    model = DenoiseWithEma(sample_every=args.every)
    trainer.fit(model, datamodule=DenoiseDataModule(batch_size=8, patch_size=48))
    with open(os.path.join(trainer.log_dir, "perf_summary.json")) as fh:
        sp = json.load(fh)["section_profiler"]
    final = (sp["after_last_iteration"] or {}).get("sections", {})
    saved = (sp["sections"]["checkpointing"]["count"] or 0) + (final.get("checkpointing") or {}).get("count", 0)
    print(f"sampling calls: {model.sampled} made, {sp['sections']['sampling']['count']} counted (warm-up"
          f" {sp['warmup_steps']} steps); checkpoints: {len(glob.glob(os.path.join(args.out, 'ckpt', '*.ckpt')))}"
          f" on disk, {saved} counted; final_sampling after the last iteration:"
          f" {(final.get('final_sampling') or {}).get('count', 0)} call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
