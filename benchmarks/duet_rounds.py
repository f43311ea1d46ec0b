"""Duet and together rounds against sequential rounds on this machine, at the same wall-clock budget (issue 61,
docs/bench.md): A and B are one CPU-bound torch loop, B doing 10% more work a step. Sequential: each round runs A
then B (the order reversed each round), each a fresh process, as ``race`` does. Duet: each round starts A and B at
the same time, each pinned to its own core (``taskset``), the cores swapped every round, one thread each. Together
(``race --together``): each round starts A and B at the same time on the same core (the least busy one), one thread
each, the one that ends first replaced by a spin loop until the other ends
(:func:`lightning_perf.bench.together.run_together`). The per-round log-ratio's spread (wall time per step, and CPU
time per step beside it) decides how soon the always-valid interval of ``lightning_perf.bench.sequential`` finds the
change: printed are the rounds run in the budget, the spread, the verdict at the end of the budget and the smallest
change those rounds would find. ``--busy N`` keeps N cores busy with spin loops meanwhile (duet needs two free
cores, so with one core busy on two, run ``--designs sequential together``).

Run: PYTHONPATH=$PWD python benchmarks/duet_rounds.py --budget 120 [--steps 200] [--busy 1]
                                                      [--designs sequential duet together]"""

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

from lightning_perf.bench.sequential import decide_rounds, smallest_change
from lightning_perf.bench.together import pick_cores, run_together

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


def together(script, steps, core, k, tmp):
    """A and B at once on ``core``, as race --together runs a round: their (wall, CPU) rates."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    order = [("a", 10), ("b", 11)] if k % 2 else [("b", 11), ("a", 10)]
    outs = {name: open(os.path.join(tmp, f"{name}.out"), "w+") for name, _ in order}
    try:
        ended = run_together([([sys.executable, script, str(steps), str(reps)], outs[name], env)
                              for name, reps in order], [core])
        if any(code != 0 for code, _ in ended):
            raise SystemExit(f"a together round failed: {ended}")
        got = {}
        for name, fh in outs.items():
            fh.seek(0)
            got[name] = tuple(map(float, fh.read().split()))
    finally:
        for fh in outs.values():
            fh.close()
    return got["a"], got["b"]


def run(design, script, steps, budget):
    d_wall, d_cpu, began, k = [], [], time.perf_counter(), 0
    core = pick_cores(1)[0] if design == "together" else None
    while time.perf_counter() - began < budget:
        k += 1
        if design == "together":
            ra, rb = together(script, steps, core, k, os.path.dirname(script))
        elif design == "duet":
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
    parser.add_argument("--busy", type=int, default=0, help="spin loops kept running meanwhile (default: 0)")
    parser.add_argument("--designs", nargs="+", choices=("sequential", "duet", "together"),
                        default=["sequential", "duet", "together"])
    args = parser.parse_args()
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        table(args)
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


def table(args):
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "work.py")
        with open(script, "w") as fh:
            fh.write(WORK)
        print("| design | figure | rounds | B against A (true: -9.1%) | sd of round log-ratio | verdict |"
              " smallest change found | rounds for 10% |")
        print("|---|---|---|---|---|---|---|---|")
        for design in args.designs:
            d_wall, d_cpu = run(design, script, args.steps, args.budget)
            print(line(design, "wall time", d_wall))
            print(line(design, "CPU time", d_cpu))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
