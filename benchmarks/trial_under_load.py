"""An A/B trial inside one run against two separate runs, under the same load: a user change that adds ~5% to a step.

    PYTHONPATH=$PWD python benchmarks/trial_under_load.py [--busy 1] [--steps 330] [--repeats 1] [--threads N]
                                                          [--work torch|spin] [--block 10] [--extra-pct 5]

Starts ``--busy`` spin processes (``python -c "while True: pass"``) for the whole measurement and stops them at the
end. Then it measures how many cores are busy (the machine's CPU counters over 1 s, as ``matrix --threads auto``
reads them: the spinners and everyone else's work) and runs the fits with torch's intra-op threads set to the free
cores (at least 1; ``--threads`` overrides): a thread
more than the free cores makes every step wait for a busy core (on a 2-core machine with one core spinning, the
denoise example ran 67-128 ms/iter with torch's default 2 threads, 28 with 1). It prints its choice.

The step (``--work torch``, the default) is a TinyModel step plus float32 matmuls sized at start-up to ~10 ms under
the chosen threads; ``--work spin`` is 10 ms of host CPU time instead. The change adds ``--extra-pct`` of that step
(a fixed amount of host CPU time). The "truth" is 1 + that CPU time / the off arm's process CPU time per iteration
in the same fit (the off run's, for the two separate runs): CPU time is not stretched by waiting for a core, and
with an equal share of a core in both arms the wall-clock ratio equals it; the measured CPU ratio on/off is printed
beside it. Per repeat: one fit with ``ABTrial`` (warm-up 10, then blocks of ``--block`` iterations in pairs, as
many as ``--steps`` holds), two separate fits (the change off, then on) timed by IterationTimer and compared as
``lightning-perf compare`` would (its within-run interval), and a no-op trial (the same switches, no extra work).
Prints the figures and the load average; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def matmul_size(target_s: float = 0.010) -> int:
    """The side of square float32 matrices whose product takes about ``target_s`` under the current threads."""
    import torch

    n = 64
    while n < 4096:
        a = torch.randn(n, n)
        a @ a  # warm
        start = time.perf_counter()
        for _ in range(3):
            a @ a
        took = (time.perf_counter() - start) / 3
        if took >= target_s:
            break
        n = int(n * min(2.0, max(1.1, (target_s / max(took, 1e-6)) ** (1 / 3))))
    return n


def cpu_spin(seconds: float) -> None:
    """``seconds`` of this thread's CPU time: a fixed amount of work, whatever share of a core the load leaves."""
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        pass


def cpu_per_arm():
    """A Lightning callback: the process CPU time of each iteration (end to end), by the model's ``extra`` flag
    during it (placed before ABTrial, it reads the flag before the trial switches it). CPU time is not stretched by
    the load, so the ratio of the arms' CPU per iteration is the change's true cost: the truth the wall-clock ratios
    are held against (with an equal share of a core in both arms, the two ratios are equal)."""
    from lightning.pytorch import Callback

    class CpuPerArm(Callback):
        def __init__(self) -> None:
            self.last, self.sums = None, {False: [0.0, 0], True: [0.0, 0]}

        def on_train_batch_end(self, trainer, pl_module, *args):
            now = time.process_time()
            if self.last is not None and trainer.global_step > 10:
                cell = self.sums[bool(pl_module.extra)]
                cell[0] += now - self.last
                cell[1] += 1
            self.last = now

        def mean(self, arm: bool) -> float:
            total, n = self.sums[arm]
            return total / n if n else float("nan")

    return CpuPerArm()


def loaded_model(work: str, size: int, extra_s: float):
    """A step of ~10 ms (``work``: matmuls of side ``size``, or host spinning); with ``extra`` on, ``extra_s`` more
    seconds of host CPU work."""
    import torch
    from helpers import TinyModel
    from torch.utils.data import DataLoader, TensorDataset

    class Loaded(TinyModel):
        def __init__(self) -> None:
            super().__init__()
            self.extra = False
            self.a = torch.randn(size, size, generator=torch.Generator().manual_seed(1))

        def training_step(self, batch, batch_idx):
            if work == "torch":
                self.a @ self.a
            else:
                cpu_spin(0.01)
            if self.extra:
                cpu_spin(extra_s)
            return super().training_step(batch, batch_idx)

        def train_dataloader(self):
            x = torch.randn(8192, 16, generator=torch.Generator().manual_seed(0))
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

    return Loaded()


