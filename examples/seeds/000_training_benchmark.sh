#!/usr/bin/env bash
# Seed 000, "Training Performance Benchmark Guide": benchmark a baseline and an optimised training, then compare:
# ms/iter, it/s, min/median/mean/p95/p99/max, speedup with its CI, time to 30k iterations and time saved.
# The hand-made script timed its own loop; here the run is a real Lightning fit with IterationTimer attached.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
OUT="${OUT:-$ROOT/runs/seeds/000}"
rm -rf "$OUT"
# "python benchmark_training.py ... --output training_benchmark_baseline", then the same in the optimised checkout, and
# "--compare": here the two trainings race in interleaved rounds (baseline, optimized, the baseline again; then the
# other way round), each run a fresh process with the suite attached (`lightning-perf run`'s hook: the demo keeps its
# own callbacks), each run's summary in $OUT/<name>/repeat_<k>/. The baseline's second copy in the same rounds is the
# A/A noise floor: a speedup is decided only beyond it, from the spread between the rounds. The optimised version: two
# DataLoader workers feeding the same training.
STEPS="${SEED_STEPS:-60}"
DEMO_CMD="$(printf '%q ' "${DEMO[@]}") --out $(printf '%q' "$OUT/demo") --max-steps $STEPS --val-every $((STEPS / 2))"
"${LP[@]}" race --out "$OUT" --repeats 2 \
  --cmd "baseline=$DEMO_CMD --name baseline" \
  --cmd "optimized=$DEMO_CMD --name optimized --workers 2"
