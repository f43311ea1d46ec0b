"""Energy per unit of work: VRAMMonitor's joules of the training phase over IterationTimer's iterations and samples
(joined when the summary is built), and the change between two runs that compare and report show. Pure Python."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from lightning_perf.summary.fields import finite, fmt_pct
from lightning_perf.summary.model import PerfSummary, as_summary

#: The per-work figures of a phase, as the summary names them.
WORK_FIELDS = ("iterations", "samples", "j_per_iteration", "j_per_sample", "samples_per_j")


def _per(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    return finite(numerator / denominator) if numerator is not None and denominator else None


def join_work(data: Dict[str, Any]) -> None:
    """Fills ``vram.activity.energy.phases.train`` with joules per iteration and per sample and samples per joule, from
    IterationTimer's counts where both saw the same training batches; else the figures stay null with the reason. A
    failure leaves the section as it was, with its reason: the summary is written all the same."""
    vram = data.get("vram")
    activity = vram.get("activity") if isinstance(vram, dict) else None
    energy = activity.get("energy") if isinstance(activity, dict) else None
    train = (energy.get("phases") or {}).get("train") if isinstance(energy, dict) else None
    if not isinstance(train, dict):
        return
    reasons = train.setdefault("unavailable", {})
    try:
        for name in WORK_FIELDS:
            train.setdefault(name, None)
        timer = data.get("iteration_timer")
        why = None
        if train.get("energy_j") is None:
            why = "no energy figure for the training phase (see `unavailable.energy_j`)"
        elif not isinstance(timer, dict) or timer.get("error"):
            why = "IterationTimer counts the iterations and samples: add it to the run"
        elif timer.get("batches") != energy.get("train_batches"):
            why = (f"IterationTimer counted {timer.get('batches')} training batches, the energy covers"
                   f" {energy.get('train_batches')}: not the same work")
        if why:
            reasons.setdefault("j_per_iteration", why)
            return
        joules = train["energy_j"]
        train["iterations"], train["samples"] = timer.get("iterations"), timer.get("samples")
        train["j_per_iteration"] = _per(joules, train["iterations"])
        train["j_per_sample"] = _per(joules, train["samples"])
        train["samples_per_j"] = _per(train["samples"], joules)
        if train["samples"] is None:
            reasons["j_per_sample"] = ((timer.get("unavailable") or {}).get("samples_per_s")
                                       or "IterationTimer counted no samples")
    except Exception as err:  # noqa: BLE001 - a measurement never raises into training
        reasons["j_per_iteration"] = f"the energy could not be joined with the iterations ({type(err).__name__}: {err})"


def train_energy(run: PerfSummary) -> Dict[str, Optional[float]]:
    """The training phase's energy figures of one run: ``energy_j``, ``mean_power_w``, ``j_per_iteration``,
    ``j_per_sample``, ``samples_per_j`` (None where not measured) and ``source``."""
    vram = run.vram
    energy = vram.activity.energy if vram is not None and vram.activity is not None else None
    train = (energy.phases or {}).get("train") if energy is not None else None
    out: Dict[str, Any] = {name: getattr(train, name, None) if train is not None else None
                           for name in ("energy_j", "mean_power_w", "j_per_iteration", "j_per_sample",
                                        "samples_per_j")}
    out["source"] = energy.source if energy is not None else None
    return out


def energy_change(base: Any, candidate: Any) -> Optional[Dict[str, Any]]:
    """Per figure (J/sample, samples/J, J/iteration, mean power) both runs' values and the change in %; None where
    neither run measured energy. Lower J/sample (higher samples/J) is better."""
    b, c = train_energy(as_summary(base, "base")), train_energy(as_summary(candidate, "candidate"))
    if b["energy_j"] is None and c["energy_j"] is None:
        return None
    out: Dict[str, Any] = {"source": {"base": b["source"], "candidate": c["source"]}}
    for name in ("j_per_sample", "samples_per_j", "j_per_iteration", "mean_power_w"):
        x, y = b[name], c[name]
        delta = None if x is None or y is None else finite(y - x)
        out[name] = {"base": x, "candidate": y,
                     "delta_pct": None if delta is None or not x else finite(100.0 * delta / abs(x))}
    return out


def fmt_energy(value: Optional[float]) -> str:
    """Joules (or samples per joule) with three significant digits: ``0.125``, ``41.2``, ``1.20e+03``; ``n/a``."""
    if finite(value) is None:
        return "n/a"
    if value != 0 and not 0.001 <= abs(value) < 1000:
        return f"{value:.2e}"
    return f"{value:.3g}"


#: (figure, label) in the order compare shows them.
ENERGY_LABELS = (("j_per_sample", "J/sample"), ("samples_per_j", "samples/J"), ("j_per_iteration", "J/iteration"),
                 ("mean_power_w", "mean power W"))


def energy_lines(change: Optional[Dict[str, Any]], base_name: str, candidate_name: str) -> List[str]:
    """compare's text lines for :func:`energy_change`, or none."""
    if not change:
        return []
    sources = change["source"]
    lines = ["", f"Energy (training, the device's {sources['candidate'] or sources['base']}):"]
    for name, label in ENERGY_LABELS:
        d = change[name]
        if d["base"] is None and d["candidate"] is None:
            continue
        lines.append(f"  {label}: {fmt_energy(d['base'])} -> {fmt_energy(d['candidate'])} ({fmt_pct(d['delta_pct'])})")
    if sources["base"] and sources["candidate"] and sources["base"] != sources["candidate"]:
        lines.append(f"  ({base_name}: {sources['base']}, {candidate_name}: {sources['candidate']}: not like for like)")
    return lines
