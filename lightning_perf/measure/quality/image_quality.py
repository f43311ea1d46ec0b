"""Image-quality metrics accumulated over an evaluation: PSNR, SSIM, L1 (torchmetrics) and LPIPS (the lpips package).

Class state lives in torchmetrics ``Metric`` objects, so DDP reduces them the same way on every rank.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from torchmetrics import MeanAbsoluteError, Metric
from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure

IMAGE_METRICS = ("psnr", "ssim", "l1", "lpips")
LPIPS_NETS = ("alex", "vgg", "squeeze")


class LpipsUnavailable(RuntimeError):
    """LPIPS cannot be computed here; the message is the reason recorded in the summary. ``again`` is True when the
    load was not tried: it failed earlier in this process."""

    def __init__(self, reason: str, again: bool = False) -> None:
        super().__init__(reason)
        self.again = again


#: (net, pretrained backbone, weights folder) -> why its load failed: tried once per process. Offline, each try
#: waits on the network and fails the same way; a new run in the same process (a notebook, a sweep) says so again
#: without the wait. A load that succeeded is not kept: its model lives on the device of the run that loaded it.
_LPIPS_FAILURES: Dict[Tuple[str, bool, Optional[str]], str] = {}


@contextlib.contextmanager
def _hub_dir(path: Optional[str]) -> Iterator[None]:
    if path is None:
        yield
        return
    previous = torch.hub.get_dir()
    torch.hub.set_dir(path)
    try:
        yield
    finally:
        torch.hub.set_dir(previous)


def load_lpips(net: str = "alex", pretrained_backbone: bool = True, weights_dir: Optional[str] = None) -> Any:
    """An ``lpips.LPIPS`` model, loaded the normal way (torchvision fetches the backbone into torch's hub cache).

    Args:
        net: alex, vgg or squeeze.
        pretrained_backbone: False gives a random backbone (``pnet_rand=True``): plumbing tests only, the numbers
            are not LPIPS.
        weights_dir: a torch hub folder holding ``checkpoints/<torchvision weights file>``, for machines offline.

    Raises:
        LpipsUnavailable: when the package or the backbone weights cannot be loaded: tried once per process, a later
            call with the same arguments raises the first reason at once (``again=True``).
    """
    key = (net, bool(pretrained_backbone), weights_dir)
    if key in _LPIPS_FAILURES:
        raise LpipsUnavailable(f"{_LPIPS_FAILURES[key]} (not tried again: it failed earlier in this process)",
                               again=True)
    try:
        model = _load_lpips(net, pretrained_backbone, weights_dir)
    except LpipsUnavailable as err:
        _LPIPS_FAILURES[key] = str(err)
        raise
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _load_lpips(net: str, pretrained_backbone: bool, weights_dir: Optional[str]) -> Any:
    try:
        import lpips
    except ImportError as err:
        raise LpipsUnavailable(f"the lpips package is not installed (pip install lpips): {err}") from None
    try:
        with _hub_dir(weights_dir):
            return lpips.LPIPS(net=net, pnet_rand=not pretrained_backbone, verbose=False)
    except Exception as err:  # noqa: BLE001 - URLError offline, FileNotFoundError, hash mismatch...
        where = f" from {weights_dir}" if weights_dir else ""
        raise LpipsUnavailable(
            f"the pretrained {net} backbone for LPIPS could not be loaded{where} ({type(err).__name__}: {err})."
            " Offline? Put torchvision's weights file under <dir>/checkpoints/ and pass"
            " `lpips_weights_dir=<dir>`, or set TORCH_HOME to a cache that has it."
        ) from None


class LPIPSMetric(Metric):
    """Mean LPIPS over all images seen; inputs in [0, data_range] are mapped to [-1, 1] as LPIPS expects."""

    higher_is_better = False
    full_state_update = False

    def __init__(self, model: Any, data_range: float = 1.0) -> None:
        super().__init__()
        self.model = model
        self.data_range = data_range
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        scale = 2.0 / self.data_range
        values = self.model(preds.float() * scale - 1.0, target.float() * scale - 1.0)
        self.total += values.sum().double()
        self.count += values.numel()

    def compute(self) -> torch.Tensor:
        return self.total / self.count


def build_image_metrics(names: Any, data_range: float, lpips_model: Any = None) -> Dict[str, Metric]:
    """The torchmetrics objects for ``names``: PSNR and SSIM averaged per image, L1 over all pixels."""
    makers = {
        "psnr": lambda: PeakSignalNoiseRatio(data_range=data_range, dim=(1, 2, 3), reduction="elementwise_mean"),
        "ssim": lambda: StructuralSimilarityIndexMeasure(data_range=data_range),
        "l1": lambda: MeanAbsoluteError(),
        "lpips": lambda: LPIPSMetric(lpips_model, data_range),
    }
    return {name: makers[name]() for name in names if name != "lpips" or lpips_model is not None}
