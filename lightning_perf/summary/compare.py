"""Compare two runs: speedup with a 95% confidence interval, time to N iterations, memory and quality deltas."""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Sequence

from lightning_perf.measure.stats.ratio_ci import batch_means_ratio_ci, between_runs_ratio_ci
from lightning_perf.measure.timing.tail_advice import counted
from lightning_perf.summary.fields import (
    IMAGE_METRIC_DIRECTIONS,
    SummaryLike,
    blocks,
    finite,
    fixed,
    fmt_duration,
    fmt_num,
    fmt_pct,
    markdown_table,
    memory,
    one_line,
    quality,
    ratio,
    run_names,
    speed,
)
from lightning_perf.summary.contention import contention
from lightning_perf.summary.diagnosis import diagnosis_line, recorded_or_computed
from lightning_perf.summary.diagnosis import recorded_or_computed_straggler, straggler_text
from lightning_perf.summary.trial_view import trial_lines, trial_results
from lightning_perf.summary.energy import ENERGY_LABELS, energy_change, energy_lines, fmt_energy
from lightning_perf.summary.model import PerfSummary, as_summary
from lightning_perf.summary.memory_floor import FIELD_SOURCES, FLOORS, floor_mib
from lightning_perf.summary.schema import SummaryError
from lightning_perf.summary.comparison import NOT_DECIDED, Comparison, break_even_text, section_noise_ms
from lightning_perf.summary.projection import project_time, warmup_cost


def _delta(base: Optional[float], cand: Optional[float]) -> Dict[str, Optional[float]]:
    delta = None if base is None or cand is None else finite(cand - base)
    pct = None if delta is None or not base else finite(100.0 * delta / abs(base))
    return {"base": base, "candidate": cand, "delta": delta, "delta_pct": pct}


#: Changes smaller than this are "within noise" even when the interval excludes 1: a within-run interval cannot see
#: what moves between two runs of one configuration (clock boost, neighbours, a warmer cache).
MIN_EFFECT_PCT = 2.0


def _no_speed(name: str, run: PerfSummary, mean: Optional[float]) -> Optional[str]:
    """Why a run's mean ms/iter cannot be a side of the headline, or None when it can."""
    if run.iteration_timer is None:
        return f"{name} has no iteration_timer section"
    if mean is None:
        return f"{name} has no measured iterations"
    measured = run.iteration_timer.measured_iterations
    if measured is None and run.schema_version >= 2:  # schema 1 has no such count; schema 2 always writes it
        return (f"{name} is a schema-{run.schema_version} summary without `iteration_timer.measured_iterations`:"
                f" its mean ms/iter ({mean!r}) has no count of iterations behind it and cannot decide")
    if measured is not None and measured < 1:
        return (f"{name} has 0 measured iterations behind its mean ms/iter ({mean!r}): a figure without the"
                " iterations behind it cannot decide")
    if not (0.0 < mean < math.inf):
        return f"{name}'s mean ms/iter is {mean!r}, not a positive finite time"
    return None


def headline(base: SummaryLike, candidate: SummaryLike, with_ci: bool = True,
             min_effect_pct: float = MIN_EFFECT_PCT) -> Dict[str, Any]:
    """The one speed change that `compare`, `report`, `matrix` and the plot all show for a pair of runs.

    Speed is wall-time throughput over the measured iterations: it/s = 1000 / mean ms/iter. When the runs process
    different samples per iteration (a batch size changed), iterations are not the same work and the headline is
    the samples/s ratio instead. The 95% CI is a batch-means interval of the ratio of mean ms/iter (batches of at
    least 8 consecutive iterations, so bursts of slow steps stay together; Student's t for few batches), scaled by the
    samples-per-iteration ratio where samples/s is the basis. ``speedup`` > 1 means the candidate is faster.
    ``significant`` needs both: the interval excludes 1 and the change is at least ``min_effect_pct``.

    A figure the headline needs that is missing, zero, negative or not finite, or a ratio that over- or underflows,
    gives ``speedup`` None and the ``reason``: a verdict acted on in CI fails closed rather than on ``nan``.
    """
    base, candidate = as_summary(base, "base"), as_summary(candidate, "candidate")
    b, c = speed(base), speed(candidate)
    out: Dict[str, Any] = {"speedup": None, "basis": "it/s", "ci95": None, "significant": None,
                           "typical_speedup": None, "reason": None}
    reasons = [r for r in (_no_speed("base", base, b["ms_per_iter_mean"]),
                           _no_speed("candidate", candidate, c["ms_per_iter_mean"])) if r]
    if reasons:
        out["reason"] = " and ".join(reasons)
        return out
    scale = 1.0
    spi_b, spi_c = b["samples_per_iter"], c["samples_per_iter"]
    if spi_b and spi_c and abs(spi_b - spi_c) > 0.01 * spi_b:
        out["basis"] = "samples/s"
        scale = ratio(spi_c, spi_b)
    speedup = ratio(b["ms_per_iter_mean"], c["ms_per_iter_mean"])
    speedup = finite(scale * speedup) if speedup is not None and scale is not None else None
    if not speedup or ratio(1.0, speedup) is None:
        out["reason"] = (f"the ratio of mean ms/iter ({b['ms_per_iter_mean']!r} / {c['ms_per_iter_mean']!r})"
                         " is no finite positive number")
        out["basis"] = "it/s"
        return out
    out["speedup"] = speedup
    typical = ratio(b["ms_per_iter_median"], c["ms_per_iter_median"])
    out["typical_speedup"] = finite(scale * typical) if typical is not None else None
    if with_ci:
        sb, sc = blocks(base), blocks(candidate)
        if sb is None or sc is None:
            out["reason"] = "no CI: a run has no iteration blocks (a schema 1 summary)"
        else:
            ci = batch_means_ratio_ci(sb, sc)
            if ci is None:
                out["reason"] = "no CI: a run has fewer than 32 measured iterations"
            elif finite(scale * ci[0]) is None or finite(scale * ci[1]) is None:
                out["reason"] = "no CI: the iteration blocks give no finite interval"
            else:
                out["ci95"] = [scale * ci[0], scale * ci[1]]
                excludes_one = out["ci95"][0] > 1.0 or out["ci95"][1] < 1.0
                out["significant"] = excludes_one and abs(out["speedup"] - 1.0) * 100.0 >= min_effect_pct
    return out


def _samples_scale(b: Dict[str, Any], c: Dict[str, Any]) -> float:
    """The candidate's samples per iteration over the base's where they differ (the headline's samples/s basis),
    else 1."""
    spi_b, spi_c = b["samples_per_iter"], c["samples_per_iter"]
    if spi_b and spi_c and abs(spi_b - spi_c) > 0.01 * spi_b:
        return spi_c / spi_b
    return 1.0


def memory_floor(field: str, base: float, candidate: float) -> float:
    """The documented noise floor, in MiB, of a memory figure with one run a side
    (:data:`lightning_perf.summary.memory_floor.FLOORS`, by the field's source)."""
    return floor_mib(FIELD_SOURCES.get(field, "allocator"), base, candidate)


