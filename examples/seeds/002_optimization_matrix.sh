#!/usr/bin/env bash
# Seed 002, "ML Training Optimization Benchmark Report": one training under switches (AMP, persistent workers and
# their combination, torch.compile), each in its own process: a header with system, CPU cores, RAM, num_workers,
# model and versions; end-to-end time and speedup (the whole fit, warm-up and evaluation included), total and train
# time, warm-up cost, steady-state speedup, break-even, samples/s, peak memory, per-epoch times, status (a variant
# over 3x slower than the baseline flagged), findings (best, diminishing returns, warm-up cost).
set -euo pipefail
source "$(dirname "$0")/_common.sh"
OUT="${OUT:-$ROOT/runs/seeds/002}"
rm -rf "$OUT"
cd "$ROOT/examples"
CONFIG=denoise_matrix.yaml
STEPS="${SEED_STEPS:-80}"
if [ "$STEPS" != 80 ]; then  # the same training, shorter: its validation and quality check move with it
  mkdir -p "$OUT"
  CONFIG="$OUT/denoise_matrix.yaml"
  sed -e "s/^  max_steps: 80$/  max_steps: $STEPS/" -e "s/^        at_steps: \[80\]$/        at_steps: [$STEPS]/" \
    -e "s/^  val_check_interval: 40$/  val_check_interval: $((STEPS / 2))/" denoise_matrix.yaml > "$CONFIG"
fi
# torch.compile on CPU builds C++ kernels: the compile variant (its warm-up and break-even) needs a C++ compiler.
COMPILE=()
if command -v "${CXX:-c++}" >/dev/null 2>&1; then
  COMPILE=(--variant compile)
else
  echo "no C++ compiler on PATH: the compile variant is left out" >&2
fi
# Interleaved rounds with the baseline's A/A copy (baseline_aa) in each: up to 2 rounds, a new round only while it is
# expected to end within 2 minutes of the start (--budget); the verdicts are from the rounds that ran. A real study:
# the default 5 rounds (docs/cli.md says what each costs).
"${LP[@]}" matrix --script denoise_cli.py --config "$CONFIG" --repeats 2 --budget 120 \
  --variant baseline --variant workers --variant amp --variant amp+workers ${COMPILE[@]+"${COMPILE[@]}"} \
  --out "$OUT" --report "$OUT/report.md" --csv "$OUT/report.csv"
