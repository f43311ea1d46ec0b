"""Duet rounds against sequential rounds on this machine, at the same wall-clock budget (issue 61, docs/bench.md):
A and B are one CPU-bound torch loop, B doing 10% more work a step. Sequential: each round runs A then B (the order
reversed each round), each a fresh process, as ``race`` does. Duet: each round starts A and B at the same time, each
pinned to its own core (``taskset``), the cores swapped every round, one thread each. The per-round log-ratio's spread
(wall time per step, and CPU time per step beside it) decides how soon the always-valid interval of
``lightning_perf.bench.sequential`` finds the change: printed are the rounds run in the budget, the spread, the
verdict at the end of the budget and the smallest change those rounds would find.

Run: PYTHONPATH=$PWD python benchmarks/duet_rounds.py --budget 120 [--steps 200]"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

from lightning_perf.bench.sequential import decide_rounds, smallest_change

WORK = r'''
import sys, time, torch
torch.set_num_threads(1)
steps, reps = int(sys.argv[1]), int(sys.argv[2])
x, w = torch.randn(64, 256), torch.randn(256, 256)
for _ in range(20):
    for _ in range(reps):
        x = torch.tanh(x @ w)
wall, cpu = time.perf_counter(), time.process_time()
for _ in range(steps):
    for _ in range(reps):
        x = torch.tanh(x @ w)
print(steps / (time.perf_counter() - wall), steps / (time.process_time() - cpu))
'''


def start(script, steps, reps, core=None):
    argv = [sys.executable, script, str(steps), str(reps)]
    if core is not None:
        argv = ["taskset", "-c", str(core)] + argv
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)


def rates(proc):
    out, _ = proc.communicate(timeout=600)
    wall, cpu = map(float, out.split())
    return wall, cpu


def run(design, script, steps, budget):
    d_wall, d_cpu, began, k = [], [], time.perf_counter(), 0
    while time.perf_counter() - began < budget:
        k += 1
        if design == "duet":
            cores = (0, 1) if k % 2 else (1, 0)
            a, b = start(script, steps, 10, cores[0]), start(script, steps, 11, cores[1])
            ra, rb = rates(a), rates(b)
        else:
            order = [("a", 10), ("b", 11)] if k % 2 else [("b", 11), ("a", 10)]
            got = {name: rates(start(script, steps, reps)) for name, reps in order}
            ra, rb = got["a"], got["b"]
        d_wall.append(math.log(rb[0]) - math.log(ra[0]))
        d_cpu.append(math.log(rb[1]) - math.log(ra[1]))
    return d_wall, d_cpu


def line(design, figure, d):
    found = decide_rounds(d)
    small = smallest_change(found["sd"], len(d))
    return (f"| {design} | {figure} | {len(d)} | {100 * (math.exp(sum(d) / len(d)) - 1):+.1f}% |"
            f" {100 * found['sd']:.1f}% | {found['verdict']} |"
            f" {'-' if small is None else f'{100 * math.expm1(small):.0f}%'} | {found['rounds_for_10pct']} |")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "work.py")
        with open(script, "w") as fh:
            fh.write(WORK)
        print("| design | figure | rounds | B against A (true: -9.1%) | sd of round log-ratio | verdict |"
              " smallest change found | rounds for 10% |")
        print("|---|---|---|---|---|---|---|---|")
        for design in ("sequential", "duet"):
            d_wall, d_cpu = run(design, script, args.steps, args.budget)
            print(line(design, "wall time", d_wall))
            print(line(design, "CPU time", d_cpu))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