def memory_changes(bases: Sequence[PerfSummary], candidates: Sequence[PerfSummary]) -> Dict[str, Dict[str, Any]]:
    """Each peak both sides measured: the figures (the mean over the runs of a side), the change and its noise
    floor: the larger spread (max - min) of the runs of a side where both sides have two runs or more (at least the
    floor's MiB of the figure's source), else :func:`memory_floor`. ``beyond_floor``: the change is larger than
    the floor (only then is it a change)."""
    from lightning_perf.summary.fields import MEMORY_FIELDS

    out: Dict[str, Dict[str, Any]] = {}
    for label, _, field in MEMORY_FIELDS:
        sides = [[memory(run)[label] for run in runs] for runs in (bases, candidates)]
        if sides[0][0] is None or sides[1][0] is None:
            continue
        known = [[v for v in side if finite(v) is not None] for side in sides]
        repeated = all(len(side) >= 2 for side in known)
        values = [sum(side) / len(side) if repeated else side[0] for side in known] if all(known) else \
            [sides[0][0], sides[1][0]]
        entry = _delta(*values)
        if entry["delta"] is None:
            continue
        if repeated:  # a few runs can agree by chance: never below the floor's MiB of the figure's source
            spread = max(max(side) - min(side) for side in known)
            least = FLOORS[FIELD_SOURCES.get(field, "allocator")][0]
            entry["floor_mb"], entry["floor_from"] = max(spread, least), "repeats"
        else:
            entry["floor_mb"], entry["floor_from"] = memory_floor(field, *values), "documented"
        entry["beyond_floor"] = abs(entry["delta"]) > entry["floor_mb"]
        out[label] = entry
    return out


def quality_not_checked(base: PerfSummary, candidate: PerfSummary, base_name: str = "base",
                        candidate_name: str = "candidate") -> Optional[str]:
    """Why the candidate's quality verdict cannot stand (its gate scored a different validation set than its
    baseline, or the two runs scored different numbers of images), else None."""
    gates = [(name, run.quality_gate) for name, run in ((base_name, base), (candidate_name, candidate))]
    for name, gate in gates:
        if gate is not None and gate.images_scored and gate.baseline_images \
                and gate.images_scored != gate.baseline_images:
            return (f"{name}'s gate scored {gate.images_scored} images against a baseline of {gate.baseline_images}:"
                    " different validation sets")
    scored = [gate.images_scored if gate is not None else None for _, gate in gates]
    if None not in scored and 0 not in scored and scored[0] != scored[1]:
        return f"the runs scored different validation sets ({scored[0]} vs {scored[1]} images)"
    return None


def between_runs_note(base: PerfSummary, candidate: PerfSummary) -> Optional[str]:
    """What the speedup's interval does not cover, in one line, when the two runs ran at different times: the
    interval is built from the variation within each run, and two runs of one setup also differ between them."""
    hosts = (base.run.host, candidate.run.host)
    starts = (base.run.started_at, candidate.run.started_at)
    if not all(isinstance(h, str) and h for h in hosts) or starts[0] == starts[1]:
        return None
    where = f"the same host ({hosts[0]})" if hosts[0] == hosts[1] else f"different hosts ({hosts[0]}, {hosts[1]})"
    return (f"both runs ran on {where} at different times: the CI covers the variation within each run, not the"
            " drift between two runs of one setup (other load, clocks, caches); run the baseline again beside the"
            " candidate to see that drift")


def run_speed(run: PerfSummary, basis: str) -> Optional[float]:
    """One run's speed on the headline's basis (it/s, or samples/s): from its mean ms/iter, None where unmeasured
    or where its mean could not be a side of the headline (:func:`_no_speed`)."""
    s = speed(run)
    if _no_speed("run", run, s["ms_per_iter_mean"]) is not None:
        return None
    per_s = ratio(1000.0, s["ms_per_iter_mean"])
    if per_s is None or basis != "samples/s":
        return per_s
    return finite(per_s * s["samples_per_iter"]) if s["samples_per_iter"] else None


def repeats_headline(bases: Sequence[PerfSummary], candidates: Sequence[PerfSummary], basis: str,
                     min_effect_pct: float = MIN_EFFECT_PCT) -> Dict[str, Any]:
    """The speedup between two setups each run two or more times: the ratio of the geometric means of the runs'
    speeds and its 95% interval from the spread between runs (:func:`between_runs_ratio_ci`), so that the drift
    between runs (other load, clocks, caches) is inside the interval. ``significant``: the interval excludes 1 and
    the change is at least ``min_effect_pct``. ``speedup`` None, with the ``reason``, where a side has fewer than
    two runs with a speed."""
    out: Dict[str, Any] = {"speedup": None, "ci95": None, "significant": None, "reason": None,
                           "runs": {"base": len(bases), "candidate": len(candidates)}}
    speeds = {side: [run_speed(run, basis) for run in runs] for side, runs in (("base", bases),
                                                                              ("candidate", candidates))}
    missing = [f"{side} repeat {i + 1} has no speed" for side, values in speeds.items()
               for i, v in enumerate(values) if v is None]
    if missing:
        out["reason"] = "no between-run interval: " + ", ".join(missing)
        return out
    found = between_runs_ratio_ci(speeds["candidate"], speeds["base"])
    if found is None:
        out["reason"] = "no between-run interval: each side needs two runs or more"
        return out
    if any(ratio(v, 1.0) is None for v in found):  # geometric means 1e450 apart: inf, or 0
        out["reason"] = "no between-run interval: the runs' speeds are too far apart for a finite ratio"
        return out
    out["speedup"], lo, hi = found
    out["ci95"] = [lo, hi]
    out["significant"] = (lo > 1.0 or hi < 1.0) and abs(out["speedup"] - 1.0) * 100.0 >= min_effect_pct
    return out


def contention_notes(runs: Sequence[tuple]) -> List[str]:
    """A note per run measured under contention, and one where the runs saw different contention: the difference
    between them may be the machine's (``runs``: (name, summary) pairs)."""
    seen = [(name, contention(run)) for name, run in runs]
    notes = [f"{name} was measured on a busy machine ({'; '.join(c['causes'])}): its speed may be the machine's"
             for name, c in seen if c["contended"]]
    if notes and any(c["contended"] is False for _, c in seen):
        quiet = ", ".join(name for name, c in seen if c["contended"] is False)
        notes.append(f"the runs saw different contention ({quiet} quiet): the difference between them may be the"
                     " machine, not the change")
    return notes


def labelled_runs(base_runs: Sequence[PerfSummary], candidate_runs: Sequence[PerfSummary], base_name: str = "base",
                  candidate_name: str = "candidate") -> List[tuple]:
    """(name, run) of every run of both sides: ``base``, ``base repeat 2``, ..., then the candidate's."""
    return [(name if i == 0 else f"{name} repeat {i + 1}", run)
            for name, runs in ((base_name, base_runs), (candidate_name, candidate_runs)) for i, run in enumerate(runs)]


