"""The words of a quality gate: a failed check's message, the one-line verdict at fit end, what a gate that never
checked does. Pure Python: each takes the gate's results (metric -> its entry in the summary's quality_gate.metrics)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional


def times(count: int, what: str) -> str:
    """``1 validation``, ``3 validations``."""
    return f"{count} {what}" + ("s" if count != 1 else "")


def on_never_checked(action: str) -> str:
    """What a gate with a baseline that did not check everything does at fit end, by its action."""
    return {"fail": "action='fail' fails the fit", "warn": "action='warn' warns",
            "stop": "action='stop' warns: there is no training left to stop"}[action]


def failure_message(step: int, failing: List[str], results: Dict[str, Dict[str, Any]]) -> str:
    """``quality gate failed at step S: psnr 25 vs baseline 26 (-3.85%), tolerance 0.5%, higher is better.``"""
    parts = []
    for name in failing:
        r = results.get(name)
        if r is None:
            parts.append(name)
            continue
        if r.get("reason"):
            parts.append(f"{name} {r['reason']}")
            continue
        better = "higher" if r["mode"] == "max" else "lower"
        pct = f" ({r['delta_pct']:+.2f}%)" if r["delta_pct"] is not None else ""
        tol = (f"{100 * r['tolerance']:g}%" if r["tolerance_mode"] == "relative" else f"{r['tolerance']:g}")
        parts.append(f"{name} {r['value']:.4g} vs baseline {r['baseline']:.4g}{pct}, tolerance {tol},"
                     f" {better} is better")
    return f"quality gate failed at step {step}: " + "; ".join(parts) + "."


def verdict_line(results: Dict[str, Dict[str, Any]], checks: int, failed: List[Dict[str, Any]], failed_count: int,
                 gated: bool, unchecked: Optional[str], not_checked: Optional[str]) -> str:
    """One line for the console: the final verdict and every failed check (the first 10, then a count).

    Args:
        gated: whether the gate has a baseline.
        unchecked: why a gate with a baseline did not decide all it gates (set at fit end), or None.
        not_checked: the first check that left a gated metric unscored, or None.
    """
    values = ", ".join(f"{n} {r['value']:.4g}" for n, r in results.items() if r.get("value") is not None)
    if unchecked and not failed_count:
        return f"QualityGate: not passed, {unchecked}"
    if checks == 0:
        return "QualityGate: no validation was checked" + (f" (not checked at {not_checked})" if not_checked else "")
    counted = times(checks, "check")
    if not gated:
        return f"QualityGate: {values} (no baseline, not gated; {counted})"
    if not failed_count:
        return f"QualityGate: passed {'all ' if checks != 1 else ''}{counted}; last: {values}"
    shown = "; ".join(f"step {f['step']}: {', '.join(f['metrics'])}" for f in failed[:10])
    more = f"; and {failed_count - 10} more" if failed_count > 10 else ""
    return f"QualityGate: FAILED {failed_count} of {checks} checks ({shown}{more}); last: {values or 'no finite value'}"
