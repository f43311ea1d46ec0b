"""ABTrial's CUDA-only changes on a real GPU: cudnn.benchmark and TF32 switched per arm and put back after (their
speed-ups against the same step timed with CUDA events: test_gpu_since.py). Skipped without CUDA."""

import pytest
import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers import find_summary, fit
from lightning_perf import ABTrial

pytestmark = pytest.mark.gpu


class Matmuls(LightningModule):
    """float32 matmuls (TF32 speeds them up on Ampere and later) and a convolution (cudnn.benchmark's field); records
    the flags each step ran under."""

    def __init__(self, n=2048, reps=4):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n) / n**0.5)
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.n, self.reps, self.seen = n, reps, []

    def training_step(self, batch, batch_idx):
        (x,) = batch
        self.seen.append((torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32))
        h = x
        for _ in range(self.reps):
            h = h @ self.w
        img = self.conv(h[:, :512].reshape(-1, 8, 8, 8))
        return h.pow(2).mean() + img.pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(64 * 256, self.n)), batch_size=256)


@pytest.mark.parametrize("change, index", [("cudnn_benchmark", 0), ("tf32", 1)])
def test_cuda_flags_switch_per_arm_and_come_back(tmp_path, change, index):
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model = Matmuls()
    trial = ABTrial(change, warmup=4, block=6, blocks=8, quality_batches=0)
    fit(tmp_path, [trial], model=model, accelerator="gpu", max_steps=trial.schedule.total, limit_val_batches=0,
        num_sanity_val_steps=0)
    arms = [trial.schedule.arm(i) for i in range(trial.schedule.total)]
    assert [s[index] for s in model.seen] == [a == "on" for a in arms]
    assert torch.backends.cudnn.benchmark is False and torch.backends.cuda.matmul.allow_tf32 is False
    assert find_summary(tmp_path)["trial"]["status"] == "done"