def distinct_runs(sides: Dict[str, List[tuple]]) -> tuple:
    """Each side's runs with a run given twice (the same file, or a copy of it under another name) kept once, and a
    note per run dropped. ``sides``: ``base`` and ``candidate``, each a list of (path, option, summary), the first
    run first; the option names where the path was given (``BASE``, ``--base-repeats``). A second copy of a run
    would count as a run of its own, and two runs with no spread between them narrow the between-run interval.
    With repeats, a run on both sides is refused (:class:`SummaryError`): one run cannot measure both setups."""
    kept: Dict[str, List[tuple]] = {side: [] for side in sides}
    notes: List[str] = []
    for side, runs in sides.items():
        for path, option, run in runs:
            twin = next((k for k in kept[side] if k[2] == run), None)
            if twin is None:
                kept[side].append((path, option, run))
            else:
                notes.append(f"{path} is the same run as {twin[0]} (the same summary, given as {option} and as"
                             f" {twin[1]}): counted once")
    if len(kept.get("base", ())) + len(kept.get("candidate", ())) > 2:
        for path, option, run in kept.get("base", ()):
            twin = next((k for k in kept.get("candidate", ()) if k[2] == run), None)
            if twin is not None:
                raise SummaryError(f"{path} ({option}) and {twin[0]} ({twin[1]}) are the same run, given on both"
                                   " sides: a run measures one setup; pass each run on its own side only")
    return kept, notes


def compare_summaries(
    base: SummaryLike,
    candidate: SummaryLike,
    iterations: int = 30000,
    base_name: str = "base",
    candidate_name: str = "candidate",
    min_effect_pct: float = MIN_EFFECT_PCT,
    base_repeats: Sequence[SummaryLike] = (),
    candidate_repeats: Sequence[SummaryLike] = (),
    shared_cores: bool = False,
) -> Dict[str, Any]:
    """The comparison as a dict (what ``--format json`` prints). ``speedup`` is the :func:`headline` of the two
    runs, where each side is one run: its interval is within each run, and ``speedup_significant`` is None (the drift
    between runs was not measured; ``speedup_beyond_within_run_noise`` says whether the change is beyond the noise
    inside the runs). With ``base_repeats`` and ``candidate_repeats`` (more runs of the same two setups), the speedup,
    its interval and ``speedup_significant`` are :func:`repeats_headline`'s, between runs; the other figures are the
    first pair's, and every run that did not complete, repeats included, gets a note. ``samples_per_iter_unknown``:
    the run whose samples per iteration are unknown where the other's are known (the basis is then it/s, and a
    change of batch size would not show), else empty. ``comparison``: the verdict once decided
    (:class:`~lightning_perf.summary.comparison.Comparison`), from which every line derived from the speed (Typical,
    the time to N iterations, break-even, the section that moved most) is said. ``time_saved_s`` is like for like:
    where batch sizes differ, the base's time for the samples of the candidate's N iterations. ``shared_cores``
    (``race --together``): the runs shared their cores by design, so one note says so in place of a note per run
    that waited for a CPU."""
    base, candidate = as_summary(base, base_name), as_summary(candidate, candidate_name)
    base_runs = [base] + [as_summary(r, f"{base_name} repeat {i + 2}") for i, r in enumerate(base_repeats)]
    candidate_runs = [candidate] + [as_summary(r, f"{candidate_name} repeat {i + 2}")
                                    for i, r in enumerate(candidate_repeats)]
    b, c = speed(base), speed(candidate)
    notes: List[str] = []
    for name, run in labelled_runs(base_runs, candidate_runs, base_name, candidate_name):
        if run.status != "completed":
            notes.append(f"{name} run status is {run.status!r}: its figures cover only part of a run")
    devices = (base.run.device, candidate.run.device)
    if devices[0] != devices[1]:
        notes.append(f"runs used different devices ({devices[0]} vs {devices[1]}): speed is not comparable")
    boundaries = tuple(run.section_profiler.data_loading_boundary if run.section_profiler is not None else None
                       for run in (base, candidate))
    if None not in boundaries and boundaries[0] != boundaries[1]:
        notes.append(f"data_loading was timed at different boundaries ({base_name}: {boundaries[0]},"
                     f" {candidate_name}: {boundaries[1]}; SectionProfiler's data_loading_boundary): `fetch` is the"
                     " loop's wait for the batch, `batch_gap` also holds the loop's work between batches"
                     " (`between_batches` under `fetch`), so those two sections are not like for like")
    models = (base.run.model_class, candidate.run.model_class)
    if None not in models and models[0] != models[1]:
        notes.append(f"runs trained different models ({models[0]} vs {models[1]}): an iteration is not the same work"
                     " unless that was the change")
    head = headline(base, candidate, min_effect_pct=min_effect_pct)
    repeated = len(base_runs) > 1 or len(candidate_runs) > 1
    within = {"ci95": head["ci95"], "beyond_noise": head["significant"]}
    if repeated and head["speedup"] is not None:
        head = dict(head, **{k: v for k, v in repeats_headline(base_runs, candidate_runs, head["basis"],
                                                               min_effect_pct).items() if k != "runs"})
    elif not repeated:
        head["significant"] = None  # one run a side: the drift between runs is not in the interval
    speedup = head["speedup"]
    between = between_runs_note(base, candidate) if head["ci95"] and not repeated else None
    if speedup is None:
        notes.append(f"speedup unavailable: {head['reason']}")
    elif head["reason"]:
        notes.append(head["reason"])
    if shared_cores:  # race --together: every run waited for cores it shared by design, alike
        notes.append("the runs of a round ran at the same time on the same cores (race --together): each waited for"
                     " a CPU by design, and its it/s are of shared cores; only the ratios compare")
    else:
        notes += contention_notes([(f"{base_name}{f' repeat {i + 1}' if len(base_runs) > 1 else ''}", run)
                                   for i, run in enumerate(base_runs)]
                                  + [(f"{candidate_name}{f' repeat {i + 1}' if len(candidate_runs) > 1 else ''}",
                                      run) for i, run in enumerate(candidate_runs)])
    if head["basis"] == "samples/s":
        notes.append(
            f"the runs process different samples per iteration ({fixed(b['samples_per_iter'], '.1f')} vs"
            f" {fixed(c['samples_per_iter'], '.1f')}): the speedup is the samples/s ratio; it/s and time to N"
            " iterations are not like for like"
        )
    # one side's samples unknown: it/s is the only basis, and a change of batch size would not show in it
    samples_unknown = [name for name, run, other in ((base_name, b, c), (candidate_name, c, b))
                       if not run["samples_per_iter"] and other["samples_per_iter"]]
    if samples_unknown and speedup is not None:
        notes.append(f"the speedup's basis is it/s because samples per iteration are unknown for {samples_unknown[0]}"
                     " (known for the other run): were the batch sizes different, it/s would not be like for like")
    sample_speedup = ratio(c["samples_per_s"], b["samples_per_s"])

    def timer_dict(run: PerfSummary) -> Dict[str, Any]:
        """What the projection reads, field by field: a dump would walk unknown (maybe very deep) extra fields."""
        timer = run.iteration_timer
        if timer is None:
            return {}
        stats = timer.ms_per_iter
        return {"ms_per_iter": {"mean": stats.mean} if stats is not None else None,
                "warmup_time_s": timer.warmup_time_s, "excluded": dict(timer.excluded or {}), "fits": timer.fits,
                "validation_runs": timer.validation_runs, "iterations": timer.iterations,
                "eval_time_s": timer.eval_time_s}

    times = {key: project_time(timer_dict(run), iterations) for key, run in (("base", base), ("candidate", candidate))}
    # like for like: where batch sizes differ, the base's time for the samples of the candidate's N iterations
    like = _samples_scale(b, c) if head["basis"] == "samples/s" else 1.0
    like_n = finite(iterations * like)  # batch sizes 1e305 apart give no finite count: no like-for-like time
    base_like = (times["base"] if like == 1.0 else {"train_s": None, "with_eval_s": None} if like_n is None
                 else project_time(timer_dict(base), max(0, round(like_n))))

    def saved(field: str) -> Dict[str, Optional[float]]:
        t_b, t_c = finite(times["base"][field]), finite(times["candidate"][field])
        t_like = finite(base_like[field])
        s = None if t_like is None or t_c is None else finite(t_like - t_c)
        pct = None if s is None or not t_like else finite(100.0 * s / t_like)
        return {"base": t_b, "candidate": t_c, "saved_s": s, "saved_pct": pct}

    train_times, eval_times = saved("train_s"), saved("with_eval_s")
    steady = {"base": finite(iterations * like * b["ms_per_iter_mean"] / 1000.0)
              if b["ms_per_iter_mean"] is not None else None,
              "candidate": finite(iterations * c["ms_per_iter_mean"] / 1000.0)
              if c["ms_per_iter_mean"] is not None else None}
    mem = memory_changes(base_runs, candidate_runs)
    q_b, q_c = quality(base), quality(candidate)
    unchecked = quality_not_checked(base, candidate, base_name, candidate_name)
    qual = {}
    for name in q_b:
        if name in q_c:
            entry = _delta(q_b[name].value, q_c[name].value)
            entry["mode"] = q_c[name].mode or IMAGE_METRIC_DIRECTIONS.get(name)
            entry["candidate_passed"] = None if unchecked else q_c[name].passed
            entry["not_checked"] = unchecked
            qual[name] = entry
    result = {
        "diagnosis": diagnoses(base, candidate, base_name, candidate_name),
        "base": {"name": base_name, "status": base.status, "device": devices[0], **b},
        "candidate": {"name": candidate_name, "status": candidate.status, "device": devices[1], **c},
        "speedup": speedup,
        "speedup_basis": head["basis"],
        "speedup_ci95": head["ci95"],
        "speedup_significant": head["significant"],
        "speedup_interval": "between runs" if repeated else "within runs",
        "repeats": {"base": len(base_runs), "candidate": len(candidate_runs)},
        "speedup_within_runs_ci95": within["ci95"],
        "speedup_beyond_within_run_noise": within["beyond_noise"],
        "min_effect_pct": min_effect_pct,
        "between_runs": between,
        "change_pct": None if speedup is None else 100.0 * (speedup - 1.0),
        "typical_iteration_speedup": head["typical_speedup"],
        "samples_per_s_speedup": sample_speedup,
        "samples_per_iter_unknown": samples_unknown,
        "candidate_slower_pct": None if not speedup else 100.0 * (1.0 / speedup - 1.0),
        "iterations": iterations,
        "time_to_iterations_s": {"base": train_times["base"], "candidate": train_times["candidate"]},
        "time_saved_s": train_times["saved_s"],
        "time_saved_pct": train_times["saved_pct"],
        "time_to_iterations_with_eval_s": {"base": eval_times["base"], "candidate": eval_times["candidate"]},
        "time_saved_with_eval_s": eval_times["saved_s"],
        "time_saved_samples_scale": like,
        "steady_time_s": steady,
        "memory_mb": mem,
        "energy": energy_change(base, candidate),
        "quality": qual,
        "trials": trial_results((base, candidate), (base_name, candidate_name)),
        "quality_gate_passed": {
            "base": base.quality_gate.passed if base.quality_gate is not None else None,
            "candidate": candidate.quality_gate.passed if candidate.quality_gate is not None else None,
        },
        "tail": {"base": tail_text(base), "candidate": tail_text(candidate)},
        "stragglers": {"base": recorded_or_computed_straggler(base),
                       "candidate": recorded_or_computed_straggler(candidate),
                       "text": {"base": straggler_text(base), "candidate": straggler_text(candidate)}},
        "sections": section_changes(base, candidate, base_runs, candidate_runs, min_effect_pct),
        "break_even": break_even(base, candidate),
        "notes": notes,
    }
    result["comparison"] = Comparison.of(result).as_dict()
    return result


