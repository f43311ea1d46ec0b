#!/usr/bin/env bash
# Seed 002, "ML Training Optimization Benchmark Report": one training under switches (AMP, persistent workers and
# their combination), each in its own process: a header with system and versions, total and train time, speedup,
# samples/s, peak memory, per-epoch times, status, findings (best, diminishing returns, warm-up cost).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
OUT="${OUT:-$ROOT/runs/seeds/002}"
rm -rf "$OUT"
cd "$ROOT/examples"
"${LP[@]}" matrix --script denoise_cli.py --config denoise_matrix.yaml \
  --variant baseline --variant workers --variant amp --variant amp+workers \
  --out "$OUT" --report "$OUT/report.md" --csv "$OUT/report.csv"
