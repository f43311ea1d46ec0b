"""When a fixed count of rounds (``race``/``matrix --repeats N``) leaves a comparison within noise, what would decide
it: the smallest change those rounds could have found from the spread between rounds, the rounds that would find 10%,
and, for a matrix variant that differs from the baseline by one switch an in-run trial can flip, the exact
``lightning-perf run --trial`` line that tries it inside one run. Pure Python: no torch.

The figure of a fixed design (docs/bench.md, "When `--repeats N` cannot decide"): the rounds' paired log-ratios ``d``
(as ``--repeats auto`` reads them, :func:`lightning_perf.bench.sequential.round_log_ratios`), their spread ``sd``, and
the change a paired t test at 95% finds with 80% power at ``n`` rounds: ``(t_{0.975, n-1} + z_{0.8}) sd / sqrt(n)``.
The verdict's rank interval and its A/A band ask a little more, so the figure is a lower bound, said "about".
"""

from __future__ import annotations

import math
import shlex
from statistics import NormalDist
from typing import Any, Dict, List, Optional, Sequence

from lightning_perf.bench.noise_floor import MIN_BLOCKED_ROUNDS
from lightning_perf.bench.sequential import IN_RUN_HINT, POWER, TARGET_PCT
from lightning_perf.measure.stats.ratio_ci import t_quantile_at_least

#: A matrix override that is one of ABTrial's built-in changes (docs/trials.md): the presets amp, fp16,
#: cudnn_benchmark and channels_last.
SWITCHES: Dict[str, str] = {
    "--trainer.precision=bf16-mixed": "autocast_bf16",
    "--trainer.precision=16-mixed": "autocast_fp16",
    "--trainer.benchmark=true": "cudnn_benchmark",
    "--model.channels_last=true": "channels_last",
}

#: The most rounds the words name; beyond, "more than".
MAX_ROUNDS_SAID = 1000