def diagnoses(base: PerfSummary, candidate: PerfSummary, base_name: str, candidate_name: str) -> Dict[str, Any]:
    """compare's first line: the candidate's primary diagnosis, and the baseline's where its verdict differs (each
    run's recorded one, or the one its figures give for a file from before diagnoses)."""
    cand, old = recorded_or_computed(candidate), recorded_or_computed(base)
    differs = old.get("verdict") != cand.get("verdict")
    lines = [diagnosis_line(cand, candidate_name),
             diagnosis_line(old, base_name) if differs else f"{base_name}: the same verdict"]
    return {"candidate": cand, "base": old, "differs": differs, "line": " | ".join(lines), "lines": lines}


#: The width compare's text wraps its diagnoses to: each run's on lines of its own, not one line of 600 characters.
TEXT_WIDTH = 100


def _diagnosis_text(result: Dict[str, Any]) -> List[str]:
    """Each run's diagnosis from its own line, wrapped at :data:`TEXT_WIDTH` with the continuation indented."""
    import textwrap

    diagnosis = result["diagnosis"]
    lines = diagnosis.get("lines") or [diagnosis["line"]]
    return [wrapped for line in lines
            for wrapped in textwrap.wrap(line, width=TEXT_WIDTH, subsequent_indent="    ", break_long_words=False,
                                         break_on_hyphens=False) or [line]]


def _section_ms(run: PerfSummary) -> Dict[str, Dict[str, Optional[float]]]:
    """SectionProfiler's sections of a run: name -> ms per measured iteration (total / iterations) and share."""
    profiler = run.section_profiler
    if profiler is None or not profiler.sections:
        return {}
    iterations = profiler.iterations
    out = {}
    for name, sec in profiler.sections.items():
        per_iter = (finite(1000.0 * sec.total_s / iterations) if sec is not None and sec.total_s is not None
                    and iterations else None)
        out[name] = {"ms_per_iter": per_iter, "share_pct": sec.share_pct if sec is not None else None,
                     "se_ms": _section_se_ms(sec, iterations)}
    return out