def trial_fit(args, common, work, size, extra_s, no_op=False):
    from helpers import find_summary, fit
    from lightning_perf import ABTrial

    model = loaded_model(work, size, 0.0 if no_op else extra_s)
    trial = ABTrial("extra_work", switch_on=lambda t, m: setattr(m, "extra", True),
                    switch_off=lambda t, m: setattr(m, "extra", False), warmup=10, block=args.block,
                    blocks=2 * ((args.steps - 10) // (2 * args.block)), verbose=False)
    cpu = cpu_per_arm()
    with tempfile.TemporaryDirectory() as root:
        fit(root, [cpu, trial], model=model, **common)
        t = find_summary(root)["trial"]
    return t, 1 + extra_s / cpu.mean(False), cpu.mean(True) / cpu.mean(False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=1, help="spin processes kept running (default 1)")
    parser.add_argument("--steps", type=int, default=330, help="iterations a fit (default 330)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the free cores)")
    parser.add_argument("--work", choices=("torch", "spin"), default="torch", help="the step's work (default torch)")
    parser.add_argument("--block", type=int, default=10, help="iterations a trial block (default 10, ABTrial's)")
    parser.add_argument("--extra-pct", type=float, default=5.0, help="the change's cost, %% of the step (default 5)")
    args = parser.parse_args()

    import torch
    from helpers import find_summary, fit
    from lightning_perf import IterationTimer
    from lightning_perf.bench.threads import choose_threads
    from lightning_perf.summary.compare import headline

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        time.sleep(0.5)
        choice = choose_threads(args.threads or "auto", environ={})  # the matrix's rule: the cores left free
        busy, threads = choice["busy_cores"], choice["threads"] or torch.get_num_threads()
        torch.set_num_threads(threads)
        size = matmul_size() if args.work == "torch" else 0
        common = dict(max_steps=args.steps, limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=50,
                      enable_progress_bar=False)
        probe, cpu = loaded_model(args.work, size, 0.0), cpu_per_arm()  # the step's CPU time, for the extra's size
        with tempfile.TemporaryDirectory() as root:
            fit(root, [cpu, IterationTimer(warmup_steps=10)], model=probe, **dict(common, max_steps=60))
            step_ms = find_summary(root)["iteration_timer"]["ms_per_iter"]["mean"]
        extra_s = args.extra_pct / 100.0 * cpu.mean(False)
        print(f"[setup] {os.cpu_count()} cores, {'n/a' if busy is None else f'{busy:.2f}'} busy with {args.busy}"
              f" spinner(s) running; torch threads {threads} ({'--threads' if args.threads else 'the free cores'});"
              f" work {args.work}" + (f" (matmul {size}x{size})" if size else "") + f"; step {step_ms:.2f} ms wall,"
              f" {1000 * cpu.mean(False):.2f} ms CPU; the change adds {1000 * extra_s:.3f} ms CPU"
              f" ({args.extra_pct:g}%); load average"
              f" {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        for repeat in range(args.repeats):
            t, truth, cpu_ratio = trial_fit(args, common, args.work, size, extra_s)
            print(f"[{repeat}] trial inside one run: time ratio {t['time_ratio']:.4f} (95% CI"
                  f" {1 / t['speedup_high']:.4f}-{1 / t['speedup_low']:.4f}, {t['pairs']} pairs of {args.block});"
                  f" truth {truth:.4f} (CPU per iteration on/off {cpu_ratio:.4f})", flush=True)
            runs = []
            for extra in (False, True):
                m = loaded_model(args.work, size, extra_s)
                m.extra = extra
                cpu = cpu_per_arm()
                with tempfile.TemporaryDirectory() as root:
                    fit(root, [cpu, IterationTimer(warmup_steps=10)], model=m, **common)
                    runs.append((find_summary(root), cpu.mean(extra)))
            (off, cpu_off), (on, cpu_on) = runs
            head = headline(off, on)
            truth2 = 1 + extra_s / cpu_off
            low, high = head.get("ci95") or (None, None)
            ci = f"{1 / high:.4f}-{1 / low:.4f}" if low and high else "n/a"
            print(f"[{repeat}] two separate runs:      time ratio {1 / head['speedup']:.4f} (95% CI {ci}, within"
                  f" each run); truth {truth2:.4f} (CPU per iteration on/off {cpu_on / cpu_off:.4f})", flush=True)
            t, _, _ = trial_fit(args, common, args.work, size, extra_s, no_op=True)
            print(f"[{repeat}] no-op trial:            time ratio {t['time_ratio']:.4f} (95% CI"
                  f" {1 / t['speedup_high']:.4f}-{1 / t['speedup_low']:.4f}, {t['pairs']} pairs); verdict"
                  f" {t['verdict']}", flush=True)
        print(f"[end] load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        for p in spinners:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
