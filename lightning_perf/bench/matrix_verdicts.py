"""The matrix's verdicts between runs: each variant's speedups against the baseline over the interleaved rounds, the
A/A noise floor beside them, a verdict per variant (faster, slower, within noise, no verdict) and the Best named only
where it is decided (:mod:`lightning_perf.bench.noise_floor` holds the rule). Each variant is measured by ranks against
the runs of the baseline and of its A/A copy together (both are the baseline's setup), within rounds where the rounds
drifted apart and every one of the three has a run in every round that ran (``paired by round``)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from lightning_perf.bench.noise_floor import (
    FASTER,
    NO_VERDICT,
    SLOWER,
    WITHIN_NOISE,
    best_or_tie,
    decide,
    floor_text,
    noise_floor,
    ratio_text,
    shift_by_rounds,
)
from lightning_perf.bench.rounds import DEFAULT_REPEATS, rounds_line
from lightning_perf.bench.sequential import round_log_ratios
from lightning_perf.bench.what_would_decide import fixed_words, what_would_decide

#: The two bases of a verdict: (name in row keys, the speedup's key, words).
BASES = (("steady", "speedup", "steady state, per measured iteration"),
         ("end_to_end", "end_to_end_speedup", "end to end, the whole fit"))


def basis_of(best_by: str) -> str:
    return "end_to_end" if best_by == "end-to-end" else "steady"


def _rates_key(row: Dict[str, Any], basis: str) -> str:
    if basis == "end_to_end":
        return "_end_to_end_rates"
    return "_samples_rates" if row.get("speedup_basis") == "samples/s" else "_steady_rates"


def _in_rounds(row: Dict[str, Any], key: str) -> bool:
    """Run ``i`` of the row's rates ran in round ``i``: one rate (a number or None) for every round that ran. A run
    without a summary is left out of the rates, so a row one short is not lined up with the rounds."""
    rounds = row.get("_rounds")
    return bool(rounds) and len(row.get(key) or []) == rounds.get("done")


def add_verdicts(rows: List[Dict[str, Any]], noise_floor_name: Optional[str], min_effect_pct: float) -> None:
    """Adds to each row but the baseline's, on each basis: the A/A pair's ratio and interval (``aa_speedup``,
    ``aa_ci_low``, ``aa_ci_high``; ``aa_end_to_end_...``), the verdict and why (``steady_verdict``,
    ``end_to_end_verdict``, ``..._why``); with repeats, both speedups and their intervals between runs, by ranks
    against the baseline's runs and its A/A copy's (:func:`shift_by_rounds`, within rounds where the rounds drifted;
    the copy's own against the baseline's, :func:`noise_floor`),
    so the Speedup columns show what the verdict decided (``speedup_significant``: that interval excludes 1 and the
    change is at least ``min_effect_pct``; Student's t where the runs are too few for a rank interval). The A/A row
    is marked ``noise_floor``."""
    base = next((r for r in rows if r.get("baseline") and "_steady_rates" in r), None)
    aa = next((r for r in rows if noise_floor_name and r["variant"] == noise_floor_name and "_steady_rates" in r),
              None)
    for r in rows:
        r["noise_floor"] = aa is not None and r is aa
    if base is None:
        return
    for basis, key, _ in BASES:
        prefix = "aa_" if basis == "steady" else "aa_end_to_end_"
        floor = None
        if aa is not None:
            key = _rates_key(aa, basis)
            floor = noise_floor(aa[key], base[key], by_rounds=_in_rounds(aa, key) and _in_rounds(base, key))
        for r in rows:
            if r is base or "_steady_rates" not in r:
                continue
            key = _rates_key(r, basis)
            references = [base] + ([aa] if aa is not None and r is not aa else [])
            cmp = shift_by_rounds(r[key], [x[key] for x in references],
                                  by_rounds=all(_in_rounds(x, key) for x in [r, *references]))
            if cmp["low"] is not None and basis == "end_to_end":
                r.update(end_to_end_speedup=cmp["ratio"], end_to_end_ci_low=cmp["low"], end_to_end_ci_high=cmp["high"])
            elif cmp["low"] is not None:
                r.update(speedup=cmp["ratio"], speedup_ci_low=cmp["low"], speedup_ci_high=cmp["high"],
                         speedup_significant=(cmp["low"] > 1.0 or cmp["high"] < 1.0)
                         and abs(cmp["ratio"] - 1.0) * 100.0 >= min_effect_pct)
            decided = decide(cmp, None if r is aa else floor, min_effect_pct)
            if cmp["ratio"] is None:  # no rate: say whose runs failed rather than "no rate to compare"
                decided["why"] = _not_completed(r, "every run") or _not_completed(base, "the baseline's runs") or (
                    decided["why"])
            if r is not aa and all(_in_rounds(x, key) for x in [r, *references]):
                _what_would_decide(r, basis, decided, round_log_ratios(r[key], [x[key] for x in references]))
            r[f"{basis}_verdict"], r[f"{basis}_verdict_why"] = decided["verdict"], decided["why"] or None
            r[f"_{basis}_floor"] = floor
            r[f"_{basis}_cmp"] = cmp
            r[prefix + "speedup"] = None if floor is None else floor["ratio"]
            r[prefix + "ci_low"] = None if floor is None else floor["low"]
            r[prefix + "ci_high"] = None if floor is None else floor["high"]


def _what_would_decide(row: Dict[str, Any], basis: str, decided: Dict[str, Any], diffs: List[Any]) -> None:
    """``--repeats N`` left the variant within noise (its interval holds 1 or reaches the A/A band): what would decide
    (:func:`lightning_perf.bench.what_would_decide.what_would_decide`, from its per-round log-ratios against the
    baseline and its A/A copy) in ``_{basis}_what_would_decide`` and after the verdict's why."""
    if (decided["verdict"] != WITHIN_NOISE or decided["why"].startswith("a change below")
            or (row.get("_rounds") or {}).get("rule") == "sequential"):
        return
    found = what_would_decide(diffs)
    row[f"_{basis}_what_would_decide"] = found
    decided["why"] = f"{decided['why']}; {fixed_words(found)}"


def _not_completed(row: Dict[str, Any], whose: str) -> Optional[str]:
    """Why a row has no rate where none of its runs completed (``every run failed (3 failed): ...``), else None."""
    statuses = row.get("_statuses") or []
    if not statuses or "completed" in statuses:
        return None
    counted = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
    return f"{whose} failed ({counted}): a failed run decides nothing, its speed is of the steps before it ended"


def verdict_cell(row: Dict[str, Any], best_by: str) -> str:
    """The Verdict column: ``baseline``, ``A/A noise floor``, ``1.10x slower``, ``within noise`` or ``no verdict``."""
    basis = basis_of(best_by)
    if row.get("baseline"):
        return "baseline"
    verdict = row.get(f"{basis}_verdict")
    if row.get("noise_floor"):
        floor = row.get(f"_{basis}_floor") or {}
        return "A/A noise floor" + (": ⚠ drifted" if floor.get("drifted") else "")
    if verdict in (FASTER, SLOWER):
        return ratio_text(row[f"_{basis}_cmp"]["ratio"])
    return verdict or "n/a"


def floor_cell(row: Dict[str, Any], best_by: str) -> str:
    """The A/A noise floor beside a variant: ``1.01x [0.97-1.05]``, ``1.01x`` (one run a side) or ``-``."""
    floor = row.get(f"_{basis_of(best_by)}_floor")
    if row.get("baseline") or not floor or floor.get("ratio") is None:
        return "-"
    if floor["low"] is None:
        return f"{floor['ratio']:.2f}x"
    return f"{floor['ratio']:.2f}x [{floor['low']:.2f}-{floor['high']:.2f}]"


def _interval(cmp: Dict[str, Any], direction: bool = False) -> str:
    """The ratio and its interval; with ``direction``, the ratio in words (``1.02x slower``): a ratio within noise
    is never a bare ``0.98x``."""
    runs = f"over {cmp['runs'][1]} + {cmp['runs'][0]} runs"
    ratio = ratio_text(cmp["ratio"]) if direction else f"{cmp['ratio']:.2f}x"
    return f"{ratio}, 95% CI {cmp['low']:.2f}x to {cmp['high']:.2f}x ({cmp['method']}) {runs}"


def verdict_findings(rows: List[Dict[str, Any]], best_by: str) -> List[str]:
    """The findings of the verdicts, on ``best_by``'s basis: the rounds run, the noise floor, the variants decided
    and those within noise."""
    basis = basis_of(best_by)
    words = next(w for b, _, w in BASES if b == basis)
    base = next((r for r in rows if r.get("baseline")), None)
    out: List[str] = []
    rounds = rounds_line(next((r["_rounds"] for r in rows if r.get("_rounds")), None))
    if rounds:
        out.append("Rounds: " + rounds)
    others = [r for r in rows if not r.get("baseline") and r.get(f"{basis}_verdict")]
    if base is None or not others:
        return out
    aa = next((r for r in rows if r.get("noise_floor")), None)
    floor = others[0].get(f"_{basis}_floor")
    if aa is not None:
        out.append(f"Noise floor (A/A: {aa['variant']}, the baseline's setup again in the same rounds, against"
                   f" {base['variant']}; {words}): {floor_text(floor)}. Each variant is measured by ranks (the"
                   f" median of its runs' ratios to the runs of {base['variant']} and {aa['variant']} together;"
                   " within rounds by aligned ranks where the rounds drifted apart: 'paired by round') and decided"
                   " only where its interval excludes 1 and stays outside the band of the A/A ratio (both ways).")
        if floor and floor.get("drifted"):
            out.append("⚠ The A/A pair differed beyond its interval: the machine drifted more than the intervals"
                       " allow, so no variant is decided; run again on a quieter machine or with more --repeats.")
    else:
        out.append("Noise floor: not measured (no A/A pair ran: --noise-floor off, or its copy has no summary);"
                   " verdicts rest on each interval alone.")
    decided = [r for r in others if r[f"{basis}_verdict"] in (FASTER, SLOWER)]
    if decided:
        out.append("Decided against " + base["variant"] + ": " + "; ".join(
            f"{r['variant']} {ratio_text(r[f'_{basis}_cmp']['ratio'])} ({_interval(r[f'_{basis}_cmp'])})"
            for r in decided) + ".")
    tied = [r for r in others if r[f"{basis}_verdict"] == WITHIN_NOISE and not r.get("noise_floor")]
    if tied:
        out.append(f"Within noise of {base['variant']}: " + "; ".join(
            f"{r['variant']} ({_interval(r[f'_{basis}_cmp'], direction=True)}: {r[f'{basis}_verdict_why']})"
            for r in tied)
            + ": no change the machine could not have made.")
    failed = [r for r in others if "a failed run decides nothing" in (r.get(f"{basis}_verdict_why") or "")]
    if failed:
        out.append("No verdict: " + "; ".join(f"{r['variant']} ({r[f'{basis}_verdict_why']})" for r in failed) + ".")
    if any(r[f"{basis}_verdict"] == NO_VERDICT and (r[f"_{basis}_cmp"]["runs"][0] or 0) < 2 and r not in failed
           for r in others):
        out.append("No verdict between runs: one run each, so the drift between runs was not measured; run with"
                   f" --repeats 2 or more (default {DEFAULT_REPEATS}).")
    return out


def best_words(rows: List[Dict[str, Any]], eligible: List[Dict[str, Any]], best_by: str) -> Optional[str]:
    """None where the fastest of ``eligible`` (the rows Best may name, the A/A copy left out) is decided faster than
    each of the others; else why no Best is named: which ones tie, or that one run each decides nothing."""
    basis = basis_of(best_by)
    pool = [r for r in eligible if not r.get("noise_floor") and "_steady_rates" in r]
    if len(pool) < 2:
        return None
    if basis == "end_to_end":
        key = "_end_to_end_rates"
    else:
        key = "_samples_rates" if any(r.get("speedup_basis") == "samples/s" for r in pool) else "_steady_rates"
    if min(len([v for v in r[key] if v]) for r in pool) < 2:
        return "one run each, so the drift between runs was not measured (--repeats 2 or more)"
    floor = next((r.get(f"_{basis}_floor") for r in rows if r.get(f"_{basis}_floor")), None)
    aa = next((r for r in rows if r.get("noise_floor")), None)
    runs = {r["variant"]: list(r[key]) + (aa[key] if r.get("baseline") and aa is not None else []) for r in pool}
    found = best_or_tie(runs, floor)
    if found["best"] is not None:
        return None
    if floor and floor.get("drifted"):
        return "the A/A pair drifted beyond its interval, so nothing is decided"
    return f"{', '.join(found['tie'])} tie: within noise of each other between runs"