def _section_se_ms(sec: Any, iterations: Optional[int]) -> Optional[float]:
    """A rough standard error of a section's ms per iteration: its calls' p50-p95 spread read as 1.645 standard
    deviations, over the square root of its calls, times its calls per iteration. None where a figure is missing."""
    if sec is None or None in (sec.p50_ms, sec.p95_ms) or not sec.count or not iterations:
        return None
    return finite(max(0.0, sec.p95_ms - sec.p50_ms) / 1.645 / math.sqrt(sec.count) * sec.count / iterations)


def section_changes(base: PerfSummary, candidate: PerfSummary, base_runs: Sequence[PerfSummary] = (),
                    candidate_runs: Sequence[PerfSummary] = (),
                    min_effect_pct: float = MIN_EFFECT_PCT) -> Optional[Dict[str, Any]]:
    """The section breakdown side by side, so a speed change can be traced to the section that moved: per section
    (the base's order, then the candidate's new ones) ms per measured iteration and share of iteration time in each
    run and the change, its noise floor (``noise_ms``: :func:`~lightning_perf.summary.comparison.section_noise_ms`)
    and whether the change is past it (``beyond_noise``); ``moved_most``: of the sections past their noise, the one
    whose ms per iteration changed most; ``iteration_delta_ms``: the change of SectionProfiler's mean iteration.
    None unless both runs have a section table."""
    b, c = _section_ms(base), _section_ms(candidate)
    if not b or not c:
        return None
    repeats = [[_section_ms(run) for run in runs] for runs in (base_runs, candidate_runs)]
    rows = []
    for name in list(b) + [n for n in c if n not in b]:
        d = _delta((b.get(name) or {}).get("ms_per_iter"), (c.get(name) or {}).get("ms_per_iter"))
        row = {"name": name, "base_ms_per_iter": d["base"], "candidate_ms_per_iter": d["candidate"],
               "base_share_pct": (b.get(name) or {}).get("share_pct"),
               "candidate_share_pct": (c.get(name) or {}).get("share_pct"),
               "delta_ms": d["delta"], "delta_pct": d["delta_pct"], "min_effect_pct": min_effect_pct,
               "base_se_ms": (b.get(name) or {}).get("se_ms"), "candidate_se_ms": (c.get(name) or {}).get("se_ms")}
        sides = [[v for v in ((t.get(name) or {}).get("ms_per_iter") for t in side) if finite(v) is not None]
                 for side in repeats]
        if all(len(side) >= 2 for side in sides):
            row["repeats_spread_ms"] = max(max(side) - min(side) for side in sides)
        row["noise_ms"] = section_noise_ms(row)
        row["beyond_noise"] = (d["delta"] is not None and row["noise_ms"] is not None
                               and abs(d["delta"]) > row["noise_ms"])
        rows.append(row)
    moved = [r for r in rows if r["beyond_noise"]]
    means = [run.section_profiler.iteration_ms.mean if run.section_profiler.iteration_ms is not None else None
             for run in (base, candidate)]
    return {"rows": rows,
            "moved_most": max(moved, key=lambda r: abs(r["delta_ms"]))["name"] if moved else None,
            "iteration_delta_ms": _delta(*means)["delta"]}


def _moved_text(sections: Dict[str, Any], comparison: Optional[Comparison] = None) -> Optional[str]:
    """The section behind the speed change: named only where the speed verdict is decided and the section's change
    is past its noise."""
    row = next((r for r in sections["rows"] if r["name"] == sections["moved_most"]), None)
    if row is None:
        return "no section past its noise" if any(r["delta_ms"] is not None for r in sections["rows"]) else None
    if comparison is not None and not comparison.sections_decided():
        past = [r["name"] for r in sections["rows"] if r["beyond_noise"]]
        return (f"{NOT_DECIDED}: the speed verdict decides no direction (past their noise within these runs:"
                f" {', '.join(past)})")
    whole = sections["iteration_delta_ms"]
    return (f"{row['name']}, {fixed(row['delta_ms'], '+.2f')} ms/iter ({fmt_pct(row['delta_pct'])})"
            + (f"; the whole iteration {fixed(whole, '+.2f')} ms" if whole is not None else ""))


def _section_change(r: Dict[str, Any], decided: bool = True) -> str:
    """A section's change: the signed figure past its noise (marked ``not decided`` where the speed verdict is not),
    else ``within noise (±0.12 ms)``."""
    if r["delta_ms"] is None:
        return "n/a"
    if not r.get("beyond_noise", True):
        return f"within noise (\u00b1{fixed(r['noise_ms'], '.2f')} ms)"
    return f"{fixed(r['delta_ms'], '+.2f')} ms ({fmt_pct(r['delta_pct'])}{'' if decided else f', {NOT_DECIDED}'})"


def _sections_text(result: Dict[str, Any]) -> List[str]:
    """compare's text: the section table (SectionProfiler's, both runs), or nothing where a run has none."""
    sections = result.get("sections")
    if not sections:
        return []
    names = [r["name"] for r in sections["rows"]]
    w = max(len("section"), *(len(n) for n in names)) + 2

    def cell(ms: Optional[float], share: Optional[float]) -> str:
        return "n/a" if ms is None else f"{fixed(ms, '.2f')} ({fmt_num(share, 1, '%')})"

    b, c = result["base"]["name"], result["candidate"]["name"]
    col = max(18, len(b) + 2, len(c) + 2)
    lines = ["", "Sections (SectionProfiler: ms per measured iteration, share of iteration time):",
             f"  {'section':<{w}}{b:<{col}}{c:<{col}}change"]
    decided = Comparison.of(result).sections_decided()
    for r in sections["rows"]:
        change = _section_change(r, decided)
        lines.append(f"  {r['name']:<{w}}{cell(r['base_ms_per_iter'], r['base_share_pct']):<{col}}"
                     f"{cell(r['candidate_ms_per_iter'], r['candidate_share_pct']):<{col}}{change}")
    moved = _moved_text(sections, Comparison.of(result))
    if moved:
        lines.append(f"  Moved most: {moved}")
    return lines


def _straggler_text(result: Dict[str, Any], width: int) -> List[str]:
    """compare's text: each run's straggler under DDP (docs/diagnosis.md#stragglers), where either run has one."""
    stragglers = result.get("stragglers") or {}
    if not (stragglers.get("base") or stragglers.get("candidate")):
        return []
    return ["", "Stragglers (DDP: the rank the others wait for):"] + [
        f"  {run['name'] + ':':<{width}}{stragglers['text'][key] or 'n/a (one device)'}"
        for run, key in ((result["base"], "base"), (result["candidate"], "candidate"))]


