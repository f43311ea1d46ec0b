#!/usr/bin/env bash
# Seed 001, "Training Speed Tracking": phases of optimisation, each with its it/s, train and eval peak memory,
# loss, PSNR/SSIM/L1 at a fixed iteration gated within 0.5% of the baseline, a date and a note; then the phase
# table. The hand-made notes used nvidia-smi and screenshots; here VRAMMonitor and QualityGate record it all.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
OUT="${OUT:-$ROOT/runs/seeds/001}"
rm -rf "$OUT"
"${DEMO[@]}" --out "$OUT" --name baseline --max-steps 80 --val-every 40 --notes "Reference implementation"
"${DEMO[@]}" --out "$OUT" --name phase1 --max-steps 80 --val-every 40 --batch-size 4 \
  --baseline "$OUT/baseline/perf_summary.json" --notes "Smaller batches"
"${DEMO[@]}" --out "$OUT" --name phase2 --max-steps 80 --val-every 40 --workers 2 \
  --baseline "$OUT/baseline/perf_summary.json" --notes "Two DataLoader workers"
# the comparison table of the notes, with dates, notes, loss, memory and the gate's verdict
"${LP[@]}" report "$OUT"/baseline/perf_summary.json "$OUT"/phase1/perf_summary.json "$OUT"/phase2/perf_summary.json \
  --plot "$OUT/phases.png"
