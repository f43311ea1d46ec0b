"""One primary diagnosis of a run from its measured shares: what bounds training, the figure that decided it, and the
one change most likely to help. Pure Python on the summary; the thresholds are the named constants below
(docs/diagnosis.md)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from lightning_perf.measure.sections.loader import wait_advice
from lightning_perf.measure.timing.tail_advice import section_elsewhere
from lightning_perf.summary.contention import contention, contention_line
from lightning_perf.summary.evidence import evidence_lines, first_evidence
from lightning_perf.summary.evidence import read_field as _get
from lightning_perf.summary.fields import fixed
from lightning_perf.summary.model import PerfSummary, as_summary
from lightning_perf.summary.straggler import straggler

#: input-bound: data loading + transfer above this % of iteration time (SectionProfiler).
INPUT_BOUND_PCT = 25.0
#: evaluation-heavy: evaluation above this % of training + evaluation time (IterationTimer, else SectionProfiler).
EVALUATION_HEAVY_PCT = 25.0
#: checkpoint-heavy: checkpoint writes above this % of iteration time (SectionProfiler).
CHECKPOINT_HEAVY_PCT = 10.0
#: tail-heavy: time in iterations over 2x the median above this % of training time (IterationTimer's tail).
TAIL_HEAVY_PCT = 20.0
#: host-bound: mean GPU utilisation in training below this % (VRAMMonitor's activity, NVML)...
HOST_BOUND_GPU_UTIL_PCT = 50.0
#: ...while the step (forward, backward, optimizer step) takes at least this % of iteration time: the host is busy
#: the whole iteration and the GPU is not.
HOST_BOUND_STEP_PCT = 80.0
#: compute-bound: no verdict above fired and the step takes at least this % of iteration time.
COMPUTE_BOUND_STEP_PCT = 50.0
#: Fewer measured iterations than this give no verdict.
MIN_ITERATIONS = 5

NOT_ENOUGH = "not-enough-measured"
#: Every verdict, in the order a tie between problem verdicts is broken.
VERDICTS = ("evaluation-heavy", "input-bound", "checkpoint-heavy", "tail-heavy", "host-bound", "compute-bound",
            "mixed", NOT_ENOUGH)
THRESHOLDS = {"input_bound_pct": INPUT_BOUND_PCT, "evaluation_heavy_pct": EVALUATION_HEAVY_PCT,
              "checkpoint_heavy_pct": CHECKPOINT_HEAVY_PCT, "tail_heavy_pct": TAIL_HEAVY_PCT,
              "host_bound_gpu_util_pct": HOST_BOUND_GPU_UTIL_PCT, "host_bound_step_pct": HOST_BOUND_STEP_PCT,
              "compute_bound_step_pct": COMPUTE_BOUND_STEP_PCT, "min_iterations": MIN_ITERATIONS}

STEP_SECTIONS = ("forward", "backward", "optimizer_step", "training_step")
#: Lightning's loop between two batches (SectionProfiler's section): host work of the loop, not input.
LOOP_SECTION = "between_batches"
LOOP_ADVICE = ("no single cost dominates; the largest is Lightning's loop between batches (`between_batches`: batch-end"
               " hooks of callbacks and the module, logging, the progress bar), host work and not input: log less"
               " often (`log_every_n_steps`), refresh the progress bar less often (`TQDMProgressBar(refresh_rate=...)`),"
               " or `profile_section` in your batch-end hooks")
_ADD_PROFILER = ("Add SectionProfiler to the Trainer's callbacks (or PerfSuite(), which holds it) and train at least"
                 f" {MIN_ITERATIONS} iterations past its warm-up.")

def _switched_off(profiler: Any) -> Tuple[str, str]:
    """(reason, advice) where the run had SectionProfiler and switched it off: by ``LIGHTNING_PERF_PROFILE=0`` (its
    ``unavailable.sections`` names the variable's value), else by ``enabled=False``."""
    recorded = str(_get(_get(profiler, "unavailable"), "sections") or "")
    if "LIGHTNING_PERF_PROFILE=0" in recorded:
        return ("SectionProfiler was switched off by the environment variable LIGHTNING_PERF_PROFILE=0",
                f"Unset LIGHTNING_PERF_PROFILE (or set it to 1) and train at least {MIN_ITERATIONS} iterations past"
                " its warm-up.")
    return ("SectionProfiler was switched off in this run (`SectionProfiler(enabled=False)`)",
            f"Construct it with enabled=True (or set LIGHTNING_PERF_PROFILE=1) and train at least {MIN_ITERATIONS}"
            " iterations past its warm-up.")


TAIL_ADVICE = {
    "epoch_start": "keep the DataLoader's workers alive across epochs (`persistent_workers=True`)",
    "checkpoint": "save checkpoints less often (`every_n_train_steps`) or asynchronously (`AsyncCheckpointIO`)",
    "after_validation": "validate less often (`val_check_interval`, `check_val_every_n_epoch`)",
    "alloc_retry": ("make the CUDA allocator stop retrying: a smaller batch, or"
                    " `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against fragmentation"),
    "gc": "call `gc.freeze()` once the model and data are set up, or make fewer reference cycles",
    "lightning_perf": ("report less often (`SectionProfiler(report_every_n_steps=...)`, `log_every_n_steps`) or without"
                       " the printed table (`print_reports=False`)"),
    "unexplained": "find what grows in the slowest iterations (IterationTimer's `tail.slowest`, SectionProfiler's"
                   " table, a trace of those steps: `StepTrace(slow_factor=3.0)`)",
}
#: What a contended run's diagnosis adds: its figures may be the machine's.
CONTENTION_ADVICE = ("measure again on a quiet machine, or compare runs measured in interleaved repeats, before"
                     " acting on this run's figures")


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(value)


def gpu_utilisation(summary: PerfSummary) -> Tuple[Optional[float], str]:
    """Mean GPU utilisation % in training (``vram.activity.phases.train.gpu_util_pct.mean``) and where it came
    from, or None and why it is not there."""
    activity = _get(summary.vram, "activity")
    if activity is None:
        return None, "no GPU utilisation in the summary (VRAMMonitor's activity, read through NVML on a GPU)"
    value = _number(_get(_get(_get(_get(activity, "phases"), "train"), "gpu_util_pct"), "mean"))
    if value is None:
        why = _get(_get(activity, "unavailable"), "gpu_util_pct") or _get(_get(activity, "unavailable"), "nvml")
        return None, f"no GPU utilisation measured in training{f' ({why})' if isinstance(why, str) else ''}"
    return value, "vram.activity.phases.train.gpu_util_pct.mean"


def _shares(summary: PerfSummary) -> Tuple[Optional[Dict[str, float]], Optional[str]]:
    """Each automatic section's inclusive share of iteration time (user sections put back into the section they ran
    in), or None and why the breakdown cannot be used."""
    sp = summary.section_profiler
    if sp is None:
        return None, "the summary has no SectionProfiler section, whose iteration breakdown every verdict weighs"
    if sp.enabled is False:
        return None, _switched_off(sp)[0]
    iterations = sp.iterations or 0
    if iterations < MIN_ITERATIONS:
        return None, (f"SectionProfiler measured {iterations} iteration{'' if iterations == 1 else 's'}; a verdict"
                      f" needs at least {MIN_ITERATIONS}")
    shares: Dict[str, float] = {}
    for name, row in (sp.sections or {}).items():
        if row is None or _get(row, "kind") not in (None, "auto"):
            continue
        share = _number(_get(row, "inclusive_share_pct"))
        share = share if share is not None else _number(row.share_pct)
        if share is not None:
            shares[name] = share
    if "data_loading" not in shares or not any(n in shares for n in STEP_SECTIONS):
        return None, "SectionProfiler's table has no data_loading or step shares"
    return shares, None


def _evaluation_pct(summary: PerfSummary) -> Tuple[Optional[float], str]:
    """Evaluation time as % of training + evaluation time: IterationTimer's clocks, else SectionProfiler's."""
    timer = summary.iteration_timer
    train, evaluation = (_number(timer.train_time_s), _number(timer.eval_time_s)) if timer is not None else (None,
                                                                                                               None)
    source = "iteration_timer"
    if train is None or evaluation is None:
        sp = summary.section_profiler
        validation = _get(sp, "validation")
        evaluation = _number(_get(validation, "total_s"))
        mean = _number(sp.iteration_ms.mean) if sp is not None and sp.iteration_ms is not None else None
        train = mean * (sp.iterations or 0) / 1000.0 if mean is not None and sp is not None else None
        source = "section_profiler"
    if train is None or evaluation is None or train + evaluation <= 0:
        return None, "neither IterationTimer nor SectionProfiler timed training and evaluation"
    return 100.0 * evaluation / (train + evaluation), source


def _tail_advice(tail: Any, cause: str) -> str:
    """The cause's advice; where SectionProfiler saw its slow iterations grow in a section that is not the cause's
    own (a cheap checkpoint beside a long sampling), that section instead."""
    elsewhere = section_elsewhere(cause, (_get(tail, "by_cause") or {}).get(cause))
    if elsewhere is None:
        return TAIL_ADVICE.get(cause, TAIL_ADVICE["unexplained"])
    return (f"look at `{elsewhere['name']}` first: in the slowest of those iterations it took"
            f" {fixed(elsewhere['mean_ms'], '.0f')} ms (SectionProfiler), and the {cause.replace('_', ' ')} did not")


def _largest_tail_cause(tail: Any) -> str:
    causes = [(_number(_get(entry, "share_pct")) or 0.0, name) for name, entry in (_get(tail, "by_cause") or {}).items()
              if entry is not None]
    return max(causes)[1] if causes else "unexplained"


def _pct(value: float) -> str:
    return f"{fixed(value, '.1f')}%"


#: The step's speed-up a ceiling for the step's verdicts assumes (a change to the step cannot remove it).
STEP_SPEEDUP_ASSUMED = 2.0


def _amdahl(share_pct: float, removed: float = 1.0) -> Optional[float]:
    """Amdahl's bound: the whole's speed-up when ``removed`` of a part taking ``share_pct`` % goes."""
    rest = 1.0 - removed * share_pct / 100.0
    return 1.0 / rest if 0.0 < rest < 1.0 else None


def ceilings(shares: Mapping[str, float], evaluation: Optional[float], tail: Any) -> Dict[str, Dict[str, Any]]:
    """What removing each bottleneck could give at most, from the measured shares, with the assumption named:
    verdict -> ``at_most`` (x faster) and ``assumption``. Amdahl's law on the part the verdict weighs; the step's
    verdicts (a step cannot take no time) assume it runs ``STEP_SPEEDUP_ASSUMED`` x faster."""
    out: Dict[str, Dict[str, Any]] = {}

    def put(verdict: str, at_most: Optional[float], assumption: str) -> None:
        if at_most is not None:
            out[verdict] = {"at_most": at_most, "assumption": assumption}

    wait = shares.get("data_loading", 0.0) + shares.get("transfer", 0.0)
    put("input-bound", _amdahl(wait), "if the loop never waited for data (iterations)")
    if evaluation is not None:
        put("evaluation-heavy", _amdahl(evaluation, 0.5), "skipping half the validations (training + evaluation)")
    put("checkpoint-heavy", _amdahl(shares.get("checkpointing", 0.0)), "if checkpoints cost nothing (iterations)")
    share, time_s, count, median = (_number(_get(tail, k)) for k in ("share_pct", "time_s", "iterations",
                                                                        "median_ms"))
    if None not in (share, time_s, count, median) and time_s > 0:
        excess = max(0.0, time_s - count * median / 1000.0) / time_s
        put("tail-heavy", _amdahl(share * excess), "if the slow iterations ran at the median (training time)")
    step = sum(shares.get(n, 0.0) for n in STEP_SECTIONS)
    for verdict in ("compute-bound", "host-bound"):
        put(verdict, _amdahl(step, 1.0 - 1.0 / STEP_SPEEDUP_ASSUMED),
            f"if the step ran {STEP_SPEEDUP_ASSUMED:g}x faster (iterations)")
    return out


def diagnose(summary: Any) -> Dict[str, Any]:
    """The run's one primary diagnosis from its measured shares.

    Problem verdicts (input-bound, evaluation-heavy, checkpoint-heavy, tail-heavy) fire above their thresholds; of
    those that fire, the one that stands for the largest part of the run's wall time is the verdict and the others
    are listed in ``also``. When none fires, the step is judged: host-bound (GPU utilisation measured and low while
    the step fills the iteration), compute-bound (the step is most of the iteration), or mixed. Fails closed: without
    SectionProfiler's breakdown of at least ``MIN_ITERATIONS`` iterations, or without an evaluation figure for a
    verdict on the step, the verdict is ``not-enough-measured`` with the reason.

    Returns:
        ``verdict``, ``figure`` (what was measured), ``value`` and ``threshold`` (%), ``advice`` (the one change most
        likely to help), ``also`` (other verdicts that fired), ``unchecked`` (verdict -> why it could not be
        checked), ``reason`` (for ``not-enough-measured``), ``thresholds``.
    """
    summary = as_summary(summary, "summary")
    out: Dict[str, Any] = {"verdict": NOT_ENOUGH, "figure": None, "value": None, "of": None, "threshold": None,
                           "advice": None, "also": [], "unchecked": {}, "reason": None, "thresholds": dict(THRESHOLDS),
                           "contention": contention_line(contention(summary)), "ceilings": {},
                           "evidence": evidence_lines(summary), "straggler": straggler(summary)}
    shares, why = _shares(summary)
    if shares is None:
        profiler = summary.section_profiler
        out.update(reason=why, advice=_switched_off(profiler)[1] if profiler is not None and profiler.enabled is False
                   else _ADD_PROFILER)
        return out
    unchecked: Dict[str, str] = out["unchecked"]
    evaluation, eval_source = _evaluation_pct(summary)
    out["ceilings"] = ceilings(shares, evaluation,
                               summary.iteration_timer.tail if summary.iteration_timer is not None else None)
    train_fraction = 1.0 if evaluation is None else 1.0 - evaluation / 100.0
    fired: List[Dict[str, Any]] = []  # verdict, figure, value, threshold, advice, and its part of the run's wall time

    data, transfer = shares.get("data_loading", 0.0), shares.get("transfer", 0.0)
    if data + transfer > INPUT_BOUND_PCT:
        split = f"transfer {_pct(transfer)}, data loading {_pct(data)}"
        workers = wait_advice(_get(summary.section_profiler, "workers"))
        advice = (f"the host-to-device copy is most of it ({split}): `pin_memory=True` in the DataLoader and"
                  " non-blocking copies (`.to(device, non_blocking=True)` in `transfer_batch_to_device`)"
                  if transfer > data else
                  f"the loop waits for batches ({split}): {workers}" if workers else
                  f"the model waits for batches ({split}): more DataLoader workers (`num_workers`, with"
                  " `persistent_workers=True`), or lighter loading and collation")
        fired.append({"verdict": "input-bound", "figure": "data loading + transfer", "of": "iteration time",
                      "value": data + transfer, "threshold": INPUT_BOUND_PCT, "advice": advice,
                      "weight": (data + transfer) * train_fraction})
    if evaluation is None:
        unchecked["evaluation-heavy"] = eval_source
    elif evaluation > EVALUATION_HEAVY_PCT:
        fired.append({"verdict": "evaluation-heavy", "figure": "evaluation", "of": "training + evaluation time",
                      "value": evaluation, "threshold": EVALUATION_HEAVY_PCT,
                      "advice": "validate less often (`val_check_interval`, `check_val_every_n_epoch`) or on fewer"
                                " batches (`limit_val_batches`)", "weight": evaluation})
    checkpointing = shares.get("checkpointing", 0.0)
    if checkpointing > CHECKPOINT_HEAVY_PCT:
        fired.append({"verdict": "checkpoint-heavy", "figure": "checkpoint writes", "of": "iteration time",
                      "value": checkpointing, "threshold": CHECKPOINT_HEAVY_PCT, "advice": TAIL_ADVICE["checkpoint"],
                      "weight": checkpointing * train_fraction})
    tail = summary.iteration_timer.tail if summary.iteration_timer is not None else None
    tail_pct = _number(tail.share_pct) if tail is not None else None
    if tail_pct is None:
        unchecked["tail-heavy"] = "no tail block in the summary (IterationTimer)"
    elif tail_pct > TAIL_HEAVY_PCT:
        cause = _largest_tail_cause(tail)
        advice = _tail_advice(tail, cause)
        if cause == "unexplained" and out["contention"]:  # nothing in the run explains them; the machine does
            cause, advice = "contention", f"{out['contention']}: {CONTENTION_ADVICE}"
        fired.append({"verdict": "tail-heavy",
                      "figure": f"iterations over {tail.factor or 2:g}x the median (mostly {cause})",
                      "of": "training time",
                      "value": tail_pct, "threshold": TAIL_HEAVY_PCT, "advice": advice,
                      "weight": tail_pct * train_fraction})
    util, util_source = gpu_utilisation(summary)
    if util is None:
        unchecked["host-bound"] = util_source
    if fired:
        fired.sort(key=lambda f: (-f["weight"], VERDICTS.index(f["verdict"])))
        primary = fired[0]
        out.update({k: primary[k] for k in ("verdict", "figure", "of", "value", "threshold", "advice")})
        out["also"] = [f["verdict"] for f in fired[1:]]
        return out
    if evaluation is None:  # the step's verdict would hide an evaluation that was never weighed
        out.update(reason=f"no verdict on the step without evaluation time: {eval_source}",
                   advice="Add IterationTimer to the Trainer's callbacks (or PerfSuite()).")
        return out
    step = sum(shares.get(n, 0.0) for n in STEP_SECTIONS)
    if util is not None and util < HOST_BOUND_GPU_UTIL_PCT and step >= HOST_BOUND_STEP_PCT:
        out.update(verdict="host-bound",
                   figure="mean GPU utilisation in training", value=util, threshold=HOST_BOUND_GPU_UTIL_PCT,
                   advice=f"the step took {_pct(step)} of iteration time while the GPU idled, so the GPU waits for"
                          " Python: larger batches, `torch.compile` (mode='reduce-overhead' adds"
                          " CUDA graphs), fewer small ops and `.item()` calls in the step")
    elif step >= COMPUTE_BOUND_STEP_PCT and (util is None or util >= HOST_BOUND_GPU_UTIL_PCT):
        out.update(verdict="compute-bound", figure="forward + backward + optimizer step", of="iteration time",
                   value=step, threshold=COMPUTE_BOUND_STEP_PCT,
                   advice="the step itself is the cost: mixed precision (`Trainer(precision='bf16-mixed')`),"
                          " `torch.compile`, or a smaller model; `profile_section` shows which part of the step")
    else:
        name, share = max(shares.items(), key=lambda kv: kv[1])
        out.update(verdict="mixed", figure=f"the largest section, {name}", of="iteration time", value=share,
                   threshold=None,
                   advice=LOOP_ADVICE if name == LOOP_SECTION else
                   f"no single cost dominates; `{name}` is the largest: `profile_section` inside it shows"
                   " which part is slow")
    return out


def diagnosis_line(diagnosis: Optional[Mapping[str, Any]], name: Optional[str] = None) -> str:
    """The diagnosis in one line, for the console and ``compare``."""
    who = f" of {name}" if name else ""
    if not diagnosis or not diagnosis.get("verdict"):
        return f"Diagnosis{who}: none in this summary"
    verdict = diagnosis["verdict"]
    evidence = first_evidence(diagnosis.get("evidence")) + straggler_words(diagnosis)
    if verdict == NOT_ENOUGH:
        return f"Diagnosis{who}: not enough measured: {diagnosis.get('reason') or 'no reason given'}." + (
            f" {diagnosis['advice']}" if diagnosis.get("advice") else "") + evidence
    value, threshold = _number(diagnosis.get("value")), _number(diagnosis.get("threshold"))
    figure = str(diagnosis.get("figure") or "")
    if value is not None:
        figure += f" {_pct(value)}" + (f" of {diagnosis['of']}" if diagnosis.get("of") else "")
        if threshold is not None:
            figure += f" ({'below' if verdict == 'host-bound' else 'above'} {threshold:g}%)"
    also = diagnosis.get("also") or []
    ceiling = ceiling_words(diagnosis, verdict)
    if ceiling:
        figure += f"; {ceiling}"
    busy = diagnosis.get("contention")
    caveat = f" [{busy}: the figures may be the machine's, not the run's]" if busy and busy not in str(
        diagnosis.get("advice")) else ""
    return (f"Diagnosis{who}: {verdict}: {figure.strip()}" + (f"; most likely to help: {diagnosis['advice']}"
                                                               if diagnosis.get("advice") else "")
            + (f" [also {', '.join(also)}]" if also else "") + caveat + evidence)


def straggler_words(diagnosis: Mapping[str, Any]) -> str:
    """`` [straggler: rank 3 waits ...]`` where the diagnosis names a straggler (DDP), else nothing."""
    line = _get(diagnosis.get("straggler"), "line")
    return f" [straggler: {line}]" if isinstance(line, str) and line else ""


def ceiling_words(diagnosis: Optional[Mapping[str, Any]], verdict: Optional[str]) -> Optional[str]:
    """``input-bound: if the loop never waited for data (iterations), at most 1.38x faster``, or None."""
    entry = ((diagnosis or {}).get("ceilings") or {}).get(verdict) if verdict else None
    at_most = _number(_get(entry, "at_most"))
    if at_most is None:
        return None
    return f"{_get(entry, 'assumption')}, at most {fixed(at_most, '.2f')}x faster"


def recorded_or_computed(summary: Any) -> Dict[str, Any]:
    """The diagnosis a summary carries (what the run printed), else the one its figures give (an older file)."""
    summary = as_summary(summary, "summary")
    recorded = summary.diagnosis
    if recorded is not None and recorded.verdict:
        return recorded.model_dump()
    try:
        return diagnose(summary)
    except Exception as err:  # noqa: BLE001 - figures no run writes (a hand-edited file): no verdict, and why
        return {"verdict": NOT_ENOUGH, "reason": f"the figures could not be weighed ({type(err).__name__}: {err})"}


def recorded_or_computed_straggler(summary: Any) -> Optional[Dict[str, Any]]:
    """The straggler a summary's diagnosis carries, else the one its per-rank figures give (a file from before
    stragglers were named); None on one device, or where the figures cannot be weighed (a hand-edited file)."""
    summary = as_summary(summary, "summary")
    recorded = summary.diagnosis
    if recorded is not None and "straggler" in recorded.model_fields_set:
        return recorded.straggler.model_dump() if recorded.straggler is not None else None
    try:
        return straggler(summary)
    except Exception:  # noqa: BLE001 - figures no run writes: no straggler, as for a run on one device
        return None


def straggler_text(summary: Any) -> Optional[str]:
    """compare's and report's words for a run: its straggler's line, ``no straggler among N ranks`` under DDP, None
    on one device."""
    summary = as_summary(summary, "summary")
    found = recorded_or_computed_straggler(summary)
    if found is not None:
        return str(found.get("line") or "")
    world = summary.run.world_size or 1
    return f"no straggler among {world} ranks" if world > 1 else None
