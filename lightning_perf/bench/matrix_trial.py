"""``lightning-perf matrix --trial CHANGE``: an A/B trial of a change (built-in, or the user's switches by import path)
inside each variant's fits, and one figure per variant in the report.

Each variant's runs get an ``ABTrial(change=CHANGE)`` with its defaults (``lightning-perf run --trial``'s way: the
start-up hook reads :data:`lightning_perf._attach.TRIAL_ENV`). A variant's figure pools the complete block pairs of
all its runs (the first round and its repeats: each summary's ``trial.pair_off_ms`` / ``trial.pair_on_ms``) into one
ratio estimator, the statistic of a single trial (:func:`lightning_perf.measure.trials.blocks.paired_ratio`): with one
run it is that run's own figure; with repeats it weighs each pair alike, so a run cut short counts for the pairs it
measured. Pairs are treated as independent across runs too: a change whose effect differs from run to run widens
the residuals, not a separate between-run term (docs/trials.md).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from lightning_perf.measure.trials.blocks import BUILT_IN_CHANGES, paired_ratio

#: The row keys a trial adds (in the CSV as columns; the report shows one column and a findings line).
TRIAL_KEYS = ("trial_change", "trial_speedup", "trial_speedup_low", "trial_speedup_high", "trial_verdict",
              "trial_pairs", "trial_runs", "trial_reason")


def _trial_of(result: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    summary = result.get("summary")
    trial = summary.get("trial") if isinstance(summary, dict) else None
    return trial if isinstance(trial, dict) else None


def _pairs(trial: Dict[str, Any]) -> List[Tuple[float, float]]:
    off, on = trial.get("pair_off_ms"), trial.get("pair_on_ms")
    if not isinstance(off, list) or not isinstance(on, list) or len(off) != len(on):
        return []
    return [(float(a), float(b)) for a, b in zip(off, on)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0]


def pooled_trial(change: str, runs: Sequence[Dict[str, Any]], confidence: float = 0.95) -> Dict[str, Any]:
    """The row keys of one variant: its runs' (``run_matrix`` results: the first and its repeats) trial pairs pooled
    into one ratio and paired interval; a reason where none can be given."""
    out: Dict[str, Any] = {key: None for key in TRIAL_KEYS}
    out["trial_change"] = change
    trials = [t for t in (_trial_of(r) for r in runs) if t is not None]
    pairs = [p for t in trials for p in _pairs(t)]
    out["trial_runs"] = sum(1 for t in trials if _pairs(t))
    out["trial_pairs"] = len(pairs)
    result = paired_ratio(pairs, confidence)
    if result is None:
        reasons = "; ".join(dict.fromkeys(str(t.get("reason")) for t in trials if t.get("reason")))
        if not trials:
            out["trial_reason"] = "no run of this variant has a trial section"
        elif all(t.get("status") == "not-started" for t in trials) and reasons:
            out["trial_reason"] = reasons  # refused at set-up: the change cannot be tried in this run
        else:
            out["trial_reason"] = (f"{len(pairs)} complete pair(s) of blocks in {len(runs)} run(s); the interval"
                                   " needs 2" + (f" ({reasons})" if reasons else ""))
        return out
    ratio, low, high = result
    out.update(trial_speedup=1.0 / ratio, trial_speedup_low=1.0 / high, trial_speedup_high=1.0 / low,
               trial_verdict="faster" if high < 1 else "slower" if low > 1 else "within-noise")
    return out


def add_trial(rows: List[Dict[str, Any]], results: Sequence[Dict[str, Any]], change: Optional[str]) -> None:
    """Adds each variant's pooled trial (:func:`pooled_trial`) to its row (``matrix_rows``' rows, in the results'
    order); nothing without a trial."""
    if not change:
        return
    for row, result in zip(rows, results):
        row.update(pooled_trial(change, [result, *(result.get("repeats") or [])]))


def trial_cell(row: Dict[str, Any]) -> str:
    """``1.12x [1.09-1.15], 24 pairs`` (the speed-up with the change, 95% interval, pairs pooled), or ``n/a``."""
    if row.get("trial_speedup") is None:
        return "n/a"
    runs = row.get("trial_runs") or 0
    return (f"{row['trial_speedup']:.3f}x [{row['trial_speedup_low']:.3f}-{row['trial_speedup_high']:.3f}],"
            f" {row['trial_pairs']} pairs" + (f" of {runs} runs" if runs > 1 else ""))


def add_trial_column(headers: List[str], table: List[List[str]], rows: Sequence[Dict[str, Any]]) -> None:
    """Appends the trial column (before the last, Status) where the rows have a trial."""
    change = next((r["trial_change"] for r in rows if r.get("trial_change")), None)
    if change is None:
        return
    at = len(headers) - 1
    headers.insert(at, f"Trial: {change} in-run speedup (95% CI)")
    for line, row in zip(table, rows):
        line.insert(at, trial_cell(row))


def trial_findings(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """One line: each variant's verdict of the change inside its own fits."""
    with_trial = [r for r in rows if r.get("trial_change")]
    if not with_trial:
        return []
    words = {"faster": "faster", "slower": "slower", "within-noise": "within noise"}
    parts = []
    for r in with_trial:
        if r.get("trial_speedup") is None:
            parts.append(f"{r['variant']}: n/a ({r.get('trial_reason')})")
        else:  # the ratio with its direction: "within noise (1.048x slower)", never a bare 0.954x
            speedup = r["trial_speedup"]
            way = f"{speedup:.3f}x faster" if speedup >= 1.0 else f"{1.0 / speedup:.3f}x slower"
            parts.append(f"{r['variant']}: {words[r['trial_verdict']]} ({way}), {trial_cell(r)}")
    return [f"Trial of {with_trial[0]['trial_change']} inside each fit (paired blocks, pooled over each variant's"
            f" runs; the speedup with the change against the same fit without it): {'; '.join(parts)}."]
