"""One decided comparison of two setups, from which every derived line of `compare` and `report` is said."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from lightning_perf.summary.fields import finite, fixed, fmt_duration

#: Said after a derived figure whose direction the speed verdict does not decide.
NOT_DECIDED = "not decided"


@dataclass(frozen=True)
class Comparison:
    """The speed verdict of a pair (or of two sets of repeats) and its interval.

    ``speedup``: candidate speed / base speed on ``basis`` (``it/s``, or ``samples/s`` where the runs process
    different samples per iteration); ``ci95``: its 95% interval (None where none could be made); ``decided``: the
    verdict is a change (the interval between runs excludes 1 and the change is past the smallest effect). With one
    run a side nothing is decided: the drift between runs was not measured.
    """

    speedup: Optional[float]
    ci95: Optional[Tuple[float, float]]
    decided: bool
    basis: str = "it/s"
    interval: str = "within runs"

    @classmethod
    def of(cls, result: Dict[str, Any]) -> "Comparison":
        """The comparison of :func:`~lightning_perf.summary.compare.compare_summaries`'s dict."""
        ci = result.get("speedup_ci95")
        speedup = finite(result.get("speedup"))
        return cls(speedup=speedup if speedup and speedup > 0 else None,
                   ci95=(ci[0], ci[1]) if ci and None not in (finite(ci[0]), finite(ci[1])) else None,
                   decided=bool(result.get("speedup_significant")) and speedup is not None,
                   basis=result.get("speedup_basis") or "it/s",
                   interval=result.get("speedup_interval") or "within runs")

    @property
    def direction(self) -> Optional[str]:
        """``faster`` or ``slower`` where decided, else None."""
        if not self.decided or self.speedup is None or self.speedup == 1.0:
            return None
        return "faster" if self.speedup > 1.0 else "slower"

    @property
    def unit(self) -> str:
        """What one figure of the headline is about: ``per sample`` where batch sizes differ, else ``per iteration``."""
        return "per sample" if self.basis == "samples/s" else "per iteration"

    def as_dict(self) -> Dict[str, Any]:
        return {"speedup": self.speedup, "ci95": list(self.ci95) if self.ci95 else None, "decided": self.decided,
                "direction": self.direction, "basis": self.basis, "unit": self.unit, "interval": self.interval}

    # -- derived lines ------------------------------------------------------------------------------------------------

    def typical_text(self, typical: Optional[float]) -> str:
        """The median iteration's speed ratio (``typical``, on the headline's basis), said in the headline's unit and
        with a direction word only where the verdict is decided and the median agrees with it."""
        if finite(typical) is None or not typical > 0:
            return "n/a"
        where = f"{self.unit} in the median iteration"
        if self.direction is None:
            return (f"{NOT_DECIDED}: candidate/base speed {fixed(typical, '.2f')} {where} (stalls and slow steps left"
                    " out; the verdict decides no direction)")
        if (typical > 1.0) != (self.direction == "faster") or round(typical, 2) == 1.0:
            return (f"candidate/base speed {fixed(typical, '.2f')} {where}: the median iteration does not follow the"
                    " verdict (the change is in the slow iterations)")
        words = f"{fixed(typical, '.2f')}x faster" if typical > 1.0 else f"{fixed(1.0 / typical, '.2f')}x slower"
        return f"{words} {where} (stalls and slow steps left out)"

    def saved_at(self, result: Dict[str, Any], speedup: float) -> Optional[float]:
        """The time saved to N iterations were the ratio ``speedup``: the point figure with the candidate's steady
        time moved to the base's like-for-like time over ``speedup`` (warm-up kept as measured)."""
        steady = result.get("steady_time_s") or {}
        saved, base_steady, cand_steady = result.get("time_saved_s"), steady.get("base"), steady.get("candidate")
        if None in (finite(saved), finite(base_steady), finite(cand_steady)) or not speedup > 0:
            return None
        return finite(saved + cand_steady - base_steady / speedup)

    def time_saved(self, result: Dict[str, Any], duration=fmt_duration) -> Tuple[str, str]:
        """(label, text) of the time to N iterations (like for like: the same samples where batch sizes differ):
        ``Time saved``/``Time lost`` with the figure where decided; where not, the range the interval allows
        (``between 1.2 min saved and 0.8 min lost (not decided)``) or ``not decided``."""
        saved, pct = result.get("time_saved_s"), result.get("time_saved_pct")
        if finite(saved) is None:
            return "Time saved", "n/a"
        if self.direction is None:
            ends = [self.saved_at(result, r) for r in self.ci95] if self.ci95 else [None]
            if None in ends:
                return "Time change", f"{NOT_DECIDED} (the speed verdict decides no direction)"
            return "Time change", f"{_range_words(min(ends), max(ends), duration)} ({NOT_DECIDED})"
        known = finite(pct) is not None
        if saved < 0:
            text = (f"{result['candidate']['name']} takes {duration(-saved)} longer"
                    + (f" (+{fixed(-pct, '.1f')}%)" if known else ""))
            label = "Time lost"
        else:
            text, label = duration(saved) + (f" ({fixed(pct, '.1f')}%)" if known else ""), "Time saved"
        if (saved >= 0) != (self.direction == "faster"):
            text += " (the warm-up difference outweighs the per-iteration change over these iterations)"
        return label, text

    def break_even_text(self, be: Dict[str, Any], duration=fmt_duration) -> str:
        """The break-even in the headline's unit, and only where the speed verdict is decided."""
        if be.get("verdict") is None:
            return f"n/a: {be.get('reason')}"
        if self.direction is None:
            return (f"{NOT_DECIDED}: the speed verdict decides no direction, so no iteration count at which one"
                    " setup overtakes the other can be named")
        saving = be.get("saving_ms_per_iter")
        if saving is not None and saving != 0 and (saving > 0) != (self.direction == "faster"):
            return ("n/a: the first pair's per-iteration difference goes against the verdict over all runs, so it"
                    " names no break-even")
        return break_even_text(be, duration).replace("per iteration", self.unit)

    def sections_decided(self) -> bool:
        """Whether a section's change may be named as the one behind the speed change (only where it is decided)."""
        return self.direction is not None


