# Shared by the seed scripts: where things are, and the command. PYTHON and OUT may be set by the caller; SEED_STEPS
# shortens every training of a script (validation, sampling and the quality check move with it) and SEED_ROUNDS sets
# the rounds of 003's sweeps (3): the tests use them.
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
case "$PY" in  # a relative path keeps working after the scripts change folder
  /*) ;;
  */*) PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" ;;
esac
LP=("$PY" -m lightning_perf.cli)
DEMO=("$PY" "$ROOT/examples/demo.py")
