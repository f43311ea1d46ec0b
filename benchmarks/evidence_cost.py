"""What StepTrace costs: per step when no capture is due (its step hook, called as Lightning calls it), and
while it captures (a CPU-bound step of about 1 ms, captured steps against the others of the same run).

    python benchmarks/evidence_cost.py

MemorySnapshot's recording cost is a CUDA figure: tests/gpu/test_gpu_evidence.py records it (an allocate-and-free
pair with the history on and off) in the GPU table.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from lightning_perf import StepTrace  # noqa: E402

STEPS = 200_000


def hooks_us(trace: StepTrace) -> float:
    """µs per step of its step hook (a batch end), less an empty loop's, global_step advancing as in training."""
    trainer = SimpleNamespace(global_step=0, is_global_zero=True)
    trace._dir = tempfile.mkdtemp()  # set at set-up in a fit
    end = trace.on_train_batch_end

    def loop(with_hooks: bool) -> float:
        began = time.thread_time()
        for i in range(STEPS):
            trainer.global_step += 1
            if with_hooks:
                end(trainer, None, None, None, i)
        return time.thread_time() - began

    bare = min(loop(False) for _ in range(3))
    hooked = min(loop(True) for _ in range(3))
    return (hooked - bare) / STEPS * 1e6


class Step1ms(LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        y = x
        for _ in range(20):
            y = torch.tanh(y @ self.net[0].weight)
        return self.net(y).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(64 * 200, 256)), batch_size=64)


class StepClock(Callback):
    def __init__(self):
        self.times, self._start = {}, 0.0

    def on_train_batch_start(self, trainer, *args):
        self._start = time.thread_time()

    def on_train_batch_end(self, trainer, *args):
        self.times[trainer.global_step] = time.thread_time() - self._start


def capture_cost() -> None:
    torch.set_num_threads(1)
    captured = list(range(50, 60)) + list(range(120, 130))
    clock = StepClock()
    with tempfile.TemporaryDirectory() as root:
        trace = StepTrace(steps=captured)
        Trainer(default_root_dir=root, max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False, callbacks=[clock, trace]).fit(Step1ms())
        inside = [clock.times[s] for s in captured if s in clock.times]
        outside = [t for s, t in clock.times.items() if s > 20 and s not in captured and s - 1 not in captured]
        med_in, med_out = statistics.median(inside), statistics.median(outside)
        print(f"capture: a captured step {1000 * med_in:.3f} ms against {1000 * med_out:.3f} ms uncaptured"
              f" (x{med_in / med_out:.2f}, median CPU time of the training thread)")
        for c in trace.captures:
            print(f"capture of steps {c['first_step']}-{c['last_step']}: profiler start {c['start_ms']:.1f} ms,"
                  f" stop and write {c['write_ms']:.1f} ms, trace {os.path.getsize(c['path']) / 1024:.0f} kB")


def main() -> None:
    print(f"torch {torch.__version__}, {STEPS} steps per loop, thread CPU time")
    print(f"no StepTrace work due (steps far ahead): {hooks_us(StepTrace(steps=[10**9])):.2f} us/step")
    # a factor no loop iteration reaches: the cost of watching, without a capture
    print(f"watching for a slow step: {hooks_us(StepTrace(slow_factor=1e12)):.2f} us/step")
    print(f"captures used up (max_captures=0): {hooks_us(StepTrace(slow_factor=3.0, max_captures=0)):.2f} us/step")
    capture_cost()


if __name__ == "__main__":
    main()
