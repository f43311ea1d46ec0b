"""An A/B trial inside one run: which arm each iteration runs, and the paired statistics over blocks of iterations.

Pure Python, no Lightning: the callback (``callbacks/ab_trial/callback.py``) asks :class:`BlockSchedule` where an
iteration falls and feeds each counted iteration's time to :class:`TrialBlocks`; :func:`paired_ratio` gives the result.

The rules (docs/trials.md): ``warmup`` iterations first, uncounted, half with the change off and half with it on (so
each arm's first-time costs, an autotuner, a cache, a layout conversion, are paid before counting); then ``blocks``
blocks of ``block`` iterations, in pairs: one block of each arm per pair, the order of each pair ``"abba"`` (AB, BA,
AB, ...) or ``"random"`` (a seeded coin per pair). The first ``settle`` iterations of each block (the iteration
right after a switch) are counted in neither arm; the switch itself runs between two iterations and is timed apart.
Drift hits both blocks of a pair alike; periodic work (logging, checkpoints every N steps) lands on either arm.
"""

from __future__ import annotations

import math
import random
from typing import Dict, List, Optional, Sequence, Tuple

from lightning_perf.measure.stats.ratio_ci import t_quantile_at_least

__all__ = ["BlockSchedule", "TrialBlocks", "paired_ratio", "BUILT_IN_CHANGES", "ORDERS", "OFF", "ON"]

OFF, ON = "off", "on"
ORDERS = ("random", "abba")
#: The changes ABTrial can toggle by name (``measure/trials/changes.py``), here so the CLI names them without torch.
BUILT_IN_CHANGES = ("cudnn_benchmark", "tf32", "matmul_precision", "channels_last", "autocast_bf16", "autocast_fp16")


class BlockSchedule:
    """Where each 0-based iteration of a trial falls.

    Args:
        warmup: iterations before the first block, uncounted: the first half with the change off, the rest on.
        block: iterations a block.
        blocks: blocks in all, an even number (pairs of one block an arm).
        order: ``"random"`` (a seeded coin decides each pair's order) or ``"abba"``.
        settle: iterations at the start of each block counted in neither arm.
        seed: the coin's seed, for ``order="random"``.
    """

    def __init__(self, warmup: int = 20, block: int = 10, blocks: int = 24, order: str = "random", settle: int = 1,
                 seed: int = 0) -> None:
        if order not in ORDERS:
            raise ValueError(f"order={order!r}: expected one of {ORDERS}")
        if blocks < 4 or blocks % 2:
            raise ValueError(f"blocks={blocks!r}: expected an even number >= 4 (pairs of blocks, at least 2 pairs)")
        if not 0 <= settle < block:
            raise ValueError(f"settle={settle!r}: expected 0 <= settle < block ({block})")
        if warmup < 0:
            raise ValueError(f"warmup={warmup!r}: expected >= 0")
        self.warmup, self.block, self.blocks, self.order, self.settle, self.seed = (warmup, block, blocks, order,
                                                                                    settle, seed)
        coin = random.Random(seed)
        # The arm of each pair's first block: ABBA alternates; random tosses a coin a pair.
        self._first = [OFF if (k % 2 == 0 if order == "abba" else coin.random() < 0.5) else ON
                       for k in range(blocks // 2)]

    @property
    def total(self) -> int:
        """Iterations the trial takes, warm-up included."""
        return self.warmup + self.block * self.blocks

    def arm_of_block(self, index: int) -> str:
        first = self._first[index // 2]
        return first if index % 2 == 0 else (ON if first == OFF else OFF)

    def arm(self, iteration: int) -> Optional[str]:
        """The arm 0-based ``iteration`` runs under: None once the trial is over (the change stays off)."""
        if iteration < self.warmup:
            return OFF if iteration < self.warmup // 2 else ON
        index = (iteration - self.warmup) // self.block
        return self.arm_of_block(index) if index < self.blocks else None

    def where(self, iteration: int) -> Tuple[Optional[int], bool]:
        """(block index, counted) of 0-based ``iteration``: block None in the warm-up and after the trial."""
        if iteration < self.warmup:
            return None, False
        index, offset = divmod(iteration - self.warmup, self.block)
        if index >= self.blocks:
            return None, False
        return index, offset >= self.settle


class TrialBlocks:
    """Per block: the sum and count of its counted iterations' seconds and samples; O(blocks) memory."""

    def __init__(self, schedule: BlockSchedule) -> None:
        self.schedule = schedule
        n = schedule.blocks
        self.seconds = [0.0] * n
        self.iterations = [0] * n
        self.samples: List[Optional[int]] = [0] * n

    def add(self, block: int, seconds: float, samples: Optional[int] = None) -> None:
        self.seconds[block] += seconds
        self.iterations[block] += 1
        count = self.samples[block]
        self.samples[block] = None if samples is None or count is None else count + samples

    def arm_totals(self) -> Dict[str, Dict[str, Optional[float]]]:
        """Per arm: iterations, seconds, samples (None where a block's batch size was unknown)."""
        out: Dict[str, Dict[str, Optional[float]]] = {}
        for arm in (OFF, ON):
            idx = [i for i in range(self.schedule.blocks) if self.schedule.arm_of_block(i) == arm and self.iterations[i]]
            samples = [self.samples[i] for i in idx]
            out[arm] = {"iterations": sum(self.iterations[i] for i in idx),
                        "seconds": sum(self.seconds[i] for i in idx),
                        "samples": None if not idx or any(s is None for s in samples) else sum(samples)}
        return out

    def pair_means(self) -> List[Tuple[float, float]]:
        """(mean s/iter off, mean s/iter on) of every pair whose two blocks both counted iterations."""
        pairs = []
        for k in range(self.schedule.blocks // 2):
            means = {}
            for i in (2 * k, 2 * k + 1):
                if self.iterations[i]:
                    means[self.schedule.arm_of_block(i)] = self.seconds[i] / self.iterations[i]
            if len(means) == 2 and means[OFF] > 0 and means[ON] > 0:
                pairs.append((means[OFF], means[ON]))
        return pairs


def paired_ratio(pairs: Sequence[Tuple[float, float]], confidence: float = 0.95
                 ) -> Optional[Tuple[float, float, float]]:
    """The ratio of the arms' mean times, on/off (below 1: the change is faster), and its paired interval.

    The ratio of means over the pairs (each pair: the two blocks' mean seconds an iteration) keeps work that costs
    the same under both arms (a checkpoint every N steps) at its share of the loop, as a wall clock would. Its
    interval is the ratio estimator's (delta method on the pairs' residuals ``on - ratio * off``), on the log scale
    with Student's t at n - 1 degrees of freedom: pairing removes what both blocks of a pair share (drift, another
    process's load); what is left is each pair's own noise.

    Returns:
        (ratio, low, high), or None with fewer than 2 pairs.
    """
    n = len(pairs)
    if n < 2:
        return None
    mean_off = sum(off for off, _ in pairs) / n
    mean_on = sum(on for _, on in pairs) / n
    ratio = mean_on / mean_off
    residuals = [on - ratio * off for off, on in pairs]
    se_log = math.sqrt(sum(r * r for r in residuals) / (n - 1) / n) / mean_on
    half = t_quantile_at_least(1.0 - (1.0 - confidence) / 2.0, n - 1) * se_log
    return ratio, ratio * math.exp(-half), ratio * math.exp(half)
