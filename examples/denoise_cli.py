"""The demo's denoiser as a LightningCLI script, for `lightning-perf matrix` (and for trying YAML configs).

    python examples/denoise_cli.py fit --config examples/denoise_matrix.yaml
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from lightning.pytorch.cli import LightningCLI  # noqa: E402

from denoise import DenoiseDataModule, DenoiseNet  # noqa: E402

if __name__ == "__main__":
    LightningCLI(DenoiseNet, DenoiseDataModule, save_config_kwargs={"overwrite": True})