def _sections_markdown(result: Dict[str, Any]) -> List[str]:
    sections = result.get("sections")
    if not sections:
        return []
    b, c = result["base"]["name"], result["candidate"]["name"]
    decided = Comparison.of(result).sections_decided()
    rows = [[r["name"], fmt_num(r["base_ms_per_iter"]), fmt_num(r["base_share_pct"], 1, "%"),
             fmt_num(r["candidate_ms_per_iter"]), fmt_num(r["candidate_share_pct"], 1, "%"),
             *(["n/a", "n/a"] if r["delta_ms"] is None else
               [f"{fixed(r['delta_ms'], '+.2f')}", fmt_pct(r["delta_pct"]) + ("" if decided else f" ({NOT_DECIDED})")]
               if r.get("beyond_noise", True) else [_section_change(r), ""])]
            for r in sections["rows"]]
    moved = _moved_text(sections, Comparison.of(result))
    table = markdown_table(["section", f"{b} ms/iter", f"{b} share", f"{c} ms/iter", f"{c} share", "change ms/iter",
                            "change"], rows)
    return ["", table] + (["", f"**Moved most:** {moved}."] if moved else [])


def warmup_section(run: PerfSummary) -> Dict[str, Any]:
    """The iteration_timer figures the warm-up cost and the end-to-end time read, as the projection's dict."""
    timer = run.iteration_timer
    if timer is None:
        return {}
    return {"ms_per_iter": {"mean": timer.ms_per_iter.mean} if timer.ms_per_iter is not None else None,
            "startup_time_s": timer.startup_time_s, "warmup_time_s": timer.warmup_time_s,
            "excluded": dict(timer.excluded or {}), "fits": timer.fits, "iterations": timer.iterations,
            "validation_runs": timer.validation_runs, "eval_time_s": timer.eval_time_s}


def break_even(base: SummaryLike, candidate: SummaryLike) -> Dict[str, Any]:
    """When a candidate pays more warm-up than the base (fit start to first measured iteration, beyond its steady
    pace: :func:`~lightning_perf.summary.projection.warmup_cost`) but is faster per iteration, the iteration count
    from which its whole training is shorter: extra warm-up seconds / seconds saved per iteration, rounded up.

    ``verdict``: ``pays_back`` (``iterations`` and ``seconds``: the candidate's training time to get there, its
    warm-up included, which equals the base's), ``never`` (not faster per iteration and no less warm-up),
    ``no_warmup_cost`` (no more warm-up and not slower per iteration: ahead from the start), ``ahead_until`` (less
    warm-up but slower per iteration: ahead for the first ``iterations`` only), or None with the ``reason`` when a
    figure is missing or not finite. Iterations are the candidate's; where the runs process different samples per
    iteration, the base's time per iteration is scaled to the candidate's samples (the headline's samples/s basis).
    Evaluation is left out: it is its own figure.
    """
    base, candidate = as_summary(base, "base"), as_summary(candidate, "candidate")
    out: Dict[str, Any] = {"verdict": None, "iterations": None, "seconds": None,
                           "warmup_cost_s": {"base": None, "candidate": None}, "extra_warmup_s": None,
                           "saving_ms_per_iter": None, "basis": "it/s", "reason": None}
    reasons = []
    for key, run in (("base", base), ("candidate", candidate)):
        cost, why = warmup_cost(warmup_section(run))
        out["warmup_cost_s"][key] = cost
        if cost is None:
            reasons.append(f"the {key}'s warm-up cost is unknown: {why}")
    if reasons:
        out["reason"] = "; ".join(reasons)
        return out
    b, c = speed(base), speed(candidate)
    scale, spi_b, spi_c = 1.0, b["samples_per_iter"], c["samples_per_iter"]
    if spi_b and spi_c and abs(spi_b - spi_c) > 0.01 * spi_b:  # as the headline: the base's time for the same samples
        scale, out["basis"] = spi_c / spi_b, "samples/s"
    saving = finite(b["ms_per_iter_mean"] * scale - c["ms_per_iter_mean"])
    extra = finite(out["warmup_cost_s"]["candidate"] - out["warmup_cost_s"]["base"])
    if saving is None or extra is None:
        out["reason"] = "the mean ms/iter or the warm-up costs give no finite difference"
        return out
    out["saving_ms_per_iter"], out["extra_warmup_s"] = saving, extra
    if extra <= 0 and saving >= 0:
        out["verdict"] = "no_warmup_cost"
    elif extra >= 0 and saving <= 0:
        out["verdict"] = "never"
    else:  # one side is ahead until the other's per-iteration pace catches up
        crossing = finite(extra / (saving / 1000.0))
        if crossing is None or crossing > 1e15:
            out["reason"] = "the per-iteration difference is too small for a finite break-even"
            return out
        out["verdict"] = "pays_back" if extra > 0 else "ahead_until"
        out["iterations"] = max(1, math.ceil(crossing))
        out["seconds"] = (out["warmup_cost_s"]["candidate"]
                          + out["iterations"] * c["ms_per_iter_mean"] / 1000.0)
    return out


def _warmup_lines(result: Dict[str, Any], width: int) -> List[str]:
    be = result.get("break_even")
    if not be:
        return []
    decided = Comparison.of(result)
    costs = be["warmup_cost_s"]
    names = (result["base"]["name"], result["candidate"]["name"])
    cost_text = ("n/a" if None in costs.values() else
                 f"{names[0]} {fixed(costs['base'], '.2f')} s, {names[1]} {fixed(costs['candidate'], '.2f')} s"
                 " (fit start to the first"
                 " measured iteration, beyond the steady pace)")
    return [f"  {'Warm-up:':<{width}}{cost_text}", f"  {'Break-even:':<{width}}{decided.break_even_text(be)}"]


def tail_text(run: PerfSummary) -> Optional[str]:
    """The run's slow iterations in one line (IterationTimer's ``tail`` block), or None where it has none."""
    tail = run.iteration_timer.tail if run.iteration_timer is not None else None
    if tail is None or None in (tail.share_pct, tail.iterations, tail.factor, tail.median_ms):
        return None
    causes = ", ".join(f"{name} {cause.iterations}" for name, cause in (tail.by_cause or {}).items()
                       if cause is not None and cause.iterations)
    return (f"{fixed(tail.share_pct, '.1f')}% of training time in {counted(tail.iterations, 'iteration')} over"
            f" {tail.factor:g}x the median ({fixed(tail.median_ms, '.2f')} ms)" + (f": {causes}" if causes else ""))


def _compute_text(run: Dict[str, Any]) -> str:
    if run["tflops_per_s"] is None:
        return "n/a"
    mfu = "n/a" if run["mfu_pct"] is None else f"{fixed(run['mfu_pct'], '.1f')}%"
    return f"{fmt_num(run['tflops_per_s'], 3)} TFLOP/s, MFU {mfu}"


def _speed_line(run: Dict[str, Any]) -> str:
    return (
        f"{fmt_num(run['ms_per_iter_mean'])} ms/iter mean ({fmt_num(run['it_per_s'])} it/s),"
        f" {fmt_num(run['samples_per_s'], 1)} samples/s"
    )


def _spread_line(run: Dict[str, Any]) -> str:
    return (
        f"min {fmt_num(run['ms_per_iter_min'])}, median {fmt_num(run['ms_per_iter_median'])},"
        f" mean {fmt_num(run['ms_per_iter_mean'])}, p95 {fmt_num(run['ms_per_iter_p95'])},"
        f" p99 {fmt_num(run['ms_per_iter_p99'])}, max {fmt_num(run['ms_per_iter_max'])} ms"
    )


