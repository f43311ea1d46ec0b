"""An A/B trial inside one run against two separate runs, under the same load: a user change that adds ~5% to a step.

    PYTHONPATH=$PWD python benchmarks/trial_under_load.py [--busy 1] [--steps 330] [--repeats 1]

Starts ``--busy`` spin processes (``python -c "while True: pass"``) for the whole measurement and stops them at the
end, then, per repeat: one fit with ``ABTrial`` (the change switched in paired blocks), and two separate fits (the
change off, then on) timed by IterationTimer and compared as ``lightning-perf compare`` would (its within-run
interval). The truth is the step's own clock around the extra work. Prints the figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def spin(seconds: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass
    return time.perf_counter() - start


def spinning_model():
    """A step of 10 ms of busy host work; with ``extra`` on, 0.5 ms more, whose real length the model sums."""
    import torch
    from helpers import TinyModel
    from torch.utils.data import DataLoader, TensorDataset

    class Spinning(TinyModel):
        def __init__(self) -> None:
            super().__init__()
            self.extra, self.extra_spent, self.extra_steps = False, 0.0, 0

        def training_step(self, batch, batch_idx):
            spin(0.01)
            if self.extra:
                self.extra_spent += spin(0.0005)
                self.extra_steps += 1
            return super().training_step(batch, batch_idx)

        def train_dataloader(self):
            x = torch.randn(8192, 16, generator=torch.Generator().manual_seed(0))
            return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

    return Spinning()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=1, help="spin processes kept running (default 1)")
    parser.add_argument("--steps", type=int, default=330, help="iterations a fit (default 330)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    import torch
    from helpers import find_summary, fit
    from lightning_perf import ABTrial, IterationTimer
    from lightning_perf.summary.compare import headline

    torch.set_num_threads(1)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        time.sleep(0.5)
        for repeat in range(args.repeats):
            common = dict(max_steps=args.steps, limit_val_batches=0, num_sanity_val_steps=0, log_every_n_steps=50)
            model = spinning_model()
            trial = ABTrial("extra_spin", switch_on=lambda t, m: setattr(m, "extra", True),
                            switch_off=lambda t, m: setattr(m, "extra", False), warmup=10, block=5,
                            blocks=2 * ((args.steps - 10) // 10))
            with tempfile.TemporaryDirectory() as root:
                fit(root, [trial], model=model, **common)
                t = find_summary(root)["trial"]
            truth = 1 + 1000.0 * model.extra_spent / max(1, model.extra_steps) / t["arms"]["off"]["ms_per_iter"]
            print(f"[{repeat}] trial inside one run: time ratio {t['time_ratio']:.4f} (95% CI"
                  f" {1 / t['speedup_high']:.4f}-{1 / t['speedup_low']:.4f}, {t['pairs']} pairs);"
                  f" truth {truth:.4f}")
            runs = []
            for extra in (False, True):
                m = spinning_model()
                m.extra = extra
                with tempfile.TemporaryDirectory() as root:
                    fit(root, [IterationTimer(warmup_steps=10)], model=m, **common)
                    runs.append((find_summary(root), m))
            (off, _), (on, m_on) = runs
            head = headline(off, on)
            truth2 = 1 + 1000.0 * m_on.extra_spent / max(1, m_on.extra_steps) / off["iteration_timer"]["ms_per_iter"][
                "mean"]
            low, high = head.get("ci95") or (None, None)
            ci = f"{1 / high:.4f}-{1 / low:.4f}" if low and high else "n/a"
            print(f"[{repeat}] two separate runs:      time ratio {1 / head['speedup']:.4f} (95% CI {ci}, within"
                  f" each run); truth {truth2:.4f}")
    finally:
        for p in spinners:
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
