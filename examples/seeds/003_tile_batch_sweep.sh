#!/usr/bin/env bash
# Seed 003, "Stage 2 Memory & Throughput Benchmarking": a sweep over input sizes x batch sizes in training mode,
# rows appended to a CSV, four plots (the memory-vs-throughput panel with its frontier line), the analysis (per-sample
# cost, pixel throughput, batch-size effects, the frontier and its trade-offs, the seed's verdicts: "384 more
# efficient", "larger tiles benefit less from batching", each said only where the 95% intervals between the sweep's
# interleaved rounds (--rounds 3: every configuration measured once a round) exclude no change); the plots again
# from the CSV alone; a second sweep compared with the first, within its noise; both sweeps in one CSV.
set -euo pipefail
source "$(dirname "$0")/_common.sh"
OUT="${OUT:-$ROOT/runs/seeds/003}"
rm -rf "$OUT"
mkdir -p "$OUT"
ROUNDS="${SEED_ROUNDS:-3}"
cd "$ROOT/examples"
# "python scripts/benchmark_stage2.py --tile_sizes 256 384 --batch_sizes 1 2 --mode train"
"${LP[@]}" bench --model denoise:make_net --input-sizes 32 48 --batch-sizes 1 2 4 --mode train --device cpu \
  --warmup 2 --iters 5 --rounds "$ROUNDS" --no-progress --csv "$OUT/bench.csv" --plot "$OUT/bench.png"
# "python scripts/visualize_benchmarks.py --input logs/stage2_bench.csv --output reports/stage2_bench.png"
"${LP[@]}" bench --from-csv "$OUT/bench.csv" --plot "$OUT/from_csv.png"
# after a change: sweep again and compare configuration by configuration
"${LP[@]}" bench --model denoise:make_net --input-sizes 32 48 --batch-sizes 1 2 4 --mode train --device cpu \
  --warmup 2 --iters 5 --rounds "$ROUNDS" --no-progress --csv "$OUT/bench_new.csv"
# each change with the noise it must beat (the 95% interval between the two sweeps' rounds); inside it: "within noise"
"${LP[@]}" bench-compare "$OUT/bench.csv" "$OUT/bench_new.csv"
# both sweeps in one CSV, as the default appended runs/bench.csv collects them: each row carries its sweep_id, so
# --from-csv shows the latest sweep, --sweep all both (one plot line per sweep), and bench-compare of the one file
# compares the latest sweep with the one before
{ cat "$OUT/bench.csv"; tail -n +2 "$OUT/bench_new.csv"; } > "$OUT/bench_all.csv"
"${LP[@]}" bench --from-csv "$OUT/bench_all.csv" --sweep all --plot "$OUT/all_sweeps.png"
"${LP[@]}" bench-compare "$OUT/bench_all.csv" "$OUT/bench_all.csv"
