"""The tail's advice: the rules that turn IterationTimer's tail block into sentences, joined with SectionProfiler's
slowest iterations where it ran (the section that grew), and the tail in one console line."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from lightning_perf.measure.timing.tail import CAUSES, UNEXPLAINED, primary_cause

#: A cause gets an insight when its tail time is at least this share of the measured training time...
RULE_MIN_PCT = 1.0
#: ...the tail without a known cause when at least this share; below RULE_MIN_PCT in all, the tail is called small.
UNEXPLAINED_MIN_PCT = 5.0


#: The sections a cause's own cost lands in: where a slow iteration's grown section is elsewhere, the time is not the
#: cause's (a checkpoint write that cost 4 ms in an iteration whose sampling took 80 ms). A garbage collection, an
#: allocator retry and what validation leaves behind stall whichever section runs: any section is theirs.
OWN_SECTIONS = {"checkpoint": frozenset({"checkpointing"}),
                "epoch_start": frozenset({"data_loading", "transfer", "between_batches", "other"})}


def section_elsewhere(cause: str, entry: Any) -> Optional[Dict[str, Any]]:
    """The cause's ``section`` (a plain dict or a typed one) where it is not one the cause's own cost lands in."""
    section = entry.get("section") if isinstance(entry, dict) else getattr(entry, "section", None)
    if section is None or cause not in OWN_SECTIONS:
        return None
    if not isinstance(section, dict):
        section = section.model_dump() if hasattr(section, "model_dump") else dict(section)
    return section if section.get("name") not in OWN_SECTIONS[cause] else None


def explain_with_sections(block: Dict[str, Any], records: List[Dict[str, Any]]) -> None:
    """Joins SectionProfiler's slowest iterations (``records``) to IterationTimer's tail ``block``, by global step
    where both have it (automatic optimization: a SectionProfiler added at a resume counts its iterations from 0),
    else by iteration number: each kept slow iteration gets ``section`` (the one that exceeded its own median the
    most, or None where SectionProfiler has no record of it), each cause ``section`` (of its kept slow iterations
    with a record, the section that exceeded its median by the most time in all, or None), and the insights are
    said again with it."""
    by_step = {r["step"]: r.get("over_median") for r in records or () if r.get("step") is not None}
    by_iteration = {r.get("iteration"): r.get("over_median") for r in records or () if r.get("step") is None}
    named: Dict[str, List[Dict[str, Any]]] = {}
    for entry in block.get("slowest") or ():
        over = by_step.get(entry.get("step")) if by_step else by_iteration.get(entry.get("iteration"))
        entry["section"] = over
        if over is not None:
            named.setdefault(primary_cause(_flags_of(entry["causes"])), []).append(over)
    for cause, target in (block.get("by_cause") or {}).items():
        overs = named.get(cause)
        if not overs:
            target["section"] = None
            continue
        excess: Dict[str, float] = {}
        for o in overs:
            excess[o["section"]] = excess.get(o["section"], 0.0) + o["excess_ms"]
        top = max(excess, key=lambda n: (excess[n], n))
        same = [o for o in overs if o["section"] == top]
        target["section"] = {"name": top, "iterations": len(same), "of_kept": len(overs),
                             "mean_ms": sum(o["ms"] for o in same) / len(same), "median_ms": same[0]["median_ms"],
                             "runs_in": same[0].get("runs_in"), "of_iterations": same[0].get("of_iterations")}
    if block.get("median_ms") is not None:
        block["insights"] = tail_insights(block)


def _flags_of(names: List[str]) -> int:
    bits = dict(CAUSES)
    flags = 0
    for name in names:
        flags |= bits.get(name, 0)
    return flags


def counted(n: int, word: str) -> str:
    """``n`` and ``word``, plural but for one: "1 iteration", "3 iterations"."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _grown(section: Dict[str, Any]) -> str:
    """SectionProfiler's section of a cause's slowest iterations, in words."""
    runs, of = section.get("runs_in"), section.get("of_iterations")
    rare = runs is not None and of and runs * 2 <= of  # its median per iteration is 0: say how often it runs
    usual = f"it runs in {runs} of {of} iterations" if rare else f"its median {section['median_ms']:.1f} ms"
    return (f"{section['name']} took {section['mean_ms']:.0f} ms in {section['iterations']} of the"
            f" {section['of_kept']} slowest with sections ({usual})")


def _each(entry: Dict[str, Any], median: float) -> str:
    text = f"{entry['mean_ms']:.0f} ms each, the median iteration {median:.0f} ms"
    section = entry.get("section")
    if section:  # from SectionProfiler, over the kept slowest iterations of this cause
        text += "; " + _grown(section)
    return text


def _not_the_cause(e: Dict[str, Any], what: str, median: float) -> str:
    """A cause whose slow iterations grew in a section that is not its own: what they are, and where the time is."""
    section = e["section"]
    return (f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} {what}"
            f" ({e['mean_ms']:.0f} ms each, the median iteration {median:.0f} ms), but that is not where their time"
            f" went: {_grown(section)}. Look at {section['name']} first.")