def ratio_words(speedup: float, digits: int = 2) -> str:
    """A speed ratio as words: ``1.58x faster``, ``7.20x slower`` (never ``0.14x``), ``the same speed``."""
    if round(speedup, digits) == 1.0 and round(1.0 / speedup, digits) == 1.0:
        return "the same speed" if speedup == 1.0 else f"1.{'0' * digits}x {'faster' if speedup > 1 else 'slower'}"
    return (f"{fixed(speedup, f'.{digits}f')}x faster" if speedup > 1.0
            else f"{fixed(1.0 / speedup, f'.{digits}f')}x slower")


def _ci_words(lo: float, hi: float) -> str:
    """The interval in the headline's words: ``1.551x to 1.612x faster``, ``6.90x to 7.50x slower``, or each bound
    with its own word where it holds 1 (``1.03x slower to 1.01x faster``)."""
    if lo >= 1.0:
        return f"{fixed(lo, '.3f')}x to {fixed(hi, '.3f')}x faster"
    if hi <= 1.0:
        return f"{fixed(1.0 / hi, '.3f')}x to {fixed(1.0 / lo, '.3f')}x slower"
    return f"{ratio_words(lo, 3)} to {ratio_words(hi, 3)}"


def speed_label(result: Dict[str, Any]) -> str:
    """``Slowdown`` where the candidate is decided slower, ``Speedup`` where decided faster, else ``Speed ratio``."""
    direction = Comparison.of(result).direction
    return {"faster": "Speedup", "slower": "Slowdown"}.get(direction or "", "Speed ratio")


def _speedup_text(result: Dict[str, Any]) -> str:
    """The headline: the ratio with its direction word where the verdict is decided, else candidate/base speed with
    its interval (no direction: nothing decided one)."""
    if result["speedup"] is None:
        return "n/a"
    decided = Comparison.of(result).direction is not None
    ratio_text = (ratio_words(result["speedup"]) if decided else
                  f"candidate/base speed {fixed(result['speedup'], '.3f')}")
    text = f"{ratio_text} ({fmt_pct(result['change_pct'])} {result['speedup_basis']})"
    if not result["speedup_ci95"]:
        return text + ("" if decided else f", {NOT_DECIDED}: no interval")
    lo, hi = result["speedup_ci95"]
    ci_words = _ci_words(lo, hi) if decided else f"{fixed(lo, '.3f')} to {fixed(hi, '.3f')}"
    excludes_one = lo > 1.0 or hi < 1.0
    small = f"within noise: below the {result['min_effect_pct']:g}% a second run of the same setup can move"
    if result.get("speedup_interval") == "between runs":
        runs = result["repeats"]
        verdict = result.get("speedup_verdict_words") or (  # race: its own verdict's words
            "significant" if result["speedup_significant"] else small if excludes_one
            else "not significant: within noise")
        return text + f", 95% CI {ci_words} between {runs['base']} + {runs['candidate']} runs, {verdict}"
    inside = ("the change is past it" if result.get("speedup_beyond_within_run_noise")
              else small if excludes_one else "the change is inside it")
    return (text + f", 95% CI {ci_words} within each run ({inside}); no verdict: the drift between runs was"
            " not measured (one run a side): run each side again and pass the runs with --base-repeats and"
            " --candidate-repeats")


def time_saved_words(result: Dict[str, Any], duration=fmt_duration) -> tuple:
    """(label, text) of the time to N iterations (like for like: the same samples where batch sizes differ): where
    the speed is decided ``Time saved``, ``6.2 min (86.1%)``, or ``Time lost``, ``amp takes 6.2 min longer
    (+620.0%)``, never a negative saving; where it is not, ``Time change`` and the range the interval allows
    (:meth:`~lightning_perf.summary.comparison.Comparison.time_saved`)."""
    label, text = Comparison.of(result).time_saved(result, duration)
    if result.get("time_saved_samples_scale", 1.0) != 1.0 and text != "n/a":
        text += " (for the same samples: the batch sizes differ)"
    return label, text


#: Memory from this many MiB on is said in GiB: below, MiB keeps a change of one MiB visible (the summary's `_mb`
#: figures are MiB).
GB_FROM_MB = 10 * 1024.0


def _memory_unit(largest: float) -> tuple:
    """(MiB per unit, unit, decimals) for figures up to ``largest`` MiB."""
    if largest >= GB_FROM_MB:
        return 1024.0, "GiB", 2
    return 1.0, "MiB", 0 if largest >= 100 else 1


def memory_texts(base: Optional[float], candidate: Optional[float]) -> tuple:
    """(base, candidate, change) in MiB or GiB, one unit for the three, chosen by the larger figure: ``1039 MiB``,
    ``1039 MiB``, ``+0 MiB`` for 1039.32 -> 1039.41 (never ``1.01 GiB -> 1.02 GiB`` for a change of 0.09 MiB). Decimals
    are added (up to three) where the rounded figures differ and the rounded change is none, or the reverse. A figure
    that is not known is ``n/a``, and so is the change."""
    known = [abs(v) for v in (base, candidate) if finite(v) is not None]
    if not known:
        return "n/a", "n/a", "n/a"
    scale, unit, digits = _memory_unit(max(known))
    if finite(base) is None or finite(candidate) is None:
        return tuple(f"{fixed(v / scale, f'.{digits}f')} {unit}" if finite(v) is not None else "n/a"
                     for v in (base, candidate)) + ("n/a",)
    for places in range(digits, digits + 4):
        b, c, d = (round(v / scale, places) or 0.0 for v in (base, candidate, candidate - base))  # never "-0"
        if (b == c) == (d == 0):  # a change shown where the change rounds to none, or the reverse: more decimals
            break
    return tuple(f"{fixed(v, f'{sign}.{places}f')} {unit}" for v, sign in ((b, ""), (c, ""), (d, "+")))


def memory_change_text(d: Dict[str, Any]) -> str:
    """A memory change past its floor (``+12 MiB, +3.1%``), else ``same within the noise floor (±32 MiB)``."""
    if d.get("beyond_floor") is False:
        return f"same within the noise floor (\u00b1{_mib(d['floor_mb'])})"
    _, _, change = memory_texts(d["base"], d["candidate"])
    return f"{change}, {fmt_pct(d['delta_pct'])}"


def _mib(value: float) -> str:
    scale, unit, digits = _memory_unit(abs(value))
    return f"{fixed(value / scale, f'.{digits}f')} {unit}"


def quality_verdict_text(d: Dict[str, Any]) -> str:
    """The candidate's gate verdict for a metric: ``passed``, ``FAILED``, ``not checked: <why>`` or nothing."""
    if d.get("not_checked"):
        return f"not checked: {d['not_checked']}"
    return {True: "passed", False: "FAILED", None: ""}[d["candidate_passed"]]


