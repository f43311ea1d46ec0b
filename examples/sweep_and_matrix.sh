#!/usr/bin/env bash
# The two sweeps of seeds 003 and 002 on the demo denoiser, on CPU. Writes into runs/ at the repository root.
set -euo pipefail
cd "$(dirname "$0")"
LP=../.venv/bin/lightning-perf
mkdir -p ../runs
# Seed 003: memory and throughput over input sizes x batch sizes, training mode, 3 interleaved rounds (the default),
# CSV and four plots.
$LP bench --model denoise:make_net --input-sizes 32 48 64 --batch-sizes 1 4 8 --mode train --device cpu \
  --csv ../runs/bench.csv --plot ../runs/bench.png
# Seed 002: the same training under variants, each in its own process with the suite attached, in 5 interleaved
# rounds (the default) with the baseline's A/A copy, a new round only while it fits in 15 minutes.
$LP matrix --script denoise_cli.py --config denoise_matrix.yaml \
  --variant baseline --variant "bs4=--data.batch_size=4" --variant persistent_workers \
  --budget 900 --out ../runs/matrix --report ../runs/matrix.md --csv ../runs/matrix.csv
