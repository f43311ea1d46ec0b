"""A batch's size: the leading dimension of its first tensor, found once and followed on the next batches."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch


def batch_size_path(batch: Any, depth: int = 3) -> Optional[tuple]:
    """The keys/indices that lead from ``batch`` to its first tensor with a batch dimension, or None."""
    if isinstance(batch, torch.Tensor):
        return () if batch.dim() > 0 else None
    if depth == 0:
        return None
    items = batch.items() if isinstance(batch, Mapping) else (
        enumerate(batch) if isinstance(batch, (list, tuple)) else ())
    for key, item in items:
        rest = batch_size_path(item, depth - 1)
        if rest is not None:
            return (key,) + rest
    return None


def follow(batch: Any, path: tuple) -> Optional[int]:
    """The batch size at ``path`` (found once on the first batch), or None where this batch is shaped otherwise."""
    try:
        for key in path:
            batch = batch[key]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(batch, torch.Tensor):
        return None
    shape = batch.shape
    return shape[0] if shape else None


def infer_batch_size(batch: Any) -> Optional[int]:
    """Leading dimension of the first tensor in ``batch`` (a tensor, or nested lists, tuples and dicts of them)."""
    path = batch_size_path(batch)
    return None if path is None else follow(batch, path)