def format_text(result: Dict[str, Any]) -> str:
    b, c = result["base"], result["candidate"]
    n = result["iterations"]
    width = max(len(b["name"]), len(c["name"]), len("Time change")) + 2
    typical = Comparison.of(result).typical_text(result["typical_iteration_speedup"])
    saved_label, saved_text = time_saved_words(result)
    lines = [
        *_diagnosis_text(result),
        *trial_lines(result),
        "TRAINING TIME COMPARISON",
        "=" * 70,
        "",
        "Training performance (wall time over the measured iterations):",
        f"  {b['name'] + ':':<{width}}{_speed_line(b)}",
        f"  {c['name'] + ':':<{width}}{_speed_line(c)}",
        f"  {speed_label(result) + ':':<{width}}{_speedup_text(result)}",
        f"  {'Typical:':<{width}}{typical}",
        *([f"  {'Between:':<{width}}{result['between_runs']}"] if result.get("between_runs") else []),
        *_warmup_lines(result, width),
        "",
        "Iteration time distribution:",
        f"  {b['name'] + ':':<{width}}{_spread_line(b)}",
        f"  {c['name'] + ':':<{width}}{_spread_line(c)}",
        *(["", "Slow iterations (IterationTimer's tail):"]
          + [f"  {run['name'] + ':':<{width}}{result['tail'][key] or 'n/a'}"
             for run, key in ((b, "base"), (c, "candidate"))] if any(result["tail"].values()) else []),
        *_straggler_text(result, width),
        *(["", "Compute (FLOPs of a training batch over its wall time; MFU: of the device's peak):"]
          + [f"  {run['name'] + ':':<{width}}{_compute_text(run)}" for run in (b, c)]
          if b["tflops_per_s"] is not None or c["tflops_per_s"] is not None else []),
        "",
        f"Estimated time to {n:,} iterations (from the mean, warm-up included):",
        f"  {b['name'] + ':':<{width}}{_time_text(result, 'base')}",
        f"  {c['name'] + ':':<{width}}{_time_text(result, 'candidate')}",
        f"  {saved_label + ':':<{width}}{saved_text}",
    ]
    lines += _sections_text(result)
    if result["memory_mb"]:
        lines += ["", "Peak memory (MiB: 2^20 bytes):"]
        for label, d in result["memory_mb"].items():
            base_text, candidate_text, _ = memory_texts(d["base"], d["candidate"])
            lines.append(f"  {label}: {base_text} -> {candidate_text} ({memory_change_text(d)})")
    lines += energy_lines(result.get("energy"), b["name"], c["name"])
    if result["quality"]:
        lines += ["", "Quality:"]
        for name, d in result["quality"].items():
            lines.append(
                f"  {name}: {fmt_num(d['base'], 4)} -> {fmt_num(d['candidate'], 4)}"
                f" ({fmt_pct(d['delta_pct'])}) {quality_verdict_text(d)}".rstrip()
            )
    if result["notes"]:
        lines += ["", "Notes:"] + [f"  - {note}" for note in result["notes"]]
    return "\n".join(lines)


def _time_text(result: Dict[str, Any], key: str) -> str:
    text = fmt_duration(result["time_to_iterations_s"][key])
    with_eval = result["time_to_iterations_with_eval_s"][key]
    if with_eval is not None and with_eval != result["time_to_iterations_s"][key]:
        text += f" training, {fmt_duration(with_eval)} with evaluation"
    return text


def format_markdown(result: Dict[str, Any]) -> str:
    b, c = result["base"], result["candidate"]
    saved_label, saved_text = time_saved_words(result)
    rows = [
        [
            run["name"],
            fmt_num(run["ms_per_iter_mean"]),
            fmt_num(run["it_per_s"]),
            fmt_num(run["samples_per_s"], 1),
            fmt_num(run["ms_per_iter_min"]),
            fmt_num(run["ms_per_iter_median"]),
            fmt_num(run["ms_per_iter_p95"]),
            fmt_num(run["ms_per_iter_p99"]),
            fmt_num(run["ms_per_iter_max"]),
            fmt_duration(result["time_to_iterations_s"][key]),
            fmt_duration(result["time_to_iterations_with_eval_s"][key]),
        ]
        for run, key in ((b, "base"), (c, "candidate"))
    ]
    n = f"{result['iterations']:,}"
    headers = ["run", "ms/iter (mean)", "it/s", "samples/s", "min ms", "median ms", "p95 ms", "p99 ms", "max ms",
               f"time to {n}", f"time to {n} with eval"]
    parts = [
        *[part for line in (result["diagnosis"].get("lines") or [result["diagnosis"]["line"]])
          for part in (f"**{line}**", "")],
        markdown_table(headers, rows),
        "",
        f"**{speed_label(result)}:** {_speedup_text(result)}. **{saved_label}:** {saved_text}.",
    ]
    if result.get("between_runs"):
        parts += ["", f"**Between runs:** {result['between_runs']}."]
    parts += _sections_markdown(result)
    stragglers = result.get("stragglers") or {}
    if stragglers.get("base") or stragglers.get("candidate"):
        parts += ["", "**Stragglers (DDP):** " + "; ".join(
            f"{run['name']}: {stragglers['text'][key] or 'n/a (one device)'}"
            for run, key in ((b, "base"), (c, "candidate"))) + "."]
    parts += (["", f"**Break-even:** {Comparison.of(result).break_even_text(result['break_even'])}."]
              if result.get("break_even") else [])
    if result["memory_mb"]:
        mem_rows = [[label, *memory_texts(d["base"], d["candidate"])[:2], memory_change_text(d)]
                    for label, d in result["memory_mb"].items()]
        parts += ["", markdown_table(["peak memory (MiB: 2^20 bytes)", b["name"], c["name"], "change"], mem_rows)]
    if result.get("energy"):  # training energy (docs/energy.md)
        e_rows = [[label, fmt_energy(result["energy"][k]["base"]), fmt_energy(result["energy"][k]["candidate"]),
                   fmt_pct(result["energy"][k]["delta_pct"])] for k, label in ENERGY_LABELS]
        parts += ["", markdown_table(["energy (training)", b["name"], c["name"], "change"], e_rows)]
    if result["quality"]:
        q_rows = [
            [name, fmt_num(d["base"], 4), fmt_num(d["candidate"], 4), fmt_pct(d["delta_pct"]),
             quality_verdict_text(d) or "-"]
            for name, d in result["quality"].items()
        ]
        parts += ["", markdown_table(["quality", b["name"], c["name"], "change", "gate"], q_rows)]
    if result["notes"]:
        parts += [""] + [f"- {one_line(note)}" for note in result["notes"]]
    return "\n".join(parts)


def format_json(result: Dict[str, Any]) -> str:
    return json.dumps(result, indent=2)


FORMATTERS = {"text": format_text, "markdown": format_markdown, "json": format_json}


def default_names(base_path: str, candidate_path: str, summaries: Optional[List[Dict[str, Any]]] = None) -> tuple:
    """Each run's ``run.name``, else the part of its path that differs from the other's."""
    names = run_names([base_path, candidate_path], summaries)
    return tuple(names) if names[0] != names[1] else ("base", "candidate")
