"""A small real image-denoising task on the photographs scikit-image ships: model and data module.

Used by the demo and by the tests; nothing is downloaded at run time.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from lightning.pytorch import LightningDataModule, LightningModule
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_perf import profile_section

TRAIN_IMAGES = ("astronaut", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field")
VAL_IMAGES = ("chelsea",)


def load_photos(names: Tuple[str, ...]) -> List[torch.Tensor]:
    """Photographs from ``skimage.data`` as float CHW tensors in [0, 1]."""
    from skimage import data

    photos = []
    for name in names:
        img = np.asarray(getattr(data, name)(), dtype=np.float32) / 255.0
        photos.append(torch.from_numpy(img).permute(2, 0, 1).contiguous())
    return photos


class NoisyPatches(Dataset):
    """Crops of the photos with Gaussian noise: (noisy, clean). Random crops for training, a fixed grid else."""

    def __init__(self, photos: List[torch.Tensor], patch: int, sigma: float, length: int, train: bool,
                 seed: int = 0) -> None:
        self.photos, self.patch, self.sigma, self.train, self.seed = photos, patch, sigma, train, seed
        self.grid = [] if train else [
            (i, y, x)
            for i, p in enumerate(photos)
            for y in range(0, p.shape[1] - patch + 1, patch)
            for x in range(0, p.shape[2] - patch + 1, patch)
        ]
        self.length = length if train else min(length, len(self.grid))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        if self.train:
            i = int(torch.randint(len(self.photos), (1,), generator=g))
            photo = self.photos[i]
            y = int(torch.randint(photo.shape[1] - self.patch + 1, (1,), generator=g))
            x = int(torch.randint(photo.shape[2] - self.patch + 1, (1,), generator=g))
        else:
            i, y, x = self.grid[index]
            photo = self.photos[i]
        clean = photo[:, y : y + self.patch, x : x + self.patch]
        noisy = (clean + self.sigma * torch.randn(clean.shape, generator=g)).clamp(0.0, 1.0)
        return noisy, clean


class DenoiseDataModule(LightningDataModule):
    """Training crops from five photographs, validation crops from a held-out one."""

    def __init__(self, batch_size: int = 8, patch_size: int = 48, noise_sigma: float = 0.1,
                 train_samples: int = 2048, val_samples: int = 32, num_workers: int = 0,
                 persistent_workers: bool = False, pin_memory: bool = False,
                 prefetch_factor: Optional[int] = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self._train: Optional[NoisyPatches] = None
        self._val: Optional[NoisyPatches] = None

    def setup(self, stage: str) -> None:
        h = self.hparams
        if self._train is None:
            self._train = NoisyPatches(load_photos(TRAIN_IMAGES), h.patch_size, h.noise_sigma, h.train_samples, True)
            self._val = NoisyPatches(load_photos(VAL_IMAGES), h.patch_size, h.noise_sigma, h.val_samples, False,
                                     seed=1)

    def _loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        h = self.hparams
        return DataLoader(dataset, batch_size=h.batch_size, shuffle=shuffle, num_workers=h.num_workers,
                          persistent_workers=h.persistent_workers and h.num_workers > 0, pin_memory=h.pin_memory,
                          prefetch_factor=h.prefetch_factor if h.num_workers > 0 else None)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self._train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self._val, shuffle=False)


class DenoiseNet(LightningModule):
    """A small residual CNN (DnCNN-style): predicts the noise and subtracts it."""

    def __init__(self, channels: int = 32, depth: int = 4, lr: float = 2e-3, channels_last: bool = False,
                 compile: bool = False, extra_step_ms: float = 0.0) -> None:
        """``extra_step_ms``: a known cost added to every training step (a sleep), to check that a matrix finds a
        change of a known size (docs/bench.md)."""
        super().__init__()
        self.save_hyperparameters()
        layers: List[nn.Module] = [nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(inplace=True)]
        for _ in range(depth - 2):
            layers += [nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU(inplace=True)]
        layers.append(nn.Conv2d(channels, 3, 3, padding=1))
        self.body = nn.Sequential(*layers)
        if channels_last:
            self.body = self.body.to(memory_format=torch.channels_last)

    def configure_model(self) -> None:
        if self.hparams.compile and not isinstance(self.body, torch._dynamo.eval_frame.OptimizedModule):
            self.body = torch.compile(self.body)

    def forward(self, noisy: torch.Tensor) -> torch.Tensor:
        if self.hparams.channels_last:
            noisy = noisy.contiguous(memory_format=torch.channels_last)
        return (noisy - self.body(noisy)).clamp(0.0, 1.0)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        noisy, clean = batch
        if self.hparams.extra_step_ms > 0:
            time.sleep(self.hparams.extra_step_ms / 1000.0)
        with profile_section("denoise_forward"):  # a user-named section, shown by SectionProfiler
            restored = self(noisy)
        loss = nn.functional.mse_loss(restored, clean)
        self.log("train_loss", loss, prog_bar=True)
        # a train-set metric, as seed 001 wrote "Train PSNR" down: `lightning-perf report --column train_psnr`
        self.log("train_psnr", -10.0 * torch.log10(loss.detach().clamp_min(1e-10)))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> Dict[str, torch.Tensor]:
        noisy, clean = batch
        preds = self(noisy)
        self.log("val_loss", nn.functional.mse_loss(preds, clean))
        return {"preds": preds, "target": clean}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def make_net() -> DenoiseNet:
    """Factory for `lightning-perf bench --model denoise:make_net` (run from examples/)."""
    return DenoiseNet()