def _finite(values: Sequence[Optional[float]]) -> List[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def fixed_smallest_change(sd: Optional[float], n: int, power: float = POWER) -> Optional[float]:
    """The smallest change (log units) ``n`` rounds of spread ``sd`` find with probability ``power`` at 95% (paired
    t); None under 2 rounds or with no spread known."""
    if sd is None or n < 2:
        return None
    return (t_quantile_at_least(0.975, n - 1) + NormalDist().inv_cdf(power)) * sd / math.sqrt(n)


def fixed_rounds_for(change_pct: float, sd: Optional[float], power: float = POWER,
                     cap: int = MAX_ROUNDS_SAID) -> Optional[int]:
    """The fewest rounds whose :func:`fixed_smallest_change` is ``change_pct`` or less; None with no spread known or
    beyond ``cap``."""
    if sd is None:
        return None
    target = math.log1p(change_pct / 100.0)
    for n in range(2, cap + 1):
        found = fixed_smallest_change(sd, n, power)
        if found is not None and found <= target:
            return n
    return None


def what_would_decide(diffs: Sequence[Optional[float]]) -> Dict[str, Any]:
    """From a comparison's per-round log-ratios (None for a round without both rates): ``rounds`` (counted), ``sd``,
    ``smallest_change_pct`` (found with 80% power at these rounds) and ``rounds_for_10pct`` (None where not known:
    under 2 rounds, or more than :data:`MAX_ROUNDS_SAID`; at least ``MIN_BLOCKED_ROUNDS``, from which the verdict
    pairs the runs by round)."""
    d = _finite(diffs)
    n = len(d)
    sd = None
    if n >= 2:
        mean = sum(d) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    small = fixed_smallest_change(sd, n)
    need = fixed_rounds_for(TARGET_PCT, sd)
    return {"rounds": n, "sd": sd, "smallest_change_pct": None if small is None else 100.0 * math.expm1(small),
            # the verdict pairs the runs by round only from MIN_BLOCKED_ROUNDS: fewer would not be read as here
            "rounds_for_10pct": None if need is None else max(need, MIN_BLOCKED_ROUNDS)}


def fixed_words(found: Dict[str, Any], trial_line: Optional[str] = None) -> str:
    """``this machine's drift hides changes under ~18% at 5 rounds; about 14 rounds (--repeats 14) would find 10%
    (or an in-run trial ...)``; with ``trial_line``, that line in place of the generic hint."""
    n, small, need = found["rounds"], found.get("smallest_change_pct"), found.get("rounds_for_10pct")
    if small is None:
        head = f"{n} round(s) with a rate on both sides give no spread between rounds"
    elif n < MIN_BLOCKED_ROUNDS:  # the verdict's interval was not paired by round: the paired figure is not its own
        head = (f"at {n} round(s) the verdict cannot pair the runs by round (it does from {MIN_BLOCKED_ROUNDS}), so"
                " the drift between rounds stays in its interval")
    else:
        head = f"this machine's drift hides changes under ~{small:.0f}% at {n} rounds"
    if need is not None:
        tail = f"about {need} rounds (--repeats {need}) would find {TARGET_PCT:g}%"
    elif small is not None:
        tail = f"more than {MAX_ROUNDS_SAID} rounds would be needed to find {TARGET_PCT:g}%"
    else:
        tail = "run 3 rounds or more to measure it"
    return f"{head}; {tail} {trial_hint(trial_line)}"


def trial_hint(trial_line: Optional[str]) -> str:
    """The in-run trial in words: the exact line where there is one, else :data:`IN_RUN_HINT`."""
    if trial_line is None:
        return IN_RUN_HINT
    return f"(or an in-run trial, which pairs the change inside one fit, would: `{trial_line}`)"


def switch_of(overrides: Sequence[str], base_overrides: Sequence[str]) -> Optional[str]:
    """The built-in trial change (:data:`SWITCHES`) a variant's overrides add to the baseline's, where that is all
    they change (the baseline's overrides kept, one switch added); else None."""
    extra = list(overrides)
    for word in base_overrides:
        if word not in extra:
            return None
        extra.remove(word)
    if len(extra) != 1:
        return None
    return SWITCHES.get(extra[0].lower())


def trial_line(change: str, python: str, script: str, config: Optional[str], base_overrides: Sequence[str]) -> str:
    """``lightning-perf run --trial CHANGE -- PYTHON SCRIPT fit [--config CONFIG] OVERRIDES``: the baseline's command
    as the matrix runs it, with the change tried inside its fit; quoted for a shell."""
    command = [python, script, "fit"] + (["--config", config] if config else []) + list(base_overrides)
    return " ".join(["lightning-perf", "run", "--trial", change, "--"] + [shlex.quote(word) for word in command])


def add_trial_lines(rows: List[Dict[str, Any]], results: Sequence[Dict[str, Any]], python: str, script: str,
                    config: Optional[str]) -> None:
    """For each matrix row (``results`` in the same order) whose variant is the baseline plus one switch
    (:func:`switch_of`): ``_trial_line``, and in each ``{basis}_verdict_why`` that says what would decide, that line
    in place of the generic hint."""
    base = next((res for row, res in zip(rows, results) if row.get("baseline")), None)
    if base is None:
        return
    for row, res in zip(rows, results):
        if row.get("baseline") or row.get("noise_floor"):
            continue
        change = switch_of(res.get("overrides") or [], base.get("overrides") or [])
        if change is None:
            continue
        line = trial_line(change, python, script, config, base.get("overrides") or [])
        row["_trial_line"] = line
        for basis in ("steady", "end_to_end"):
            why = row.get(f"{basis}_verdict_why")
            if why and IN_RUN_HINT in why:
                row[f"{basis}_verdict_why"] = why.replace(IN_RUN_HINT, trial_hint(line))


def trial_line_findings(rows: Sequence[Dict[str, Any]], best_by: str) -> List[str]:
    """One line per variant within noise whose change is a switch: the run that tries it inside one fit."""
    basis = "end_to_end" if best_by == "end-to-end" else "steady"
    out = []
    for row in rows:
        line = row.get("_trial_line")
        verdict = row.get(f"{basis}_verdict") or ""
        if line and verdict not in ("faster", "slower") and not verdict.startswith("the same"):
            out.append(f"Try {row['variant']} inside one run, where the drift between runs cannot reach it (its"
                       f" change is a switch ABTrial flips in alternating blocks): `{line}`.")
    return out

