"""Factories for `lightning-perf bench` tests (imported by the CLI from this folder)."""

import torch
from torch import nn


def small_conv():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 3, 3, padding=1))


class _FailsAbove(nn.Module):
    def __init__(self, error):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.error = error

    def forward(self, x):
        if x.shape[-1] > 32:
            raise self.error
        return self.conv(x)


def oom_above_32():
    """Runs out of memory (the real error type) for inputs above 32 pixels, as a GPU would."""
    return _FailsAbove(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"))


def broken_above_32():
    return _FailsAbove(ValueError("shape mismatch in block 3"))


def not_a_module():
    return "a string"
