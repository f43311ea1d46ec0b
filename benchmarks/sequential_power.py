"""The sequential rule's error rates and power on synthetic rounds with this machine's noise (docs/bench.md, "Rounds
until decided"): for each noise model, the share of 2,000 trials decided slower for a 5, 10 and 20% slowdown, stopped
at the first decision or at the cap of rounds; and the A/A pair's false-positive rate and "the same within +/-5%"
rate. Run: python benchmarks/sequential_power.py"""

from lightning_perf.bench.sequential import DEFAULT_MAX_ROUNDS
from lightning_perf.bench.sequential_sim import NOISE_MODELS, power_table, run_sequential

CAPS = (10, 20, DEFAULT_MAX_ROUNDS)
CHANGES = (5.0, 10.0, 20.0)


def main() -> None:
    table = power_table(changes=CHANGES, budgets=CAPS, trials=2000)
    print("| noise model | rounds cap | " + " | ".join(f"{c:g}% slower" for c in CHANGES)
          + " | A/A decided different | A/A the same within 5% | 5% change called the same |")
    print("|---|---|" + "---|" * (len(CHANGES) + 3))
    for model in NOISE_MODELS:
        for cap in CAPS:
            aa = run_sequential(model, 0.0, 2000, cap, seed=7 + cap)
            edge = run_sequential(model, -5.0, 2000, cap, seed=9 + cap)
            cells = " | ".join(f"{100 * table[model][cap][c]:.0f}%" for c in CHANGES)
            print(f"| {model} | {cap} | {cells} | {100 * (aa['faster'] + aa['slower']):.1f}% |"
                  f" {100 * aa['same']:.0f}% | {100 * edge['same']:.1f}% |")


if __name__ == "__main__":
    main()