def tail_insights(block: Dict[str, Any]) -> List[str]:
    """One sentence per rule that fires on the tail block (see docs/iteration_timer.md#the-tail)."""
    out: List[str] = []
    by, median = block.get("by_cause") or {}, block.get("median_ms")
    if median is None:
        return out

    def fires(name: str, minimum: float = RULE_MIN_PCT) -> Optional[Dict[str, Any]]:
        entry = by.get(name)
        return entry if entry and entry["iterations"] and entry["share_pct"] >= minimum else None

    e = fires("epoch_start")
    if e and section_elsewhere("epoch_start", e):
        out.append(_not_the_cause(e, "at epoch starts", median))
    elif e:
        per_epoch = e["excess_s"] / e["iterations"]
        loader = block.get("dataloader") or {}
        workers = loader.get("num_workers")
        with_ckpt = (e.get("also") or {}).get("checkpoint", 0)
        head = (f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} at epoch starts"
                f" ({_each(e, median)}" + (f"; {with_ckpt} of the epoch starts followed a checkpoint save" if with_ckpt
                                           else "") + ")")
        if workers and not loader.get("persistent_workers"):
            out.append(f"{head}: the DataLoader starts its {workers} workers again every epoch;"
                       f" `persistent_workers=True` would save about {per_epoch:.2f} s per epoch.")
        elif workers == 0:
            out.append(f"{head}: with `num_workers=0` the first batch of each epoch waits for the dataset's"
                       f" set-up (shuffling, opening files); about {per_epoch:.2f} s per epoch to win there.")
        else:
            out.append(f"{head}: about {per_epoch:.2f} s per epoch goes to starting the epoch (epoch-end hooks,"
                       " the DataLoader's first batch).")
    e = fires("checkpoint")
    if e and section_elsewhere("checkpoint", e):
        out.append(_not_the_cause(e, "that wrote a checkpoint", median))
    elif e:
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} that"
                   f" wrote a checkpoint ({_each(e, median)}): saving less often (`every_n_train_steps`) or"
                   f" asynchronously (`AsyncCheckpointIO`) would save up to {e['excess_s']:.1f} s.")
    e = fires("gc")
    if e:
        pause = e.get("gc_pause_s", 0.0) / max(1, e["flagged_iterations"]) * 1000.0
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} with a"
                   f" full Python garbage collection ({_each(e, median)}; the collection paused {pause:.0f} ms on"
                   " average): fewer reference cycles, or `gc.freeze()` after the model and data are set up, would"
                   " save up to"
                   f" {min(e['excess_s'], e.get('gc_pause_s', e['excess_s'])):.1f} s (the pauses, at most).")
    e = fires("after_validation")
    if e:
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'first iteration')} after a"
                   f" validation ({_each(e, median)}): validating less often (`val_check_interval`) would save up to"
                   f" {e['excess_s']:.1f} s; what validation leaves behind (caches, allocator, workers) costs it.")
    e = fires(UNEXPLAINED, UNEXPLAINED_MIN_PCT)
    if e:
        worst = [s for s in block.get("slowest") or [] if not s["causes"]][:3]
        at = f" (slowest at {iterations_named(worst)})" if worst else ""
        section = e.get("section")
        where = (f"{_grown(section)}: look there first;" if section else "SectionProfiler shows which section grows;")
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'slow iteration')} (over"
                   f" {block['factor']:g}x the median) that no epoch start, validation, checkpoint, allocator retry,"
                   f" garbage collection or lightning_perf's own work explains{at}: {where} the torch profiler around"
                   " those iterations shows what runs.")
    e = fires("lightning_perf")
    if e:
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} in which"
                   f" lightning_perf's own periodic work ran ({_each(e, median)}; a window report and its table, a"
                   " fold, logging): fewer reports (`report_every_n_steps`, `log_every_n_steps`) or no printed table"
                   " (`SectionProfiler(print_reports=False)`) would save up to"
                   f" {min(e['excess_s'], e.get('own_s', e['excess_s'])):.1f} s (that work's time, at most).")
    e = fires("alloc_retry")
    if e:
        out.append(f"{e['share_pct']:.0f}% of training time is in {counted(e['iterations'], 'iteration')} in"
                   f" which the CUDA allocator retried ({_each(e, median)}): it freed its cache and allocated again,"
                   " a stall each time; a smaller batch, or `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` against"
                   f" fragmentation, would save up to {e['excess_s']:.1f} s.")
    retries = block.get("alloc_retries")
    if retries and not e:
        out.append(f"The CUDA allocator retried {retries} times in training (it freed its cache and allocated again,"
                   " a stall each time): a smaller batch, or `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`"
                   " against fragmentation, would avoid it.")
    share = block.get("share_pct")
    if share is not None and share < RULE_MIN_PCT:
        out.append(f"The tail is small: {share:.1f}% of training time is in iterations over {block['factor']:g}x the"
                   f" median ({median:.1f} ms).")
    return out


def iteration_named(entry: Dict[str, Any]) -> str:
    """One of the tail's slowest iterations by its number in the run (batches under manual optimization), with the
    optimizer step at its end beside it where the two differ (two optimizers step twice a batch): ``11 (optimizer
    step 22)``; a checkpoint of an older version kept no number: its step, ``step 22``."""
    iteration, step = entry.get("iteration"), entry.get("step")
    if iteration is None:
        return f"step {step}"
    return f"{iteration}" + (f" (optimizer step {step})" if step is not None and step != iteration else "")


def iterations_named(entries: List[Dict[str, Any]]) -> str:
    """``iteration 11 (optimizer step 22)``, ``iterations 11, 6, 7``."""
    names = [iteration_named(e) for e in entries]
    return ("iteration " if len(names) == 1 else "iterations ") + ", ".join(names)


def tail_line(block: Dict[str, Any]) -> str:
    """The tail in one line, for the console at the end of fit."""
    share = block.get("share_pct")
    if share is None:
        return "  tail: no iteration measured"
    causes = ", ".join(f"{name} {entry['iterations']}" for name, entry in (block.get("by_cause") or {}).items()
                       if entry["iterations"])
    return (f"  tail: {share:.1f}% of training time in {counted(block['iterations'], 'iteration')} over"
            f" {block['factor']:g}x the median ({block['median_ms']:.2f} ms)" + (f": {causes}" if causes else ""))