def _range_words(lo: float, hi: float, duration) -> str:
    """``between 1.2 min saved and 0.8 min lost`` for a time saved between ``lo`` and ``hi`` seconds."""
    if (lo >= 0) == (hi >= 0):  # one sign: the words once
        near, far = sorted((abs(lo), abs(hi)))
        word = "saved" if lo >= 0 else "lost"
        return (f"{duration(near)} {word}" if duration(near) == duration(far)
                else f"between {duration(near)} and {duration(far)} {word}")

    def one(s: float) -> str:
        return f"{duration(abs(s))} {'saved' if s >= 0 else 'lost'}"
    return f"between {one(hi)} and {one(lo)}"


def section_noise_ms(row: Dict[str, Any]) -> Optional[float]:
    """A section's noise floor in ms per iteration: the larger of the spread between repeats (where both sides have
    repeats), the two runs' standard errors (from each run's p50-p95 spread over its calls) and the smallest effect
    of the headline (``min_effect_pct`` of the larger side)."""
    b, c = row.get("base_ms_per_iter"), row.get("candidate_ms_per_iter")
    if finite(b) is None or finite(c) is None:
        return None
    floor = row.get("min_effect_pct", 2.0) / 100.0 * max(abs(b), abs(c))
    se = [finite(v) for v in (row.get("base_se_ms"), row.get("candidate_se_ms"))]
    if None not in se:
        floor = max(floor, 2.0 * math.hypot(se[0], se[1]))  # hypot: no overflow for 1e300
    spread = finite(row.get("repeats_spread_ms"))
    return max(floor, spread or 0.0, 0.005)


def break_even_text(result: Dict[str, Any], duration=fmt_duration) -> str:
    """The break-even in words (``result``: :func:`break_even`'s dict); ``duration`` formats seconds."""
    verdict, extra, n = result["verdict"], result["extra_warmup_s"], result["iterations"]
    if verdict is None:
        return f"n/a: {result['reason']}"
    if verdict == "pays_back":
        return (f"pays back its {fixed(extra, '.2f')} s of extra warm-up after {n:,} iterations"
                f" ({duration(result['seconds'])})")
    if verdict == "never":
        if extra < 0.005:
            return "never ahead: no less warm-up and slower per iteration"
        return f"never pays back: {fixed(extra, '.2f')} s more warm-up and not faster per iteration"
    less = f"{fixed(-extra, '.2f')} s less warm-up" if -extra >= 0.005 else "no more warm-up"
    if verdict == "ahead_until":
        return (f"no warm-up cost to pay back ({less}), but slower per iteration: ahead for the first {n:,}"
                f" iterations ({duration(result['seconds'])}) only")
    return f"no warm-up cost to pay back ({less}) and not slower per iteration"
