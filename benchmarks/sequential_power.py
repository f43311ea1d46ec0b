"""The sequential rule's error rates and power on synthetic rounds with this machine's noise (docs/bench.md, "Rounds
until decided"): for each noise model, the share of 2,000 trials decided slower for a 5, 10 and 20% slowdown, stopped
at the first decision or at the cap of rounds; and the A/A pair's false-positive rate and "the same within +/-5%"
rate. Run: python benchmarks/sequential_power.py

``--looks 5,10,15,20,30,40`` prints instead the rule beside the alternative it was chosen over: a group-sequential
design that reads a Student's t interval at those rounds only, each at 5% / (number of looks), on the same seeded
trials (10 and 20% slower, and the A/A pair, at caps of 20 and 40 rounds)."""

import argparse

from lightning_perf.bench.sequential import DEFAULT_MAX_ROUNDS
from lightning_perf.bench.sequential_sim import NOISE_MODELS, looks_boundary, power_table, run_sequential

CAPS = (10, 20, DEFAULT_MAX_ROUNDS)
CHANGES = (5.0, 10.0, 20.0)


def table() -> None:
    powers = power_table(changes=CHANGES, budgets=CAPS, trials=2000)
    print("| noise model | rounds cap | " + " | ".join(f"{c:g}% slower" for c in CHANGES)
          + " | A/A decided different | A/A the same within 5% | 5% change called the same |")
    print("|---|---|" + "---|" * (len(CHANGES) + 3))
    for model in NOISE_MODELS:
        for cap in CAPS:
            aa = run_sequential(model, 0.0, 2000, cap, seed=7 + cap)
            edge = run_sequential(model, -5.0, 2000, cap, seed=9 + cap)
            cells = " | ".join(f"{100 * powers[model][cap][c]:.0f}%" for c in CHANGES)
            print(f"| {model} | {cap} | {cells} | {100 * (aa['faster'] + aa['slower']):.1f}% |"
                  f" {100 * aa['same']:.0f}% | {100 * edge['same']:.1f}% |")


def against_looks(looks) -> None:
    rules = (("always valid, every round (race's)", None),
             (f"t at rounds {','.join(map(str, looks))} only, Bonferroni", looks_boundary(looks)))
    print("| rule | noise model | cap | 10% slower | 20% slower | A/A decided different |")
    print("|---|---|---|---|---|---|")
    for label, boundary in rules:
        for model in NOISE_MODELS:
            for cap in (20, DEFAULT_MAX_ROUNDS):
                cells = [run_sequential(model, -c, 2000, cap, seed=int(c * 10) + cap, boundary=boundary)["slower"]
                         for c in (10.0, 20.0)]
                aa = run_sequential(model, 0.0, 2000, cap, seed=7 + cap, boundary=boundary)
                print(f"| {label} | {model} | {cap} | {100 * cells[0]:.0f}% | {100 * cells[1]:.0f}% |"
                      f" {100 * (aa['faster'] + aa['slower']):.1f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--looks", default=None, help="rounds of the group-sequential alternative, e.g. 5,10,20,40")
    args = parser.parse_args()
    if args.looks is None:
        table()
        return
    try:
        looks = sorted({int(n) for n in args.looks.split(",")})
    except ValueError:
        parser.error(f"--looks {args.looks!r}: expected rounds as whole numbers, comma-separated, e.g. 5,10,20,40")
    if not looks or looks[0] < 3:
        parser.error(f"--looks {args.looks!r}: each look must be at round 3 or later")
    against_looks(looks)


if __name__ == "__main__":
    main()
