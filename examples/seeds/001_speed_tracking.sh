#!/usr/bin/env bash
# Seed 001, "Training Speed Tracking": phases of optimisation, each with its it/s, train and eval peak memory,
# loss, PSNR/SSIM/L1 at a fixed iteration gated within 0.5% of the baseline (at the baseline's step), a date and a
# note; then the phase table and a compare of the last phase with its section breakdown. The hand-made notes used
# nvidia-smi and screenshots; here VRAMMonitor and QualityGate record it all.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
OUT="${OUT:-$ROOT/runs/seeds/001}"
rm -rf "$OUT"
STEPS="${SEED_STEPS:-80}"
EVERY=$((STEPS / 2))
"${DEMO[@]}" --out "$OUT" --name baseline --max-steps "$STEPS" --val-every "$EVERY" --notes "Reference implementation"
"${DEMO[@]}" --out "$OUT" --name phase1 --max-steps "$STEPS" --val-every "$EVERY" --batch-size 4 \
  --baseline "$OUT/baseline/perf_summary.json" --notes "Smaller batches"
# as the seed's train.py did: evaluation run from a training hook (every 40 steps), marked so that VRAMMonitor gives
# it its own peak (`eval_in_train_hooks`) instead of folding it into the train peak. It samples in eval mode: left in
# training mode (`--sample-in-train-mode`), BatchNorm folds the held-out patches into its running statistics and the
# gated PSNR and SSIM rise (+1.9% and +4.7% once) for a reason no note names; EvalNoGradGuard finds that. In eval mode
# the quality is the baseline's: the workers and the sampling change speed only.
"${DEMO[@]}" --out "$OUT" --name phase2 --max-steps "$STEPS" --val-every "$EVERY" --workers 2 --sample-every "$EVERY" \
  --baseline "$OUT/baseline/perf_summary.json" --notes "Two DataLoader workers, held-out sampling every $EVERY steps"
# the comparison table of the notes, with dates, notes, loss, memory and the gate's verdict; each phase against the
# one before ("+0.24 it/s from Phase 1"), absolute changes beside the percentages, and the train-set PSNR the model
# logged (any logged scalar: the seed's Gaussian count and opacity would be --column gaussians --column opacity)
"${LP[@]}" report "$OUT"/baseline/perf_summary.json "$OUT"/phase1/perf_summary.json "$OUT"/phase2/perf_summary.json \
  --change-vs previous --column train_psnr --plot "$OUT/phases.png"
# where phase 2's change comes from: the section breakdown side by side
"${LP[@]}" compare "$OUT"/baseline/perf_summary.json "$OUT"/phase2/perf_summary.json
