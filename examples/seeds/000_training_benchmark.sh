#!/usr/bin/env bash
# Seed 000, "Training Performance Benchmark Guide": benchmark a baseline and an optimised training, then compare:
# ms/iter, it/s, min/median/mean/p95/p99/max, speedup with its CI, time to 30k iterations and time saved.
# The hand-made script timed its own loop; here the run is a real Lightning fit with IterationTimer attached.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
OUT="${OUT:-$ROOT/runs/seeds/000}"
rm -rf "$OUT"
# "python benchmark_training.py ... --num_iterations 1000 --output training_benchmark_baseline"
"${DEMO[@]}" --out "$OUT" --name baseline --max-steps 120 --val-every 60
# the optimised version: two DataLoader workers feeding the same training
"${DEMO[@]}" --out "$OUT" --name optimized --max-steps 120 --val-every 60 --workers 2
# "python benchmark_training.py --compare baseline/....json optimized/....json"
"${LP[@]}" compare "$OUT/baseline/perf_summary.json" "$OUT/optimized/perf_summary.json" --iterations 30000
