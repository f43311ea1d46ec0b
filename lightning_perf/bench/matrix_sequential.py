"""``matrix --repeats auto``: each variant's verdict from the always-valid interval on its per-round log-ratios
(:mod:`lightning_perf.bench.sequential`) in place of the fixed design's rank verdict, and whether every variant is
decided (the rounds' stopping rule)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from lightning_perf.bench.matrix_verdicts import BASES, _in_rounds, _rates_key
from lightning_perf.bench.noise_floor import FASTER, NO_VERDICT, SLOWER, WITHIN_NOISE
from lightning_perf.bench.sequential import DEFAULT_EQUIVALENCE_PCT
from lightning_perf.bench.sequential import FASTER as SEQ_FASTER
from lightning_perf.bench.sequential import NO_VERDICT as SEQ_NO_VERDICT
from lightning_perf.bench.sequential import SAME as SEQ_SAME
from lightning_perf.bench.sequential import SLOWER as SEQ_SLOWER
from lightning_perf.bench.sequential import UNDECIDED, decide_rounds, round_log_ratios

#: How the always-valid interval is named where one is printed.
SEQUENTIAL_INTERVAL = "always valid, paired by round"


def add_sequential_verdicts(rows: List[Dict[str, Any]], noise_floor_name: Optional[str], min_effect_pct: float,
                            same_within_pct: float = DEFAULT_EQUIVALENCE_PCT) -> None:
    """Where the rows' rounds ran until decided (``rule`` ``sequential``), on each basis: ``_{basis}_sequential`` (as
    :func:`lightning_perf.bench.sequential.decide_rounds` returns it), and ``{basis}_verdict``/``_why`` and
    ``_{basis}_cmp`` said from it (``the same within +/-5%`` a verdict of its own; undecided is ``within noise``
    with what would decide, ``no verdict`` while the interval is infinite)."""
    rounds = next((r.get("_rounds") for r in rows if r.get("_rounds")), None)
    if not rounds or rounds.get("rule") != "sequential":
        return
    base = next((r for r in rows if r.get("baseline") and "_steady_rates" in r), None)
    aa = next((r for r in rows if noise_floor_name and r["variant"] == noise_floor_name and "_steady_rates" in r),
              None)
    if base is None:
        return
    same = f"the same within +/-{same_within_pct:g}%"
    for basis, _, _ in BASES:
        for r in rows:
            if r is base or "_steady_rates" not in r:
                continue
            key = _rates_key(r, basis)
            refs = [base] + ([aa] if aa is not None and r is not aa else [])
            if not all(_in_rounds(x, key) for x in [r, *refs]):
                continue  # a run without a summary: the rates do not line up with the rounds
            floor = None
            if len(refs) == 2:
                floor = round_log_ratios(aa[key], [base[key]])
            found = decide_rounds(round_log_ratios(r[key], [x[key] for x in refs]), floor, same_within_pct,
                                  min_effect_pct)
            verdict = {SEQ_FASTER: FASTER, SEQ_SLOWER: SLOWER, SEQ_SAME: same, SEQ_NO_VERDICT: NO_VERDICT,
                       UNDECIDED: WITHIN_NOISE if found["low"] is not None else NO_VERDICT}[found["verdict"]]
            r[f"_{basis}_sequential"] = found
            r[f"{basis}_verdict"] = verdict
            r[f"{basis}_verdict_why"] = None if verdict == same else (found["why"] or None)
            if found["ratio"] is not None:
                r[f"_{basis}_cmp"] = {"ratio": found["ratio"], "low": found["low"], "high": found["high"],
                                      "runs": (found["rounds"], found["rounds"]), "method": SEQUENTIAL_INTERVAL,
                                      "round_drift_f": None}


def all_decided(rows: List[Dict[str, Any]], best_by: str = "end-to-end") -> bool:
    """Every variant but the baseline and the A/A copy has a decided sequential verdict on ``best_by``'s basis (a
    variant with no rate, none of its runs completed, is not waited for; nor is a matrix of the baseline alone)."""
    basis = "end_to_end" if best_by == "end-to-end" else "steady"
    others = [r for r in rows if not r.get("baseline") and not r.get("noise_floor") and "_steady_rates" in r]
    return all((r.get(f"_{basis}_sequential") or {}).get("verdict") not in (None, UNDECIDED) for r in others)
