"""An A/B trial's result as ``compare`` and ``report`` show it: its line, beside the ceiling of the bottleneck its
change targets (from the same file's diagnosis). Pure Python on the summary."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

from lightning_perf.summary.diagnosis import ceiling_words, recorded_or_computed
from lightning_perf.summary.fields import fixed
from lightning_perf.summary.model import PerfSummary, as_summary

__all__ = ["trial_line", "trial_results", "trial_lines", "trial_notes"]


def trial_line(summary: Any) -> Optional[str]:
    """``with channels_last: 1.12x faster (95% CI ...); the diagnosis's ceiling for compute-bound: if the step ran 2x
    faster (iterations), at most 1.60x faster``, or None where the run had no trial."""
    run: PerfSummary = as_summary(summary, "summary")
    trial = run.trial
    if trial is None:
        return None
    if trial.status == "not-started" and trial.reason:  # refused at set-up: no pair, no interval, no ceiling
        return f"with {trial.change}: not tried: {trial.reason}"
    line = (trial.line or f"with {trial.change}: no result").removeprefix("ABTrial: ")
    if trial.speedup:  # "within noise (0.954x)": the ratio with its direction, beside its interval
        words = (f"{fixed(trial.speedup, '.3f')}x faster" if trial.speedup >= 1.0
                 else f"{fixed(1.0 / trial.speedup, '.3f')}x slower")
        line = re.sub(r"within noise \([0-9.]+x\) \(([^,]*CI[^,]*),", lambda m: f"within noise ({words}, {m.group(1)},",
                      line, count=1)
    if trial.targets:
        ceiling = ceiling_words(recorded_or_computed(run), trial.targets)
        line += (f"; the diagnosis's ceiling for {trial.targets}: {ceiling}" if ceiling else
                 f"; no ceiling for {trial.targets} in this run's diagnosis")
    return line


def trial_results(runs: Sequence[Any], names: Sequence[str]) -> Dict[str, str]:
    """name -> trial line, for the runs that had a trial."""
    out = {}
    for run, name in zip(runs, names):
        line = trial_line(run)
        if line is not None:
            out[name] = line
    return out


def trial_lines(result: Dict[str, Any]) -> List[str]:
    """``compare``'s block: one line a run that tried a change inside itself."""
    trials = result.get("trials") or {}
    return ["", "A/B trial inside the run (paired blocks; docs/trials.md):"] + [
        f"  {name}: {line}" for name, line in trials.items()] if trials else []


def trial_notes(summaries: Sequence[Any], names: Sequence[str]) -> List[str]:
    """``report``'s notes: one a run that had a trial."""
    return [f"{name}: trial {line}" for name, line in trial_results(summaries, names).items()]
