"""The real check of issue 61 (docs/bench.md, "Rounds until decided"): with one core kept busy by a spin loop,
``lightning-perf race`` at its defaults (``--repeats auto``, a 10-minute budget, the A/A copy, ``--threads auto``) of
a training command against itself plus a known cost worth ~10% of its step is decided "slower" in at least 4 of 5
tries, and the same command against itself is never decided different.

    PYTHONPATH=$PWD python benchmarks/busy_core_race.py [--tries 5] [--busy 1] [--budget 10m] [--max-rounds N]
                                                        [--steps 150] [--reps 40] [--extra-pct 10]
                                                        [--no-calibrate] [--together]
                                                        [--out runs/busy_core_race]

Starts ``--busy`` spin processes (``python -c "while True: pass"``) for the whole check and stops them at the end.
Each try runs two races, one after the other, each up to ``--budget``: ``base`` against ``slow`` (the step
``--extra-pct`` longer, by more products in its matmul chain: a cost of CPU work that a busy core stretches as it
stretches the rest of the step), and ``a`` against ``b`` (one command; ``b`` has an argument the script ignores, so
the race keeps it as a command of its own and runs the A/A copy beside both). The training (``TRAIN`` below) is a
Lightning fit of a small MLP on CPU whose ``training_step`` also runs the chain. How many products make
``--extra-pct`` of the step is calibrated first, before the spin loops start (a busy core bends the step's median: 47
products against 40 read 3.3% slower at the median beside a spin loop, 7.5% on the quiet machine): one fit
whose chain alternates between the base's products and half as many again, in blocks of 5 batches, gives the median
step of each, and so the cost of a product (runs of one command fall in two modes here, which the two counts of one
fit share), with torch on the threads ``--threads auto`` will give the races' runs (the cores the spin loops
leave); ``slow`` gets ``extra-pct`` of the base's median in products.
Without it (``--no-calibrate``) ``slow`` has ``reps x (1 + extra-pct / 100)`` products, ``extra-pct`` of the chain
only: 44 products against 40 made the step 3.7% slower on the quiet machine, not 10. ``--tries 0`` calibrates and
stops. Prints one line per race (verdict, ratio and interval, rounds, why they stopped, seconds) and the tally; exit
0 when the tally meets the check, 1 when it does not. At the defaults it takes up to 2 x 5 x 10 minutes. Each race's
``race.json`` and runs stay under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

from lightning_perf.bench.threads import choose_threads, thread_env  # (run with PYTHONPATH=$PWD)

#: The training command: ARGS are the steps and the matmul products a step; any further argument is ignored.
TRAIN = '''
import json
import statistics
import sys
import time

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class Net(LightningModule):
    def __init__(self, reps):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        self.reps = reps
        self.w = torch.randn(256, 256, generator=torch.Generator().manual_seed(1)) / 16.0

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = torch.tanh(self.net[0](x))
        with torch.no_grad():  # the known cost: a chain of products, reps of them a step
            z = h.detach()
            for _ in range(self.reps):
                z = torch.tanh(z @ self.w)
        return torch.nn.functional.mse_loss(self.net[2](torch.relu(h)) + 0.0 * z.mean(), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Alternate(Callback):
    """The calibration: the chain's products alternate between two counts in blocks of 5 batches inside one fit; the
    steps of each count (batch end to batch end, a block's first step left out) are kept."""

    def __init__(self, counts):
        self.counts, self.steps, self.last, self.times = counts, 0, None, {c: [] for c in counts}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        pl_module.reps = self.counts[(self.steps // 5) % 2]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        t = time.perf_counter()
        if self.last is not None and self.steps % 5 != 0 and self.steps >= 20:
            self.times[pl_module.reps].append(t - self.last)
        self.last, self.steps = t, self.steps + 1


def fit(steps, net, callbacks=()):
    x = torch.randn(2048, 64, generator=torch.Generator().manual_seed(0))
    trainer = Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", devices=1, callbacks=list(callbacks))
    trainer.fit(net, DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=64))


if __name__ == "__main__":
    if sys.argv[1] == "calibrate":  # calibrate STEPS REPS MORE: the median step (ms) of each count, as JSON
        steps, reps, more = (int(a) for a in sys.argv[2:5])
        alternate = Alternate((reps, reps + more))
        fit(steps, Net(reps), [alternate])
        print(json.dumps({str(c): 1e3 * statistics.median(ts) for c, ts in alternate.times.items()}))
    else:
        fit(int(sys.argv[1]), Net(int(sys.argv[2])))
'''

#: Steps of the calibration's fit (blocks of 5 alternating between the two chains; 20 steps of warm-up left out)
CALIBRATION_STEPS = 400

#: The check: the share of tries the slower command must be decided slower in (4 of 5).
SLOWER_SHARE = 0.8


def race(out: str, commands: list, budget: str, max_rounds: int | None, together: bool = False) -> dict:
    """One ``lightning-perf race`` at its defaults but ``--out`` (and ``--max-rounds``, ``--together`` where given):
    its race.json, with the seconds it took."""
    argv = [sys.executable, "-m", "lightning_perf.cli", "race", "--out", out, "--budget", budget]
    if together:
        argv.append("--together")
    for name, command in commands:
        argv += ["--cmd", f"{name}={command}"]
    if max_rounds is not None:
        argv += ["--max-rounds", str(max_rounds)]
    began = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True)
    took = time.perf_counter() - began
    path = os.path.join(out, "race.json")
    if not os.path.isfile(path):
        raise SystemExit(f"race wrote no {path} (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    with open(path) as fh:
        result = json.load(fh)
    result["_seconds"] = took
    return result


def verdict_line(label: str, result: dict, name: str) -> str:
    cmp = result["comparisons"][name]
    between, rounds = cmp.get("between_runs") or {}, result["rounds"]
    ratio = between.get("ratio")
    interval = ("" if between.get("low") is None
                else f" [{between['low']:.3f}, {between['high']:.3f}]")
    said = "n/a" if ratio is None else f"{ratio:.3f}x{interval}"
    return (f"{label}: {cmp['verdict']['verdict']}, {name} against {result['baseline']} {said}, {rounds['done']}"
            f" rounds, stopped: {rounds.get('stop')}, {result['_seconds']:.0f} s")


def calibrate(args: argparse.Namespace, script: str) -> tuple:
    """slow's products for a step ``extra_pct`` longer at the median, measured before the spin loops start, inside one
    fit: the chain alternates between the base's products and half as many again in blocks of 5 batches, and the
    median step of each gives the cost of a product (near the change, since the cost of a product grows with the
    chain). Runs of one command on this machine fall in two modes (the base's median step read 3.9 or 5.4-6.3 ms from
    one process to the next), which a process's two counts share; with the words for the first line."""
    more = max(1, args.reps // 2)
    # torch's threads as race's ``--threads auto`` will give each run once the spin loops run (its own rule, with
    # the spin loops' cores as the busy ones it will measure)
    choice = choose_threads("auto", measure=lambda: float(args.busy))
    env = thread_env(dict(os.environ), choice)
    threads = choice["threads"] or "torch's default number of"
    proc = subprocess.run([sys.executable, script, "calibrate", str(CALIBRATION_STEPS), str(args.reps), str(more)],
                          capture_output=True, text=True, env=env)
    try:
        medians = json.loads(proc.stdout.strip().splitlines()[-1])
        one, two = float(medians[str(args.reps)]), float(medians[str(args.reps + more)])
    except (IndexError, KeyError, ValueError) as err:
        raise SystemExit(f"calibration failed (exit {proc.returncode}, {err}): {proc.stderr.strip()[-2000:]}")
    per_product = (two - one) / more
    if per_product <= 0:
        raise SystemExit(f"calibration: the longer chain was not slower at the median ({two:.3f} against {one:.3f}"
                         " ms): rerun, or pass --no-calibrate")
    extra = max(1, int(round(args.extra_pct / 100.0 * one / per_product)))
    return args.reps + extra, (f"of the step, calibrated in one fit with no core busy and {threads} thread(s):"
                               f" median {one:.3f} ms, {per_product:.4f} ms a product, {args.reps + more} products"
                               f" {two:.3f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=5)
    parser.add_argument("--busy", type=int, default=1, help="spin processes kept running (default: 1)")
    parser.add_argument("--budget", default="10m", help="each race's --budget (default: 10m, race's own)")
    parser.add_argument("--max-rounds", type=int, default=None, help="each race's --max-rounds (default: race's)")
    parser.add_argument("--steps", type=int, default=150, help="training steps a run (default: 150)")
    parser.add_argument("--reps", type=int, default=40, help="matmul products a step of base (default: 40)")
    parser.add_argument("--extra-pct", type=float, default=10.0, help="slow's extra products, in %% (default: 10)")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="slow's extra products as extra-pct of the chain, not of the step (no calibration runs)")
    parser.add_argument("--together", action="store_true",
                        help="each race with --together (a round's commands at once on the free core)")
    parser.add_argument("--out", default=os.path.join("runs", "busy_core_race"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    script = os.path.abspath(os.path.join(args.out, "train.py"))
    with open(script, "w") as fh:
        fh.write(TRAIN.lstrip())
    py = sys.executable
    base = f"{py} {script} {args.steps} {args.reps}"
    if args.no_calibrate:
        slow_reps, said = int(round(args.reps * (1.0 + args.extra_pct / 100.0))), "of the chain, not calibrated"
    else:
        slow_reps, said = calibrate(args, script)
    spinners = [subprocess.Popen([py, "-c", "while True: pass"]) for _ in range(args.busy)]
    slower = different = 0
    try:
        print(f"busy cores: {args.busy}; base: {args.reps} products a step, slow: {slow_reps} (+{args.extra_pct:g}%"
              f" {said}); {args.steps} steps a run; each race --budget {args.budget}"
              + (f" --max-rounds {args.max_rounds}" if args.max_rounds else "")
              + (" --together" if args.together else ""), flush=True)
        for k in range(1, args.tries + 1):
            ab = race(os.path.join(args.out, f"try_{k}", "ab"),
                      [("base", base), ("slow", f"{py} {script} {args.steps} {slow_reps}")],
                      args.budget, args.max_rounds, args.together)
            print(verdict_line(f"try {k} A/B", ab, "slow"), flush=True)
            slower += ab["comparisons"]["slow"]["verdict"]["verdict"] == "slower"
            aa = race(os.path.join(args.out, f"try_{k}", "aa"), [("a", base), ("b", f"{base} again")],
                      args.budget, args.max_rounds, args.together)
            print(verdict_line(f"try {k} A/A", aa, "b"), flush=True)
            different += aa["comparisons"]["b"]["verdict"]["verdict"] in ("faster", "slower")
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()
    if args.tries == 0:
        return 0
    need = math.ceil(SLOWER_SHARE * args.tries)
    ok = slower >= need and different == 0
    print(f"tally: slow decided slower in {slower} of {args.tries} tries (the check: {need} or more); the A/A pair"
          f" decided different in {different} of {args.tries} (the check: none): {'PASSED' if ok else 'NOT MET'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
