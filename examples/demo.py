"""The lightning_perf demo: train a small denoiser on real photographs on CPU with the whole suite attached.

    python examples/demo.py --out runs/demo --name baseline
    python examples/demo.py --out runs/demo --name workers2 --workers 2 --baseline runs/demo/baseline/perf_summary.json

Each run writes TensorBoard logs and perf_summary.json to <out>/<name>/ and prints a short summary. `make demo` runs
these two, then `lightning-perf compare` and `report`, and ends on examples/demo_answer.py: the answer in ten lines.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from lightning.pytorch import Trainer, seed_everything  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402

from denoise import DenoiseDataModule, DenoiseNet  # noqa: E402
from lightning_perf import (  # noqa: E402
    EvalNoGradGuard,
    IterationTimer,
    QualityGate,
    SectionProfiler,
    VRAMMonitor,
    phase,
)
from lightning_perf.measure.timing.tail_advice import counted  # noqa: E402
from lightning_perf.summary.baseline import BaselineError, read_baseline_with_gaps  # noqa: E402


class _NoInstallTips(logging.Filter):
    """Lightning's "💡 Tip: ... try installing litlogger / litmodels" lines: advertising, no finding."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("💡 Tip:")


def quiet_upstream_noise() -> None:
    """Silence what a demo user cannot act on, by its exact words, so every real warning still shows: Lightning's
    install tips, the FutureWarning Lightning's own use of torch's ``LeafSpec`` raises, and the two deprecation
    warnings of torchvision that the lpips package's ``pretrained=True`` call raises when QualityGate loads it."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_NoInstallTips())
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning)
    warnings.filterwarnings("ignore", message="The parameter 'pretrained' is deprecated", category=UserWarning)
    warnings.filterwarnings("ignore", message="Arguments other than a weight enum or `None` for 'weights' are"
                            " deprecated",
                            category=UserWarning)


def image_metrics(baseline: Optional[str] = None) -> tuple:
    """QualityGate's metrics: all four, but LPIPS where the baseline run could not load its weights (offline): the
    baseline run warned about that once; trying the download again in this run could not gate LPIPS anyway."""
    metrics = ("psnr", "ssim", "l1", "lpips")
    if baseline is None:
        return metrics
    try:
        _, gaps = read_baseline_with_gaps(baseline)
    except BaselineError:
        return metrics  # QualityGate says what is wrong with the file
    return tuple(m for m in metrics if m not in gaps)


class DemoNet(DenoiseNet):
    """The denoiser; with ``sample_every``, it also denoises the held-out patches from a training hook every N steps,
    as seed 001's train.py evaluated inside its training loop. Marked with ``phase("eval_in_train_hooks")``, that
    evaluation's memory is a phase of its own, not part of the train peak. It runs in eval mode: a training hook runs
    with the model in training mode, where its BatchNorm layers would normalise the held-out patches with their own
    statistics and fold them into the running statistics the model is scored with (``sample_in_train_mode`` keeps
    that mistake, for EvalNoGradGuard to find)."""

    def __init__(self, sample_every: int = 0, sample_in_train_mode: bool = False) -> None:
        super().__init__()
        self.sample_every = sample_every
        self.sample_in_train_mode = sample_in_train_mode

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.sample_every and self.global_step % self.sample_every == 0:
            with phase("eval_in_train_hooks"), torch.no_grad():
                if not self.sample_in_train_mode:
                    self.eval()
                try:
                    for noisy, _ in self.trainer.datamodule.val_dataloader():
                        self(noisy.to(self.device))
                finally:
                    self.train()


def suite(args: argparse.Namespace) -> list:
    """Every callback of the suite, as a user would attach them."""
    return [
        # FLOPs counted once after the warm-up; pixels per batch (N x H x W of the noisy images) for pixels/s
        IterationTimer(warmup_steps=5, target_steps=30_000, run_notes=args.notes, flops_per_batch="auto",
                       items_fn=lambda batch: batch[0].shape[0] * batch[0].shape[-2] * batch[0].shape[-1]),
        SectionProfiler(report_every_n_steps=100),
        VRAMMonitor(),
        EvalNoGradGuard(),
        # quality on the held-out photo at the last step, as seed 001 measured it at a fixed iteration
        QualityGate(metrics=image_metrics(args.baseline), at_steps=[args.max_steps], baseline=args.baseline,
                    tolerance=0.005),
    ]


def main(argv: list = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/demo", help="folder for the runs (runs/demo)")
    parser.add_argument("--name", default="baseline", help="this run's name, a subfolder of --out")
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--patch-size", type=int, default=48)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--val-every", type=int, default=50, help="validate every N training batches")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--notes", default=None, help="a note for this run, shown by `lightning-perf report`")
    parser.add_argument("--sample-every", type=int, default=0,
                        help="also denoise the held-out patches from a training hook every N steps (0: never)")
    parser.add_argument("--sample-in-train-mode", action="store_true",
                        help="with --sample-every: sample with the model left in training mode (the mistake"
                             " EvalNoGradGuard finds: BatchNorm's running statistics change)")
    parser.add_argument("--baseline", default=None,
                        help="gate quality against this perf_summary.json or baseline file (within 0.5%%)")
    args = parser.parse_args(argv)

    quiet_upstream_noise()
    seed_everything(args.seed, workers=True)
    if not os.environ.get("OMP_NUM_THREADS"):  # a count set there is the caller's (race and matrix set it, the tests)
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    logger = TensorBoardLogger(save_dir=args.out, name=args.name, version="")
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=args.max_steps,
        val_check_interval=args.val_every,
        check_val_every_n_epoch=None,
        logger=logger,
        callbacks=suite(args),
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=10,
    )
    data = DenoiseDataModule(batch_size=args.batch_size, patch_size=args.patch_size, num_workers=args.workers)
    trainer.fit(DemoNet(sample_every=args.sample_every, sample_in_train_mode=args.sample_in_train_mode),
                datamodule=data)

    path = os.path.join(logger.log_dir, "perf_summary.json")
    with open(path) as fh:
        summary = json.load(fh)
    timer = summary["iteration_timer"]
    ms = timer["ms_per_iter"]
    print()
    print(f"run {args.name!r}: status {summary['status']}")
    print(f"  speed      {ms['mean']:.1f} ms/iter mean ({timer['it_per_s']:.1f} it/s), median {ms['median']:.1f},"
          f" p95 {ms['p95']:.1f} ms, p99 {ms['p99']:.1f} ms ({timer['measured_iterations']} iterations measured)")
    tflops = timer["tflops_per_s"]
    flops = f"{tflops:.3f} TFLOP/s" if tflops is not None else f"TFLOP/s unavailable: {timer['unavailable']['tflops_per_s']}"
    mfu = (f"MFU {timer['mfu_pct']:.1f}%" if timer["mfu_pct"] is not None
           else f"MFU unavailable: {timer['unavailable']['mfu_pct']}")
    pixels = f"{timer['items_per_s'] / 1e6:.2f} Mpixels/s" if timer["items_per_s"] is not None else "pixels/s unknown"
    print(f"  compute    {flops}, {pixels}; {mfu}")
    tail = timer["tail"]
    causes = ", ".join(f"{name} {c['iterations']}" for name, c in tail["by_cause"].items() if c["iterations"])
    print(f"  tail       {tail['share_pct']:.1f}% of training time in {counted(tail['iterations'], 'iteration')}"
          f" over 2x the median{': ' + causes if causes else ''}"
          + (f"; {tail['insights'][0]}" if tail["insights"] else ""))
    with_eval = timer["projected_time_to_target_with_eval_s"]
    print(f"  time       train {timer['train_time_s']:.1f} s, eval {timer['eval_time_s']:.1f} s;"
          f" 30,000 iterations would take {timer['projected_time_to_target_s'] / 3600:.2f} h training,"
          f" {with_eval / 3600:.2f} h with evaluation")
    profile = summary["section_profiler"]
    shares = sorted(((r["share_pct"] or 0.0, n) for n, r in profile["sections"].items()), reverse=True)[:3]
    print("  sections   " + ", ".join(f"{n} {pct:.0f}%" for pct, n in shares) + f"; {profile['insights'][0]}")
    vram = summary["vram"]
    peaks = {phase: values.get("peak_allocated_mb") or values.get("host_rss_peak_mb")
             for phase, values in vram["phases"].items()}
    hooks = (f", peak eval in train hooks {peaks['eval_in_train_hooks']:.0f} MB" if "eval_in_train_hooks" in peaks
             else "")
    print(f"  memory     peak train {peaks.get('train', 0):.0f} MB, peak eval {peaks.get('validation', 0):.0f} MB"
          f"{hooks} ({vram['source']}); leak suspected: {vram['leak_suspected']}")
    guard = summary["eval_no_grad_guard"]
    verdict = {True: "clean", False: "FINDINGS", None: "not fully checked"}[guard["clean"]]
    in_training = guard["train_mode_eval_forwards"]
    modules = sorted({name for f in guard["train_mode_findings"] for name in f["modules"]})
    print(f"  evaluation {verdict}: {guard['grad_enabled_eval_forwards']} eval forwards with grad on,"
          f" {len(guard['retained_graphs'])} retained graphs,"
          f" {in_training if in_training is not None else 'unknown'} forwards in training mode"
          + (f" ({', '.join(modules)})" if modules else ""))
    gate = summary["quality_gate"]
    values = ", ".join(f"{k.upper()} {v['value']:.4f}" for k, v in gate["metrics"].items())
    verdict = {True: "gate passed", False: "gate FAILED", None: "no baseline, not gated"}[gate["passed"]]
    at = f" at step {gate['step']}" + (f", baseline at step {gate['baseline_step']}" if gate["baseline_step"] is not None
                                        else "")
    print(f"  quality    {values}{at} ({verdict})")
    if "lpips" in gate["unavailable"]:
        print("             LPIPS unavailable here: pretrained backbone weights could not be loaded (offline)")
    elif "lpips" not in gate["metrics"]:
        print("             LPIPS left out: the baseline run could not measure it")
    print(f"  summary    {path}")
    print(f"  tensorboard --logdir {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
