"""The ratio of a setup to a reference measured round by round: an exact randomization interval that uses the rounds as
blocks, so that the machine's speed in a round (shared by every setup run in it) drops out of the comparison.

Pure Python, like ``ratio_ci``: the matrix and ``race`` use it (:mod:`lightning_perf.bench.noise_floor`).
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple

from lightning_perf.measure.stats.ratio_ci import positive_logs

__all__ = ["aligned_rank_shift_ci", "round_drift_f"]


def _round_logs(values: Sequence[float], references: Sequence[Sequence[float]]) -> Optional[List[List[float]]]:
    """Per round ``[log value, log ref_1, ..., log ref_m]``, or None where the rounds do not line up (counts differ,
    a round has a different number of references) or a figure is not a finite positive number."""
    if len(values) != len(references) or not values:
        return None
    width = len(references[0])
    rounds = []
    for value, refs in zip(values, references):
        logs = positive_logs([value, *refs])
        if len(refs) != width or width == 0 or logs is None:
            return None
        rounds.append(logs)
    return rounds


def _ranks_doubled(values: List[float]) -> List[int]:
    """Twice each value's rank among ``values`` (ties share their average rank), as whole numbers."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = i + j + 2  # 2 * (average of ranks i+1 .. j+1)
        i = j + 1
    return out


def _aligned_rank_test(aligned: List[List[float]], shift: float) -> Tuple[float, float, float]:
    """At ``shift``: P(W >= observed), P(W <= observed) over the relabelings within rounds, and observed W minus its
    mean over them; W the sum of the setup's aligned ranks (slot 0 of each round)."""
    width = len(aligned[0])
    moved = [[row[0] - shift * (width - 1) / width] + [y + shift / width for y in row[1:]] for row in aligned]
    flat = _ranks_doubled([y for row in moved for y in row])
    ranks = [flat[i * width:(i + 1) * width] for i in range(len(moved))]
    observed = sum(row[0] for row in ranks)
    counts = {0: 1}
    for row in ranks:
        nxt: dict = {}
        for total, n in counts.items():
            for rank in row:
                nxt[total + rank] = nxt.get(total + rank, 0) + n
        counts = nxt
    everything = width ** len(ranks)
    upper = sum(n for total, n in counts.items() if total >= observed) / everything
    lower = sum(n for total, n in counts.items() if total <= observed) / everything
    return upper, lower, observed - sum(sum(row) / width for row in ranks)


def aligned_rank_shift_ci(values: Sequence[float], references: Sequence[Sequence[float]], confidence: float = 0.95
                          ) -> Optional[Tuple[float, Optional[float], Optional[float]]]:
    """The ratio of a setup's per-run figures to its reference runs', round by round: ``values[i]`` the setup's run
    in round ``i``, ``references[i]`` the ``m`` reference runs of that round (the baseline and its A/A copy: m = 2).

    Hodges and Lehmann's aligned ranks (1962): each round's logs less that round's mean (the machine's speed in the
    round drops out), all ranked together; the statistic W is the sum of the setup's ranks. Under "no difference" the
    ``1 + m`` runs of a round are exchangeable whatever the machine's speed in that round, so each of the
    ``(1 + m) ** rounds`` ways to pick which run of each round is the setup's is equally likely, and W's distribution
    over them is exact (counted round by round). A run the machine made slow moves one rank. The interval is every
    shift of the setup's logs that the test (both tails, ``(1 - confidence) / 2`` each) keeps; ranks change only
    where the setup's aligned log meets a reference's, so the test is evaluated once between each two of those
    shifts. The estimate: the shift where W crosses its mean. An A/A comparison's interval excludes 1 in at most
    ``1 - confidence`` of trials, whatever the drift between rounds and whatever the noise within them.

    Few rounds have no interval: with two reference runs a round, 3 rounds (27 relabelings) have none and 4 (81) do;
    with one, 5 rounds (32) have none and 6 (64) do.

    Returns:
        (ratio, low, high) as ratios of the figures (``low``/``high`` None where the rounds are too few), or None
        where the rounds do not line up or a figure is not a finite positive number.
    """
    rounds = _round_logs(values, references)
    if rounds is None:
        return None
    width = len(rounds[0])
    aligned = [[x - sum(row) / width for x in row] for row in rounds]
    cuts = sorted({row[0] - other[j] for row in aligned for other in aligned for j in range(1, width)})
    points = [cuts[0] - 1.0] + [(a + b) / 2.0 for a, b in zip(cuts, cuts[1:])] + [cuts[-1] + 1.0]
    edges = [(-math.inf, cuts[0])] + list(zip(cuts, cuts[1:])) + [(cuts[-1], math.inf)]
    tail = (1.0 - confidence) / 2.0
    kept, estimate = [], None
    for point, (left, right) in zip(points, edges):
        upper, lower, excess = _aligned_rank_test(aligned, point)
        if upper > tail + 1e-12 and lower > tail + 1e-12:
            kept.append((left, right))
        if estimate is None and excess <= 0:
            estimate = point if excess == 0 else left
    if estimate is None or not math.isfinite(estimate):
        estimate = cuts[-1] if estimate is None else cuts[0]
    if not kept or not math.isfinite(kept[0][0]) or not math.isfinite(kept[-1][1]):
        return math.exp(estimate), None, None
    return math.exp(estimate), math.exp(kept[0][0]), math.exp(kept[-1][1])


def round_drift_f(rows: Sequence[Sequence[float]]) -> Optional[float]:
    """How much the rounds differ: the two-way analysis of variance's F for rounds (rows: each round's figures of
    the setups, in one order), their logs' mean square between rounds over the residual mean square (setup and round
    taken out). About 1 where the machine kept its speed; None with fewer than 2 rounds or 2 setups, or a figure that
    is not a finite positive number; infinite where the runs fit rounds and setups exactly."""
    logs = _round_logs([row[0] for row in rows], [list(row[1:]) for row in rows]) if rows else None
    if logs is None or len(logs) < 2 or len(logs[0]) < 2:
        return None
    r, w = len(logs), len(logs[0])
    grand = sum(map(sum, logs)) / (r * w)
    round_means = [sum(row) / w for row in logs]
    setup_means = [sum(row[j] for row in logs) / r for j in range(w)]
    between = w * sum((x - grand) ** 2 for x in round_means) / (r - 1)
    residual = sum((logs[i][j] - round_means[i] - setup_means[j] + grand) ** 2
                   for i in range(r) for j in range(w)) / ((r - 1) * (w - 1))
    return between / residual if residual > 0 else math.inf
