"""Tiny models, data and readers shared by the tests."""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any, Dict, List

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class ClockedItems(Dataset):
    """64 items of 16 features, each fetch advancing a test's virtual clock by ``fetch_s`` (the data loading a
    SectionProfiler test expects to see)."""

    def __init__(self, clock: Any, fetch_s: float) -> None:
        self.clock, self.fetch_s = clock, fetch_s

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        self.clock.advance(self.fetch_s)
        x = torch.full((16,), float(i) / 64)
        return x, x.sum(dim=0, keepdim=True)


def make_loader(n: int = 64, batch_size: int = 8, features: int = 16, **kwargs: Any) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    y = x.sum(dim=1, keepdim=True)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, **kwargs)


class TinyModel(LightningModule):
    """A linear regressor with train and validation loops; small enough for many fits on 2 cores."""

    def __init__(self, features: int = 16, lr: float = 0.01) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self(x), y)
        self.log("val_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> DataLoader:
        return make_loader()

    def val_dataloader(self) -> DataLoader:
        return make_loader(n=32)


def trainer_kwargs(tmp_path: Any, **overrides: Any) -> Dict[str, Any]:
    kwargs: Dict[str, Any] = dict(
        default_root_dir=str(tmp_path),
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=2,
        num_sanity_val_steps=1,
    )
    kwargs.update(overrides)
    return kwargs


def fit(tmp_path: Any, callbacks: List[Any], model: LightningModule = None, **overrides: Any) -> Trainer:
    trainer = Trainer(callbacks=callbacks, **trainer_kwargs(tmp_path, **overrides))
    trainer.fit(model or TinyModel())
    return trainer


def find_summary(root: Any) -> Dict[str, Any]:
    paths = glob.glob(os.path.join(str(root), "**", "perf_summary.json"), recursive=True)
    assert len(paths) == 1, f"expected one summary under {root}, found {paths}"
    with open(paths[0]) as fh:
        return json.load(fh)


def read_scalars(root: Any) -> Dict[str, List[tuple]]:
    """Every scalar in the TensorBoard event files under ``root``: tag -> [(step, value), ...]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: Dict[str, List[tuple]] = {}
    for path in glob.glob(os.path.join(str(root), "**", "events.out.tfevents.*"), recursive=True):
        acc = EventAccumulator(path, size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


class ImageModel(LightningModule):
    """Validation returns fixed (preds, target) image pairs that do not depend on training: known metric values."""

    def __init__(self, n_val: int = 16, noise: float = 0.05, size: int = 32) -> None:
        super().__init__()
        self.net = nn.Conv2d(3, 3, 3, padding=1)
        self.n_val, self.noise, self.size = n_val, noise, size

    def val_pairs(self) -> tuple:
        g = torch.Generator().manual_seed(123)
        target = torch.rand(self.n_val, 3, self.size, self.size, generator=g)
        preds = (target + self.noise * torch.randn(target.shape, generator=g)).clamp(0, 1)
        return preds, target

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return nn.functional.mse_loss(self.net(x), x)

    def validation_step(self, batch: Any, batch_idx: int) -> Dict[str, torch.Tensor]:
        preds, target = batch
        self.log("val_l1", (preds - target).abs().mean())
        return {"preds": preds, "target": target}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.rand(16, 3, self.size, self.size)), batch_size=4)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(*self.val_pairs()), batch_size=4)


class ManualModel(TinyModel):
    """Manual optimization: an optimizer step every ``step_every`` batches."""

    def __init__(self, step_every: int = 1) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.step_every = step_every

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        loss = super().training_step(batch, batch_idx)
        opt.zero_grad()
        self.manual_backward(loss)
        if (batch_idx + 1) % self.step_every == 0:
            opt.step()
        return loss


class VirtualClock:
    """A stand-in for ``lightning_perf.measure.timing.clock.now`` that moves only when a test advances it.

    Tests that compare the timings of two real fits use it: on a shared machine, two runs of one setup differ by
    more than any tolerance a test could keep (with one core busy, a 7 ms sleep took 40 ms at the median). Timed on
    this clock, a real ``Trainer.fit`` records exactly the cost the model injects (``advance``), so a test proves
    what the suite computes from what it measured; the suite's other tests keep real clocks for what they measure.
    """

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class TickingClock(VirtualClock):
    """A :class:`VirtualClock` that also moves ``tick`` seconds at every read: code that times a call by a read
    before and a read after it sees exactly ``tick`` a call, plus what the test advances in between. For a figure
    relative to a typical call (a median) that must not be zero; nothing else moves it."""

    def __init__(self, tick: float) -> None:
        super().__init__()
        self.tick = tick

    def __call__(self) -> float:
        t = self.t
        self.t += self.tick
        return t


def use_virtual_clock(monkeypatch: Any) -> VirtualClock:
    """Puts a :class:`VirtualClock` in place of ``now`` in every lightning_perf module that reads it."""
    import importlib
    import sys

    from lightning_perf.measure.timing import clock as clock_module

    for name in ("lightning_perf.callbacks.iteration_timer.callback",
                 "lightning_perf.callbacks.section_profiler.callback",
                 "lightning_perf.callbacks.section_profiler.timed_checkpoint_io",
                 "lightning_perf.measure.sections.user_sections"):
        importlib.import_module(name)
    clock = VirtualClock()
    real = clock_module.now
    for name, module in list(sys.modules.items()):
        if name.startswith("lightning_perf") and getattr(module, "now", None) is real:
            monkeypatch.setattr(module, "now", clock)
    return clock


class HostEvent:
    """A CUDA event stand-in on the CPU: records the suite's host clock (a test's virtual clock too), always
    complete, so device time = host time. Only the hardware is simulated. benchmarks/overhead.py's simulated device
    is this class too."""

    __slots__ = ("t",)

    def record(self, *args: Any) -> None:
        from lightning_perf.measure.timing import clock as clock_module

        self.t = clock_module.now()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other: "HostEvent") -> float:
        return 1000.0 * (other.t - self.t)


class SimulatedDevice(Callback):
    """Gives a callback listed before it (SectionProfiler, IterationTimer) a device clock made of ``event``
    (HostEvent) objects at train start: its device times must then equal its host times."""

    event = HostEvent

    def __init__(self, target: Any) -> None:
        self.target = target

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        from lightning_perf.measure.timing.clock import DeviceIntervalClock

        clock = DeviceIntervalClock(event_factory=self.event)
        if hasattr(self.target, "_use_clock"):  # SectionProfiler: as its on_train_start decides with a device clock
            self.target._use_clock(clock)
        else:
            self.target._clock = clock


def hold_until_sampled(trainer: Any, timeout_s: float = 10.0) -> bool:
    """Returns once the background memory sampler of ``trainer``'s VRAMMonitor (its PeakSampler thread) has taken a
    reading that started after this call: what the caller holds now is in it. In place of a fixed sleep "long
    enough for the sampler", which a sampler thread starved on a busy machine could sleep through. False after
    ``timeout_s`` without one (a sampler that stopped, or none): callers assert the result."""
    import time

    from lightning_perf import VRAMMonitor

    sampler = next((cb._sampler for cb in trainer.callbacks if isinstance(cb, VRAMMonitor)), None)
    if sampler is None:
        return False
    # the reading under way at this call may have started before it; the one after that one did not
    wanted = sampler.samples + 2
    deadline = time.monotonic() + timeout_s
    while sampler.samples < wanted:
        if time.monotonic() > deadline or not sampler.alive:
            return False
        time.sleep(0.001)
    return True


#: The toy LightningCLI script of :func:`write_toy_cli`: a linear model on random rows of 4 features, batches of 4.
TOY_CLI = '''import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset


class Net(LightningModule):
    def __init__(self, lr: float = {lr!r}):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
        self.lr = lr

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn({samples}, 4)), batch_size=4)
{cli_class}

if __name__ == "__main__":
    {cli}(Net, save_config_callback=None)
'''

#: The CLI of a toy script that prints, after its fit, every lightning_perf callback its Trainer ran (suites opened).
TOY_CLI_PRINTS_CALLBACKS = '''

class CLI(LightningCLI):
    def after_fit(self):
        from lightning_perf import PerfSuite
        from lightning_perf.callbacks.core.base import PerfCallback

        ran = []
        for cb in self.trainer.callbacks:
            ran += [type(c).__name__ for c in (cb.callbacks if isinstance(cb, PerfSuite) else [cb])
                    if isinstance(c, PerfCallback)]
        print("RAN:", ",".join(sorted(ran)), flush=True)
'''


def write_toy_cli(path: Any, lr: float, samples: int, print_callbacks: bool = False) -> Any:
    """Writes a LightningCLI script to ``path`` (its folders made) and returns ``path``: ``Net``, a linear model
    trained by SGD at ``lr`` (the default of ``--model.lr``) on ``samples`` random rows in batches of 4, so an epoch
    is ``samples / 4`` steps (what the callers' step counts rest on). With ``print_callbacks`` it runs a ``CLI``
    that prints ``RAN: A,B,...`` after the fit: every lightning_perf callback the Trainer ran, suites opened."""
    text = TOY_CLI.format(lr=lr, samples=samples, cli="CLI" if print_callbacks else "LightningCLI",
                          cli_class=TOY_CLI_PRINTS_CALLBACKS if print_callbacks else "")
    os.makedirs(os.path.dirname(os.path.abspath(str(path))), exist_ok=True)
    with open(str(path), "w") as fh:
        fh.write(text)
    return path


class PacedModel(TinyModel):
    """Each training step costs ``step_s`` on the test's virtual clock (:func:`use_virtual_clock`): the speed ratio
    of two runs, and what their files say, are known exactly, whatever else runs on the machine."""

    def __init__(self, clock: VirtualClock, step_s: float) -> None:
        super().__init__()
        self.clock, self.step_s = clock, step_s

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.clock.advance(self.step_s)
        return super().training_step(batch, batch_idx)


#: A user's script with no lightning_perf import: ARGS are the steps and the seconds each step sleeps.
SLEEPY_SCRIPT = '''
import sys
import time

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset


class Net(LightningModule):
    def __init__(self, pause):
        super().__init__()
        self.net, self.pause = torch.nn.Linear(4, 1), pause

    def training_step(self, batch, batch_idx):
        time.sleep(self.pause)
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    steps, pause = int(sys.argv[1]), float(sys.argv[2])
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    trainer = Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, accelerator="cpu", devices=1)
    trainer.fit(Net(pause), DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=4))
'''


#: Words that claim a difference between runs; a line holding one must say it is within noise or not decided (the
#: A/A property tests of every comparing command: tests/test_one_voice_*.py). Grow the list.
CLAIM_WORDS = ("faster", "slower", "saved", "lost", "pays back", "break-even after", "rose", "fell", "leak",
               "improved", "regressed", "increase", "decrease", "less memory", "more memory", "speedup:", "slowdown:",
               "longer", "shorter", "ahead for", "significant", "moved most: ", "failed", "least memory",
               "more efficient", "benefit", "mib more", "mib less", "decided against")
#: Patterns that claim a change: a signed figure alone in a table cell.
CLAIM_PATTERNS = (r"\| [+-]\d",)
#: What marks a line as making no claim.
CLAIM_MARKS = ("within noise", "not decided", "no verdict", "not significant", "within the noise floor",
               "within the memory noise floor", "not checked", " tie", "n/a", "never pays back", "noise floor (a/a",
               "a/a noise floor", "no leak")
#: What holds a claim word without claiming a change between the runs: a run's own diagnosis (what a faster step
#: would give), a hint naming an option.
NOT_CLAIMS = (r"if the [^;]*? ran [\d.]+x faster", r"at most [\d.]+x faster", r"--fail-if-slower",
              r"moved most: no section past its noise", r"least memory first")


def unwrapped(text: str) -> list:
    """The lines of ``text`` with compare's wrapped sentences joined again (textwrap's continuation: four spaces and a
    word that goes on the sentence, under a long line), so a claim and its hedge are read as the one line they are."""
    out: list = []
    for line in text.splitlines():
        rest = line[4:]
        if (out and len(out[-1]) >= 60 and line.startswith("    ") and rest[:1] and not rest[:1].isspace()
                and (rest[0].islower() or rest[0].isdigit() or rest[0] in "(+-±")):
            out[-1] += " " + rest
        else:
            out.append(line)
    return out


def claims(lines) -> list:
    """The lines (a list, or a text) that claim a difference without saying it is within noise or not decided."""
    import re

    found = []
    for line in (unwrapped(lines) if isinstance(lines, str) else lines):
        low = line.lower()
        for pattern in NOT_CLAIMS:
            low = re.sub(pattern, "", low)
        claimed = any(word in low for word in CLAIM_WORDS) or any(re.search(p, low) for p in CLAIM_PATTERNS)
        if claimed and not any(mark in low for mark in CLAIM_MARKS):
            found.append(line)
    return found


def alive(pid):
    """The process runs (a zombie waiting for its parent to read it has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def gone_within(pid, seconds=10.0):
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
