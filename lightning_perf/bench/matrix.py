"""Run one LightningCLI training under named variants, each in its own process with the suite attached, and
report them like seed 002: total time, speedup with a CI, peak memory, per-epoch times, quality, the best.

The suite is attached as ``lightning-perf run`` attaches it (:mod:`lightning_perf._attach`), at the Trainer's
construction in the variant's process, in its fill mode: a Trainer whose config (or the variant's overrides) already
has lightning_perf callbacks measures with those, and gets only the suite's callbacks it lacks."""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lightning_perf._attach import read_manifest
from lightning_perf.bench.matrix_trial import add_trial_column, trial_findings
from lightning_perf.bench.matrix_verdicts import add_verdicts, best_words, floor_cell, verdict_cell, verdict_findings
from lightning_perf.bench.noise_floor import FASTER, MIN_EFFECT_PCT, SLOWER, ratio_text
from lightning_perf.bench.process_group import run_in_group
from lightning_perf.bench.matrix_sequential import add_sequential_verdicts
from lightning_perf.bench.rounds import check_repeats, run_rounds
from lightning_perf.bench.sequential import DEFAULT_EQUIVALENCE_PCT
from lightning_perf.bench.threads import thread_env
from lightning_perf.bench.what_would_decide import trial_line_findings
from lightning_perf.summary.baseline import DEFAULT_TOLERANCE, verdict
from lightning_perf.summary.compare import break_even_text, compare_summaries, run_speed, warmup_section
from lightning_perf.summary.contention import contention, contention_line
from lightning_perf.summary.fields import (
    IMAGE_METRIC_DIRECTIONS,
    csv_text,
    finite,
    fmt_mb,
    fmt_num,
    markdown_table,
    quality,
    ratio,
    speed,
    train_peak_mb,
)
from lightning_perf.summary.io import load_summary
from lightning_perf.summary.memory_floor import floor_words, memory_change
from lightning_perf.summary.model import PerfSummary, Versions, as_summary
from lightning_perf.summary.projection import end_to_end_time, warmup_cost
from lightning_perf.summary.schema import SummaryError

#: Shipped presets: name -> LightningCLI overrides. Model and data presets need those init arguments.
PRESETS: Dict[str, str] = {
    "baseline": "",
    "amp": "--trainer.precision=bf16-mixed",
    "fp16": "--trainer.precision=16-mixed",
    "cudnn_benchmark": "--trainer.benchmark=true",
    "channels_last": "--model.channels_last=true",
    "compile": "--model.compile=true",
    "persistent_workers": "--data.num_workers=2 --data.persistent_workers=true --data.prefetch_factor=4",
}
#: Short names of presets, as seed 002 wrote its combinations (`amp+cudnn+workers`).
ALIASES: Dict[str, str] = {"cudnn": "cudnn_benchmark", "workers": "persistent_workers", "bf16": "amp"}

#: The callbacks each variant is measured with: the config's own where it has them, else attached by the matrix.
SUITE = ["IterationTimer", "SectionProfiler", "VRAMMonitor", "EvalNoGradGuard"]
SUMMARY_ENV = "LIGHTNING_PERF_SUMMARY_PATH"


#: The longest variant name: it becomes a folder name, and file systems refuse names over 255 bytes.
MAX_VARIANT_NAME = 100

def parse_variants(specs: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """``name`` (a preset), ``a+b+c`` (presets combined: their overrides in order) or ``name=--overrides ...``; the
    first variant is the baseline of the report."""
    variants: List[Tuple[str, List[str]]] = []
    for spec in specs:
        name, sep, overrides = spec.partition("=")
        name = name.strip()
        if not name or not all(c.isalnum() or c in "_-.+" for c in name):
            raise ValueError(f"--variant {spec!r}: a name of letters, digits, '_', '-', '.' or '+' comes first")
        if name.startswith("."):  # '.', '..' and hidden names: each name becomes a folder under --out
            raise ValueError(f"--variant {spec!r}: a name cannot start with '.' (it names a folder under --out)")
        if len(name) > MAX_VARIANT_NAME:  # a folder name the file system refuses would fail after earlier variants ran
            raise ValueError(f"--variant {name[:40]!r}...: a name is at most {MAX_VARIANT_NAME} characters, got"
                             f" {len(name)} (it names a folder under --out)")
        if not sep:
            parts = name.split("+")
            unknown = [p for p in parts if ALIASES.get(p, p) not in PRESETS]
            if unknown:
                choices = ", ".join(list(PRESETS) + [f"{a} ({t})" for a, t in ALIASES.items()])
                raise ValueError(f"--variant {name!r}: {', '.join(map(repr, unknown))} is no preset ({choices});"
                                 f" write {name}=--overrides")
            overrides = " ".join(PRESETS[ALIASES.get(p, p)] for p in parts)
        if any(n == name for n, _ in variants):
            raise ValueError(f"--variant {name!r} is given twice")
        variants.append((name, shlex.split(overrides)))
    if not variants:
        raise ValueError("give at least one --variant")
    return variants


def variant_command(python: str, script: str, config: Optional[str], overrides: List[str], out: str) -> List[str]:
    """The variant's command line; the suite is not on it: :func:`variant_env` attaches what the Trainer lacks."""
    cmd = [python, script, "fit"]
    if config:
        cmd += ["--config", config]
    return cmd + overrides + [f"--trainer.default_root_dir={out}"]


def variant_env(summary_path: str, manifest: str, threads: Optional[Dict[str, Any]] = None,
                trial: Optional[str] = None) -> Dict[str, str]:
    """The variant's environment: ``lightning-perf run``'s start-up hook in fill mode (each Trainer gets the
    callbacks of :data:`SUITE` it does not already have, from its config or the overrides; none when it has them
    all), the summary file of every callback that names none, the manifest the Trainers report to, the torch
    threads (:mod:`lightning_perf.bench.threads`) and the change a trial tries (``--trial``)."""
    from lightning_perf._attach.launch import command_env

    env = command_env(os.environ, list(SUITE), out=None, name=None, baseline=None, manifest=manifest, fill=True,
                      trial=trial)
    env[SUMMARY_ENV] = summary_path
    return thread_env(env, threads)


def _callbacks_note(events: List[Dict[str, Any]]) -> Optional[str]:
    """What the variant's Trainer was measured with, from its manifest: the suite attached, the config's own
    lightning_perf callbacks, or both; and why the suite could not be attached, if it could not."""
    notes: List[str] = []
    dropped = {str(name) for event in events if event.get("event") == "left_alone"
               for name in (event.get("dropped") if isinstance(event.get("dropped"), list) else [])}
    for event in events:
        if event.get("event") == "attached" and isinstance(event.get("callbacks"), list):
            # less those dropped at set-up: the module's configure_callbacks gave the Trainer its own
            added = [str(name) for name in event["callbacks"] if str(name) not in dropped]
            own = [name for name in SUITE if name not in added]
            if not added:
                notes.append("the config's own lightning_perf callbacks (the matrix attached none)")
            else:
                notes.append(f"{', '.join(added)} attached by the matrix"
                             + (f", the config's own {', '.join(own)}" if own else ""))
        elif event.get("event") == "failed" and event.get("reason"):
            notes.append(f"not measured by the matrix's callbacks: {event['reason']}")
    return "; ".join(dict.fromkeys(notes)) or None


def written_elsewhere(events: List[Dict[str, Any]], summary_path: str) -> Optional[str]:
    """The fit summary the variant's Trainer wrote elsewhere (its callbacks name their own ``summary_path``), when
    none is at ``summary_path``."""
    if os.path.lexists(summary_path):
        return None
    for event in events:
        if event.get("event") == "written" and event.get("trainer") == 1:
            for path in event.get("paths") or []:
                if isinstance(path, str) and os.path.isfile(path):
                    return path
    return None


def _remove_partial_copy(path: str) -> None:
    """Removes what a failed copy left at ``path`` (a cut-off file that no reader should take for the variant's
    summary); nothing stood there before the copy, so a regular file there is the copy's own."""
    try:
        if os.path.isfile(path) and not os.path.islink(path):
            os.unlink(path)
    except OSError:
        pass


def variant_dir(out_dir: str, name: str) -> str:
    """The folder of variant ``name``: directly under ``out_dir``, never elsewhere, whatever the name."""
    if (not name or name in (os.curdir, os.pardir) or "\0" in name
            or any(sep and sep in name for sep in (os.sep, os.altsep, "/", "\\"))):
        raise ValueError(f"--variant {name!r} cannot name a folder under --out")
    return os.path.join(out_dir, name)


def check_outputs(out_dir: str, variants: List[Tuple[str, List[str]]]) -> None:
    """Before any variant runs: ``out_dir`` is a folder we can write, and each variant's folder, summary and log are
    a folder and regular files (or nothing yet). Raises ``ValueError`` with a one-line reason."""
    from lightning_perf.summary.io import probe_folder, special_kind

    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir!r} is {special_kind(out_dir) or 'a file'}; expected a folder")
    try:
        probe_folder(os.path.join(out_dir, "perf_summary.json"))
    except (OSError, ValueError) as err:
        raise ValueError(f"--out {out_dir!r} cannot be written: {getattr(err, 'strerror', None) or err}") from None
    for name, _ in variants:
        run_dir = variant_dir(out_dir, name)
        if os.path.lexists(run_dir) and not os.path.isdir(run_dir):
            raise ValueError(f"--variant {name!r}: {run_dir!r} is {special_kind(run_dir) or 'a file'}; expected a"
                             " folder")
        for file_name in ("perf_summary.json", "output.log"):
            kind = special_kind(os.path.join(run_dir, file_name))
            if kind is not None:
                raise ValueError(f"--variant {name!r}: {os.path.join(run_dir, file_name)!r} is {kind}, not a"
                                 " regular file; lightning_perf replaces only regular files")


def with_noise_floor(variants: List[Tuple[str, List[str]]], how: str = "auto", flag: str = "--variant",
                     first: str = "baseline", plural: str = "variants", max_name: int = MAX_VARIANT_NAME
                     ) -> Tuple[List[Tuple[str, List[str]]], Optional[str]]:
    """The variants with the A/A pair's second baseline, and its name. ``how``: ``auto`` (a variant with the
    baseline's overrides is that copy; else ``<baseline>_aa`` is added last, with the baseline's overrides), ``off``
    (none), or the name of a given variant to use as the copy (e.g. ``baseline2=--seed_everything=0``). ``flag``,
    ``first`` and ``plural`` word the error for the command that calls it (``race`` takes ``--cmd``s)."""
    if not variants or how == "off":
        return list(variants), None
    base_name, base_overrides = variants[0]
    names = [name for name, _ in variants]
    if how != "auto":
        if how == base_name or how not in names:
            raise ValueError(f"--noise-floor {how!r}: expected auto, off or the name of a {flag} other than the"
                             f" {first} ({base_name}); the {plural} are {', '.join(names)}")
        return list(variants), how
    same = next((name for name, overrides in variants[1:] if overrides == base_overrides), None)
    if same is not None:
        return list(variants), same
    copy = next(n for n in (f"{base_name}_aa", *(f"{base_name}_aa{i}" for i in range(2, 100))) if n not in names)
    if len(copy) > max_name:
        copy = "aa_copy"
    return list(variants) + [(copy, list(base_overrides))], copy


def run_matrix(script: str, variants: List[Tuple[str, List[str]]], out_dir: str, config: Optional[str] = None,
               python: str = sys.executable, timeout_s: Optional[float] = None,
               log=print, repeats: int = 1, budget_s: Optional[float] = None,
               threads: Optional[Dict[str, Any]] = None, trial: Optional[str] = None,
               until: Optional[Callable[[List[Dict[str, Any]]], bool]] = None) -> List[Dict[str, Any]]:
    """Runs each variant in its own process; returns one result per variant (summary or the reason it has none).

    With ``repeats`` > 1 the variants run that many rounds, interleaved (A B C, then C B A, then A B C, ...: drift
    on the machine lands on every variant alike), each run in a fresh process; the first round's runs are the
    results, the later rounds' go in each result's ``repeats`` (their files in ``<out_dir>/<name>/repeat_<k>``).
    With ``budget_s``, a round starts only when it is expected to end within the budget (:func:`run_rounds`); each
    result's ``rounds`` says how many ran and why the others did not. With ``until`` (``--repeats auto``),
    ``repeats`` is the cap on rounds and ``until(results so far)`` after each round ends them when True.

    A result's ``summary_path`` is the variant's own file, ``<out_dir>/<name>/perf_summary.json``. Where the
    config's callbacks wrote their summary elsewhere, ``summary_from`` names that file and the matrix copies it to
    ``summary_path``; when the copy fails, ``summary`` still holds the figures read from ``summary_from`` right after
    the variant, ``summary_path`` is None (no file holds them for certain: the next variant may overwrite
    ``summary_from``) and ``summary_path_reason`` says why."""
    check_outputs(out_dir, variants)
    check_repeats(repeats, budget_s)
    overrides_of = dict(variants)

    def run_one(name: str, k: int) -> Dict[str, Any]:
        run_dir = variant_dir(out_dir, name) if k == 1 else os.path.join(variant_dir(out_dir, name), f"repeat_{k}")
        return _run_variant(script, name, overrides_of[name], run_dir, config, python, timeout_s, log, threads,
                            trial)

    def as_results(info: Dict[str, Any]) -> List[Dict[str, Any]]:
        rounds = {key: value for key, value in info.items() if key != "results"}
        rounds["threads"] = threads
        results = []
        for name, _ in variants:
            first, *later = info["results"][name]
            first = dict(first)
            if repeats > 1:
                first["repeats"] = later
            first["rounds"] = rounds
            results.append(first)
        return results

    def asked(sofar: Dict[str, Any]) -> bool:
        return until(as_results(dict(sofar, rule="sequential", planned=repeats)))  # type: ignore[misc]

    info = run_rounds([name for name, _ in variants], repeats, run_one, budget_s=budget_s, log=log, what="matrix",
                      until=None if until is None else asked)
    return as_results(info)


def _run_variant(script: str, name: str, overrides: List[str], run_dir: str, config: Optional[str], python: str,
                 timeout_s: Optional[float], log, threads: Optional[Dict[str, Any]] = None,
                 trial: Optional[str] = None) -> Dict[str, Any]:
    """One run of one variant in its own process, in ``run_dir``: its result."""
    os.makedirs(run_dir, exist_ok=True)
    summary_path = os.path.join(run_dir, "perf_summary.json")
    if os.path.isfile(summary_path):  # an earlier run's file: this run writes its own (never a pipe or device)
        os.unlink(summary_path)
    cmd = variant_command(python, script, config, overrides, run_dir)
    log(f"[matrix] {name}: {' '.join(shlex.quote(c) for c in cmd)}")
    # in the variant's folder, already checked writable (a temporary folder that is not would end the matrix)
    manifest = os.path.join(run_dir, ".lightning_perf_manifest.jsonl")
    open(manifest, "w").close()
    try:
        env = variant_env(summary_path, manifest, threads, trial)
        start = time.perf_counter()
        with open(os.path.join(run_dir, "output.log"), "w") as out:
            # in a group of its own: a timeout or a Ctrl-C ends every process the variant started
            code: Optional[int] = run_in_group(cmd, out, env, timeout_s)
        wall = time.perf_counter() - start
        events = read_manifest(manifest)
    finally:
        try:
            os.unlink(manifest)
        except OSError:
            pass
    result: Dict[str, Any] = {"name": name, "overrides": overrides, "exit_code": code, "wall_s": wall,
                              "summary_path": summary_path, "summary": None, "log": out.name,
                              "measured_with": _callbacks_note(events)}
    if result["measured_with"]:
        log(f"[matrix] {name}: measured with {result['measured_with']}")
    read_from = summary_path
    elsewhere = written_elsewhere(events, summary_path)
    if elsewhere is not None:  # each variant keeps its own copy: the next one may write the same file again
        result["summary_from"] = read_from = elsewhere
        try:
            shutil.copyfile(elsewhere, summary_path)
            log(f"[matrix] {name}: the config's callbacks wrote their summary to {elsewhere}; copied to"
                f" {summary_path}")
        except OSError as err:
            _remove_partial_copy(summary_path)
            # read now, before the next variant runs, but recorded nowhere: the next one may overwrite the file
            result["summary_path"] = None
            result["summary_path_reason"] = (f"not copied to {summary_path} ({err.strerror or err}); the figures"
                                             f" were read from {elsewhere} right after the variant, a file the"
                                             " next variant may overwrite")
            log(f"[matrix] {name}: the config's callbacks wrote their summary to {elsewhere}; read there, but"
                f" not copied to {summary_path} ({err.strerror or err}), so the variant keeps no summary file of"
                " its own: the next variant may overwrite that one")
    try:
        result["summary"] = load_summary(read_from)
    except SummaryError as err:
        result["problem"] = str(err)
    log(f"[matrix] {name}: exit {code}, {wall:.1f} s")
    return result


def _status(result: Dict[str, Any], summary: Optional[PerfSummary]) -> str:
    if result["exit_code"] is None:
        return "timed out"
    if summary is None and result["exit_code"] == 0 and result.get("problem") and "no such file" not in result["problem"]:
        return f"summary unreadable: {result['problem']}"  # the run ended well; its file breaks the definition
    if summary is None:
        tail = ""
        try:
            with open(result["log"], errors="replace") as fh:
                lines = [ln.strip() for ln in fh.read().splitlines() if ln.strip()]
            tail = lines[-1][:120] if lines else ""
        except OSError:
            pass
        oom = "out of memory" in tail.lower()
        return ("OOM" if oom else f"crashed (exit {result['exit_code']})") + (f": {tail}" if tail and not oom else "")
    if summary.status != "completed":
        message = (summary.error.message if summary.error is not None else None) or ""
        return ("OOM" if "out of memory" in message.lower() else summary.status) + (
            f": {message[:120]}" if message and "out of memory" not in message.lower() else "")
    return "completed"


def _typed(result: Dict[str, Any]) -> Optional[PerfSummary]:
    """The variant's summary as a typed object, or None when it has none."""
    if result.get("summary") is None:
        return None
    return as_summary(result["summary"], result.get("summary_path") or result["name"])


#: Ways to pick the Best variant: the whole fit at the run's length, or the speed per measured iteration.
BEST_BY = ("end-to-end", "steady")
#: A completed variant slower than the baseline by more than this factor is flagged.
SLOW_FACTOR = 3.0


def _end_to_end(base: PerfSummary, run: PerfSummary) -> Tuple[Optional[float], Optional[float], Optional[str]]:
    """(iterations, seconds, reason): the run's whole fit projected to the baseline's length, the same samples where
    the two process different samples per iteration."""
    n = base.iteration_timer.iterations if base.iteration_timer is not None else None
    if not n:
        return None, None, "the baseline ran no iteration"
    spi_b, spi_r = speed(base)["samples_per_iter"], speed(run)["samples_per_iter"]
    if spi_b and spi_r and abs(spi_b - spi_r) > 0.01 * spi_b:
        n = n * spi_b / spi_r
    seconds, reason = end_to_end_time(warmup_section(run), n)
    return n, seconds, reason


def _within(name: str, r: Dict[str, Any]) -> str:
    """``psnr 25.10 vs 26.20 (-4.20%, 0.5% allowed)``: one metric against the baseline variant's."""
    pct = f"{r['delta_pct']:+.2f}%, " if r["delta_pct"] is not None else ""
    allowed = f"{100 * r['tolerance']:g}%" if r["tolerance_mode"] == "relative" else f"{r['tolerance']:g}"
    return f"{name} {r['value']:.4g} vs {r['baseline']:.4g} ({pct}{allowed} allowed)"


def quality_verdict(base: Optional[PerfSummary], run: PerfSummary, is_base: bool, base_name: str = "the baseline",
                    tolerance: float = DEFAULT_TOLERANCE, noise: Optional[Dict[str, float]] = None
                    ) -> Tuple[Optional[bool], str]:
    """(verdict, note) of a variant's quality: its own QualityGate's verdict, and each metric the baseline variant
    scored gated against the baseline's value (``tolerance`` relative, the bad way only). The note starts with what
    happened: ``passed:``, ``FAILED:``, ``not checked:`` (a gate ran and could not decide: a metric the baseline
    scored and this variant did not, its own gate's reason, a gate that compared different validation sets, a
    tolerance below the run-to-run noise, or a variant whose data order differs), ``no gate ran:`` or, for the
    baseline, ``reference:``. The verdict is None unless a gate decided: a gate that checked nothing says nothing
    about the model.

    ``noise``: metric -> how far (%) the baseline's own runs moved it (its A/A copy, its repeats); where that is
    beyond the tolerance, the metric is "not checked" (the tolerance is below the run-to-run noise), never FAILED.
    A variant run with another ``num_workers`` than the baseline sees its data in another order: a metric beyond
    the tolerance there is "not checked" too (the order's change, not the variant's)."""
    own = run.quality_gate
    if own is None:
        return None, "no gate ran: the variant's run has no QualityGate"
    failed, unchecked, passed = [], [], []
    if own.passed and own.images_scored is not None and own.baseline_images is not None and (
            own.images_scored != own.baseline_images):
        unchecked.append(f"its own gate scored {own.images_scored} images against its baseline's"
                         f" {own.baseline_images}: different validation sets, so its pass says nothing")
    elif own.failed_check_count or (own.passed is False and not own.reason):
        failed.append(f"its own gate failed {own.failed_check_count or 'a'} check"
                      + ("s" if (own.failed_check_count or 1) != 1 else ""))
    elif own.passed is False:
        unchecked.append(f"its own gate: {own.reason}")
    elif own.passed:
        passed.append("its own gate passed")
    mine, theirs = quality(run), quality(base) if base is not None and not is_base else {}
    scored = [g.images_scored if g is not None else None for g in (run.quality_gate,
                                                                    base.quality_gate if base else None)]
    if theirs and None not in scored and scored[0] != scored[1]:
        unchecked.append(f"it scored {scored[0]} validation images, {base_name} {scored[1]}: different validation"
                         " sets")
        theirs = {}
    workers = (run.run.num_workers, base.run.num_workers) if base is not None and not is_base else (None, None)
    reordered = None not in workers and workers[0] != workers[1]
    for name, entry in mine.items():  # no value: a verdict of its gate (NaN: a diverged model), or not scored
        if finite(entry.value) is None:
            (failed if entry.passed is False else unchecked).append(f"{name} {entry.reason or 'has no value'}")
    for name, entry in theirs.items():
        if finite(entry.value) is None or (name in mine and finite(mine[name].value) is None):
            continue
        value = mine[name].value if name in mine else None
        if value is None:
            unchecked.append(f"{name} not measured in this variant")
            continue
        mode = entry.mode or IMAGE_METRIC_DIRECTIONS.get(name)
        if mode not in ("max", "min"):
            continue
        result = verdict(value, entry.value, mode, tolerance, relative=True)
        moved = (noise or {}).get(name)
        if moved is not None and moved > 100.0 * tolerance:
            unchecked.append(f"{name}: the {100 * tolerance:g}% tolerance is below the run-to-run noise (A/A moved"
                             f" {name} by {moved:.1f}%)")
        elif not result["passed"] and reordered:
            unchecked.append(f"{_within(name, result)}: num_workers {workers[0]} against"
                             f" {possessive(base_name)} {workers[1]}"
                             " changes the data order, and a change of order moves the metric too; gate it against"
                             " a baseline run with the same num_workers")
        else:
            (passed if result["passed"] else failed).append(_within(name, result))
    if not is_base and base is not None and not any(finite(e.value) is not None for e in theirs.values()):
        unchecked.append(f"nothing to gate against: {base_name} scored no quality metric")
    if failed:
        return False, "FAILED: " + "; ".join(failed)
    if unchecked:
        return None, "not checked: " + "; ".join(unchecked)
    if is_base:
        scored = [name for name, entry in mine.items() if finite(entry.value) is not None]
        if scored:
            return True, (f"reference: the other variants' {', '.join(scored)} are gated against these"
                          + ("; its own gate passed" if passed else ""))
    if passed:
        return True, "passed: " + "; ".join(passed)
    return None, "no gate ran: the variant's QualityGate scored no metric the baseline scored"


def quality_noise(base: PerfSummary, again: Sequence[PerfSummary]) -> Dict[str, float]:
    """Metric -> how far (%, of the baseline's value) the baseline's setup moved it by itself: its A/A copy's runs
    and its own repeats against its first run; metrics no second run scored are left out."""
    out: Dict[str, float] = {}
    mine = quality(base)
    for run in again:
        for name, entry in quality(run).items():
            first = mine.get(name)
            if first is None or finite(first.value) is None or finite(entry.value) is None or not first.value:
                continue
            moved = 100.0 * abs(entry.value - first.value) / abs(first.value)
            out[name] = max(out.get(name, 0.0), moved)
    return out


def matrix_rows(results: List[Dict[str, Any]], quality_tolerance: float = DEFAULT_TOLERANCE,
                noise_floor: Optional[str] = None, min_effect_pct: float = MIN_EFFECT_PCT,
                same_within_pct: float = DEFAULT_EQUIVALENCE_PCT) -> List[Dict[str, Any]]:
    """One row per variant: the end-to-end time (the whole fit, warm-up and evaluation included, at the baseline's
    length) and its speedup, total time (train + eval, what seed 002's "Time (s)" meant), train time, the warm-up
    cost, the steady-state headline speedup with its CI (none for the baseline itself), the break-even, samples/s,
    peak memory, per-epoch times (``epoch_1_s``, ...), PSNR, the quality verdict (``quality_gate``, with
    ``quality_gate_note``: see :func:`quality_verdict`; ``quality_tolerance`` relative), a status that flags a crash,
    an OOM, a timeout, a failed or unchecked quality gate, and ``flag`` for a completed variant more than 3x slower than
    the baseline.

    With repeats (``run_matrix(repeats=...)``) both speedups are ratios of geometric means over the runs, with their
    intervals from the spread between runs, and each row has a verdict on each basis against the A/A noise floor of
    the variant named ``noise_floor`` (the baseline's second copy): see :mod:`lightning_perf.bench.matrix_verdicts`."""
    typed = [_typed(r) for r in results]
    # a variant's later rounds (``run_matrix(repeats=...)``): the runs behind its between-run interval
    again = [[s for s in (_typed(rep) for rep in r.get("repeats") or []) if s is not None] for r in results]
    base = next((s for s in typed if s is not None), None)
    base_again = next((a for s, a in zip(typed, again) if s is not None), [])
    done_again = [[x for x in a if x.status == "completed"] for a in again]  # a failed run's speed: no figure
    base_done = [x for x in base_again if x.status == "completed"]
    base_name = next((r["name"] for r, s in zip(results, typed) if s is not None), "the baseline")
    base_end = _end_to_end(base, base)[1] if base is not None else None
    aa_runs = [x for r, s, a in zip(results, typed, done_again) if noise_floor and r["name"] == noise_floor
               and s is not None for x in [s] + a]
    noise = quality_noise(base, base_done + aa_runs) if base is not None else {}
    rows = []
    for r, s, s_again, s_done in zip(results, typed, again, done_again):
        row: Dict[str, Any] = {"variant": r["name"], "status": _status(r, s), "overrides": " ".join(r["overrides"]),
                               "wall_s": r["wall_s"], "baseline": s is not None and s is base}
        if r.get("rounds"):  # the rounds of run_matrix: how many ran of those asked (the CSV), and why (findings)
            row.update(_rounds=r["rounds"], rounds_done=r["rounds"]["done"], rounds_planned=r["rounds"]["planned"])
        if s is not None:
            repeated = s is not base and (base_done or s_done)
            cmp = (compare_summaries(base, s, base_repeats=base_done if repeated else (),
                                     candidate_repeats=s_done if repeated else ()) if base is not None else {})
            timer = s.iteration_timer
            train = timer.train_time_s if timer is not None else None
            evaluation = timer.eval_time_s if timer is not None else None
            psnr = quality(s).get("psnr")
            gate, note = quality_verdict(base, s, s is base, base_name, quality_tolerance, noise)
            row.update(
                total_time_s=None if train is None else finite(train + (evaluation or 0.0)),
                train_time_s=train,
                eval_time_s=evaluation,
                ms_per_iter=speed(s)["ms_per_iter_mean"],
                samples_per_s=timer.samples_per_s if timer is not None else None,
                speedup=cmp.get("speedup"),
                speedup_basis=cmp.get("speedup_basis"),
                speedup_ci_low=(cmp.get("speedup_ci95") or [None, None])[0],
                speedup_ci_high=(cmp.get("speedup_ci95") or [None, None])[1],
                speedup_significant=cmp.get("speedup_significant"),
                runs=1 + len(s_again),
                peak_memory_mb=train_peak_mb(s),
                tflops_per_s=timer.tflops_per_s if timer is not None else None,
                mfu_pct=timer.mfu_pct if timer is not None else None,
                psnr=psnr.value if psnr is not None else None,
                quality_gate=gate,
                quality_gate_note=note,
                contention=contention_line(contention(s)),
            )
            epochs = (timer.epochs if timer is not None else None) or []
            for i, epoch in enumerate(epochs, start=1):
                row[f"epoch_{i}_s"] = epoch.time_s if epoch is not None else None
            if row["status"] == "completed" and row["quality_gate"] is False:
                row["status"] = "quality gate FAILED"
            elif row["status"] == "completed" and note.startswith("not checked"):
                row["status"] = "quality gate not checked"
            _add_warmup(row, base, s, base_end, cmp.get("break_even"))
            _add_rates(row, base, [s] + s_again, cmp.get("speedup_basis"))
            done = [x for x in [s] + s_done if x.status == "completed"] or [s]
            row["_memory_runs"] = [train_peak_mb(x) for x in done]
            train = (s.vram.phases or {}).get("train") if s.vram is not None else None
            row["_memory_source"] = "allocator" if train is not None and train.peak_allocated_mb is not None else (
                "process")
            row["_warmup_runs"] = [warmup_cost(warmup_section(x))[0] for x in done]
            if s.status != "completed" or base.status != "completed":  # a crash's speed: of the steps before it
                row.update({key: None for key in ("speedup", "speedup_ci_low", "speedup_ci_high",
                                                  "speedup_significant", "end_to_end_speedup")})
        rows.append(row)
    add_verdicts(rows, noise_floor, min_effect_pct)
    add_sequential_verdicts(rows, noise_floor, min_effect_pct, same_within_pct)  # --repeats auto
    return rows


def _add_rates(row: Dict[str, Any], base: Optional[PerfSummary], runs: List[PerfSummary],
               basis: Optional[str]) -> None:
    """Each run's rate, for the verdicts between runs (kept out of the CSV: keys start with '_'): steady (its/s, and
    samples/s for rows of other batch sizes) and end to end (1 / the whole fit's seconds at the baseline's length)."""
    # a run whose fit did not complete (a crash, an interrupt) decides nothing: no rate, its why in the verdict
    row["_statuses"] = [run.status for run in runs]
    done = [run if run.status == "completed" else None for run in runs]
    row["_steady_rates"] = [run and run_speed(run, basis or "it/s") for run in done]
    row["_samples_rates"] = [run and run_speed(run, "samples/s") for run in done]
    seconds = [_end_to_end(base, run)[1] if base is not None and run is not None else None for run in done]
    row["_end_to_end_rates"] = [None if finite(t) is None or t <= 0 else 1.0 / t for t in seconds]


def _add_warmup(row: Dict[str, Any], base: Optional[PerfSummary], run: PerfSummary, base_end: Optional[float],
                be: Optional[Dict[str, Any]]) -> None:
    """The row's end-to-end time and speedup, warm-up cost, break-even against the baseline, and the slow flag."""
    n, seconds, reason = _end_to_end(base, run) if base is not None else (None, None, "no baseline")
    row.update(end_to_end_iterations=n, end_to_end_s=seconds,
               end_to_end_speedup=None if seconds is None else ratio(base_end, seconds),
               end_to_end_reason=reason, warmup_cost_s=(be or {}).get("warmup_cost_s", {}).get("candidate"))
    if row["baseline"]:
        row.update(speedup_ci_low=None, speedup_ci_high=None)  # the baseline against itself: no interval
        be = None
    row.update(break_even=(be or {}).get("verdict"), break_even_iterations=(be or {}).get("iterations"),
               break_even_s=(be or {}).get("seconds"), extra_warmup_s=(be or {}).get("extra_warmup_s"),
               break_even_reason=(be or {}).get("reason"))
    row["flag"] = None
    if row["status"] == "completed":
        for key, what in (("end_to_end_speedup", "end to end"), ("speedup", "per iteration")):
            if row.get(key) and row[key] < 1.0 / SLOW_FACTOR:
                row["flag"] = f"{1.0 / row[key]:.1f}x slower than the baseline {what}"
                break


def _break_even_of(row: Dict[str, Any]) -> Dict[str, Any]:
    return {"verdict": row.get("break_even"), "iterations": row.get("break_even_iterations"),
            "seconds": row.get("break_even_s"), "extra_warmup_s": row.get("extra_warmup_s"),
            "reason": row.get("break_even_reason")}


def _check_best_by(best_by: str) -> str:
    if best_by not in BEST_BY:
        raise ValueError(f"--best-by {best_by!r}: expected one of {', '.join(BEST_BY)}")
    return best_by


def _rank_key(best_by: str) -> str:
    return "end_to_end_speedup" if _check_best_by(best_by) == "end-to-end" else "speedup"


def best_variant(rows: List[Dict[str, Any]], best_by: str = "end-to-end") -> Optional[Dict[str, Any]]:
    """The fastest completed variant whose quality passed (see :func:`quality_verdict`); where no variant's passed,
    the fastest completed one of those where no gate ran (the Best line says so), never one whose gate failed or
    could not check: by the end-to-end time at the baseline's length
    (``end-to-end``, warm-up and evaluation included), or by the steady-state headline (``steady``: mean ms/iter over
    the measured iterations); samples/s (the same samples) where batch sizes differ. None when no variant has the
    figure."""
    key = _rank_key(best_by)
    ok = eligible_rows(rows, best_by)
    return max(ok, key=lambda r: r[key]) if ok else None


def eligible_rows(rows: List[Dict[str, Any]], best_by: str = "end-to-end") -> List[Dict[str, Any]]:
    """The rows :func:`best_variant` chooses from (the A/A copy of the baseline never among them)."""
    key = _rank_key(best_by)
    gated = any(r.get("quality_gate") is True for r in rows)
    ok = [r for r in rows if r["status"] == "completed" and r.get(key) and not r.get("noise_floor") and (
          r.get("quality_gate") is True or (
        not gated and str(r.get("quality_gate_note") or "no gate ran").startswith("no gate ran")))]
    return ok


def _length(row: Dict[str, Any]) -> str:
    n = row.get("end_to_end_iterations")
    return f"{n:,.0f} iterations" if isinstance(n, (int, float)) else "the baseline's length"


def _basis_words(row: Dict[str, Any], best_by: str) -> str:
    samples = row.get("speedup_basis") == "samples/s"
    if best_by == "steady":
        return ("steady state: samples/s over the measured iterations" if samples else
                "steady state: mean ms/iter over the measured iterations, warm-up and evaluation left out")
    return (f"end to end: the whole fit at {_length(row)}" + (" (the baseline's samples)" if samples else "")
            + ", warm-up and evaluation included")


def matrix_header(results: List[Dict[str, Any]], config: Optional[str] = None) -> List[str]:
    """Seed 002's header: system, device, versions, the config and the test configuration, from the summaries."""
    s = next((_typed(r) for r in results if r["summary"] is not None), None)
    if s is None:
        return []
    run, v = s.run, s.run.versions or Versions()
    steps, epochs = run.max_steps, run.max_epochs
    test = ", ".join(x for x in (f"max_steps {steps}" if steps not in (None, -1) else "",
                                 f"max_epochs {epochs}" if epochs not in (None, -1) else "") if x) or "n/a"
    samples_per_iter = speed(s)["samples_per_iter"]
    per_iter = f"{samples_per_iter:.0f} samples per iteration (baseline)" if samples_per_iter else ""
    cores = f"{run.cpu_count} CPU cores" if run.cpu_count is not None else "CPU cores n/a"
    ram = f"{run.memory_total_mb / 1024:.1f} GB RAM" if run.memory_total_mb is not None else "RAM n/a"
    others = [(r["name"], _typed(r).run.num_workers) for r in results if r["summary"] is not None]
    differ = ", ".join(f"{name}: {w}" for name, w in others if w != run.num_workers)
    workers = ("n/a" if run.num_workers is None else str(run.num_workers)) + (f" ({differ})" if differ else "")
    return [f"**System:** {run.host} ({run.platform}); device {run.device}; {cores}, {ram}",
            f"**Model:** {run.model_class or 'n/a'}; num_workers {workers}",
            f"**Versions:** torch {v.torch} (CUDA {v.cuda or 'none'}), lightning {v.lightning},"
            f" lightning_perf {v.lightning_perf}, python {v.python}",
            f"**Config:** {config or 'none'}; test configuration: {test}; precision {run.precision}"
            + (f"; {per_iter}" if per_iter else "")]


#: A first epoch this many times slower than the later ones is called a warm-up cost.
WARMUP_EPOCH_RATIO = 1.5
#: Extra warm-up above this share of the baseline's end-to-end time is a finding.
WARMUP_SHARE = 0.05
#: A combination gaining less than this share of the product of its parts' speedups is "diminishing returns".
DIMINISHING = 0.95


def findings(rows: List[Dict[str, Any]], best_by: str = "end-to-end") -> List[str]:
    """Computed from the numbers: the best by speed (``best_by``) and by memory, combinations that gain less than the
    product of their parts, variants whose warm-up (fit start to the first measured iteration) costs more than 5% of
    the baseline's whole fit beyond the baseline's own, with their break-even, and variants whose first epoch is much
    slower than the later ones."""
    out: List[str] = []
    ok = [r for r in rows if r["status"] == "completed" and r.get("speedup")]
    base = next((r for r in rows if r.get("baseline")), rows[0] if rows else None)
    out += verdict_findings(rows, best_by)
    out += trial_line_findings(rows, best_by)  # a switch within noise: the run that tries it inside one fit
    with_memory = [r for r in ok if r.get("peak_memory_mb") and not r.get("noise_floor")]  # the A/A copy: no choice
    if len(with_memory) >= 2:
        out.append(least_memory(with_memory))
    speed = {r["variant"]: r["speedup"] for r in ok}
    for r in ok:
        parts = r["variant"].split("+")
        if len(parts) < 2 or not all(p in speed for p in parts):
            continue
        product = 1.0
        for p in parts:
            product *= speed[p]
        if finite(product) is not None and r["speedup"] < DIMINISHING * product:
            out.append(f"Diminishing returns: {r['variant']} gains {r['speedup']:.2f}x, less than its parts together"
                       f" ({' x '.join(f'{speed[p]:.2f}' for p in parts)} = {product:.2f}x).")
    base_end = base.get("end_to_end_s") if base is not None else None
    for r in ok:
        extra = r.get("extra_warmup_s")
        if r.get("baseline") or extra is None or not base_end or extra <= WARMUP_SHARE * base_end:
            continue
        end = r.get("end_to_end_speedup")
        # two runs of one start-up code can differ by 0.2 s: a difference within the spread of runs is said so
        decided = "in every run" if _warmup_decided(r, base) else "(not decided: one run each, or their runs overlap)"
        out.append(f"Warm-up cost: {possessive(r['variant'])} warm-up (the fit's start to its first measured iteration:"
                   " compilation, autotuning such as cudnn.benchmark, caches) is"
                   f" {extra:.2f} s longer than {possessive(base['variant'])} {decided}: {ratio_text(r['speedup'])} per"
                   f" iteration, {'n/a' if end is None else ratio_text(end)} end to end at {_length(r)};"
                   f" {_break_even_words(r, base)}.")
    for r in rows:
        epochs = [r[k] for k in sorted((k for k in r if k.startswith("epoch_") and k.endswith("_s")),
                                       key=lambda k: int(k.split("_")[1])) if r[k]]
        if len(epochs) >= 2:
            later = sum(epochs[1:]) / len(epochs[1:])
            if later > 0 and epochs[0] > WARMUP_EPOCH_RATIO * later:
                out.append(f"Warm-up cost: {possessive(r['variant'])} first epoch took {epochs[0] / later:.1f}x its"
                           " later ones"
                           " (autotuning such as cudnn.benchmark, compilation, caches), paid once per run.")
    out += trial_findings(rows)
    busy = [r for r in rows if r.get("contention")]
    if busy:
        out.append("Busy machine: " + "; ".join(f"{r['variant']} ({r['contention'].split(': ', 1)[1]})" for r in busy)
                   + ": their speed and every ratio against them may be the machine's, not the variant's.")
    return out


def possessive(name: str) -> str:
    """``amp's``, ``workers'``: a name's possessive (never ``workers's``)."""
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def least_memory(rows: List[Dict[str, Any]]) -> str:
    """The Least memory finding: the variant of least train peak, named only where its peak is decided below every
    other's (:func:`lightning_perf.summary.memory_floor.memory_change`: beyond the spread of repeats, or the A/A
    floor with one run each); else the variants within the floor of it."""
    def runs(r: Dict[str, Any]) -> List[Optional[float]]:
        return r.get("_memory_runs") or [r["peak_memory_mb"]]

    low = min(rows, key=lambda r: r["peak_memory_mb"])
    changes = [(r, memory_change(runs(r), runs(low), low.get("_memory_source") or "process")) for r in rows
               if r is not low]
    tied = [(r, c) for r, c in changes if c["sign"] != -1]
    if not tied:
        r, c = min(changes, key=lambda rc: abs(rc[1]["delta_mib"]))
        return (f"Least memory: {low['variant']} ({fmt_mb(low['peak_memory_mb'])} peak in training, {floor_words(c)}"
                f" than {r['variant']}, the next lowest; beyond the {c['floor_mib']:.0f} MiB floor: {c['how']}).")
    c = tied[0][1]
    names = ", ".join(f"{r['variant']} {fmt_mb(r['peak_memory_mb'])}" for r in [low] + [r for r, _ in tied])
    return (f"Least memory: not decided: {names} peak in training, within the memory noise floor of each other"
            f" ({c['floor_mib']:.0f} MiB: {c['how']}).")


def _speed_decided(row: Dict[str, Any]) -> bool:
    """The row's steady speed is decided against the baseline: only then does a warm-up pay back."""
    return row.get("steady_verdict") in (FASTER, SLOWER)


def _warmup_decided(row: Dict[str, Any], base: Dict[str, Any]) -> bool:
    """The row's warm-up differs from the baseline's beyond the spread of their runs (two runs a side or more: the
    ranges do not meet); with one run a side, never."""
    a = [v for v in row.get("_warmup_runs") or [] if finite(v) is not None]
    b = [v for v in base.get("_warmup_runs") or [] if finite(v) is not None]
    return len(a) >= 2 and len(b) >= 2 and (min(a) > max(b) or max(a) < min(b))


def _break_even_decided(row: Dict[str, Any], base: Optional[Dict[str, Any]]) -> Optional[str]:
    """None where the row's break-even rests on decided differences (its speed per iteration and its warm-up against
    the baseline's), else why it is not decided."""
    if not _speed_decided(row):
        return "the speed per iteration is not decided against the baseline's"
    if base is not None and not _warmup_decided(row, base):
        return "the warm-up differs from the baseline's by less than the spread of their runs"
    return None


def _break_even_words(row: Dict[str, Any], base: Optional[Dict[str, Any]]) -> str:
    why = _break_even_decided(row, base)
    return f"not decided: {why}, so no break-even" if why else break_even_text(_break_even_of(row))


#: Time units a column can use: (name, seconds per unit, a column's largest value below which the unit is chosen).
UNITS = (("s", 1.0, 60.0), ("min", 60.0, 3600.0), ("h", 3600.0, float("inf")))


def _unit(values: List[Any]) -> Tuple[str, float, int]:
    """One unit for a column of seconds: s below a minute, min below an hour, else h; decimals to match."""
    known = [abs(v) for v in values if finite(v) is not None]
    top = max(known, default=0.0)
    name, size, _ = next(u for u in UNITS if top < u[2])
    return name, size, 2 if top / size < 10 else 1


def _in(value: Optional[float], unit: Tuple[str, float, int]) -> str:
    return "n/a" if finite(value) is None else f"{value / unit[1]:.{unit[2]}f}"


def _break_even_cell(row: Dict[str, Any], unit: Tuple[str, float, int], base: Optional[Dict[str, Any]]) -> str:
    if row.get("baseline"):
        return "baseline"
    if _break_even_decided(row, base):
        return "not decided"
    verdict, n = row.get("break_even"), row.get("break_even_iterations")
    when = f"{n:,} it ({_in(row.get('break_even_s'), unit)} {unit[0]})" if n is not None else ""
    return {"pays_back": f"after {when}", "never": "never", "no_warmup_cost": "none needed",
            "ahead_until": f"ahead until {when}"}.get(verdict, "n/a")


def format_matrix(rows: List[Dict[str, Any]], fmt: str = "markdown", header: Optional[List[str]] = None,
                  best_by: str = "end-to-end") -> str:
    _check_best_by(best_by)
    if fmt == "csv":
        return csv_text([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
    n_epochs = max((int(k.split("_")[1]) for r in rows for k in r if k.startswith("epoch_") and k.endswith("_s")),
                   default=0)
    compute = any(r.get("tflops_per_s") is not None for r in rows)  # columns only where a variant counted FLOPs
    timed = ["end_to_end_s", "total_time_s", "train_time_s", "warmup_cost_s", "break_even_s"] + [
        f"epoch_{i}_s" for i in range(1, n_epochs + 1)]
    units = {key: _unit([r.get(key) for r in rows]) for key in timed}
    table = []
    base_row = next((r for r in rows if r.get("baseline")), None)
    for r in rows:
        if r.get("baseline"):
            speed, end = "baseline", "baseline"
        else:
            end = "-" if not r.get("end_to_end_speedup") else f"{r['end_to_end_speedup']:.2f}x" + (
                f" [{r['end_to_end_ci_low']:.2f}-{r['end_to_end_ci_high']:.2f}]" if r.get("end_to_end_ci_low") else "")
            if r.get("speedup"):
                ci = (f" [{r['speedup_ci_low']:.2f}-{r['speedup_ci_high']:.2f}]" if r.get("speedup_ci_low") else "")
                speed = f"{r['speedup']:.2f}x{ci}"
            else:
                speed = "-"
        if r.get("speedup_basis") == "samples/s":
            speed += " samples/s"
        gate = (r.get("quality_gate_note") or "no gate ran").split(":")[0]
        status = r["status"] if r["status"] == "completed" else f"⚠ {r['status']}"
        if r.get("flag"):
            status = f"⚠ {status}: {r['flag']}"
        table.append([r["variant"], _in(r.get("end_to_end_s"), units["end_to_end_s"]), end,
                      _in(r.get("total_time_s"), units["total_time_s"]),
                      _in(r.get("train_time_s"), units["train_time_s"]),
                      _in(r.get("warmup_cost_s"), units["warmup_cost_s"]),
                      fmt_num(r.get("ms_per_iter")), fmt_num(r.get("samples_per_s"), 1), speed,
                      verdict_cell(r, best_by), floor_cell(r, best_by),
                      _break_even_cell(r, units["break_even_s"], base_row), fmt_mb(r.get("peak_memory_mb"))]
                     + ([fmt_num(r.get("tflops_per_s"), 3), fmt_num(r.get("mfu_pct"), 1, "%")] if compute else [])
                     + [_in(r.get(f"epoch_{i}_s"), units[f"epoch_{i}_s"]) for i in range(1, n_epochs + 1)]
                     + [fmt_num(r.get("psnr")), gate, status])

    def unit(key: str) -> str:
        return units[key][0]

    headers = (["Variant", f"End to end ({unit('end_to_end_s')})", "End-to-end speedup",
                f"Total time (train + eval) ({unit('total_time_s')})", f"Train time ({unit('train_time_s')})",
                f"Warm-up ({unit('warmup_cost_s')})", "ms/iter (mean)", "Samples/s", "Steady speedup (95% CI)",
                f"Verdict ({'end to end' if best_by == 'end-to-end' else 'steady'})", "A/A noise floor (95% CI)",
                "Break-even", "Peak memory"] + (["TFLOP/s", "MFU"] if compute else [])
               + [f"Epoch {i} ({unit(f'epoch_{i}_s')})" for i in range(1, n_epochs + 1)]
               + ["PSNR", "Quality gate", "Status"])
    add_trial_column(headers, table, rows)
    parts = (header or []) + ([""] if header else []) + [markdown_table(headers, table)]
    parts += ["", "End to end: the whole fit (fit start to end: warm-up and evaluation included) at the baseline's"
              " length. Warm-up: from the fit's start to the first measured iteration, beyond the steady pace."
              " Steady: mean ms/iter over the measured iterations. Break-even: when a variant's faster iterations"
              " pay back its extra warm-up. Verdict: against the baseline between the rounds' runs; within noise"
              " where the interval holds 1 or reaches the A/A noise floor (the baseline's setup run again in the same"
              " rounds)."]
    found = findings(rows, best_by)
    if found:
        parts += ["", "**Findings:**"] + [f"- {f}" for f in found]
    parts += ["", _best_line(rows, best_by)]
    return "\n".join(parts)


def _best_line(rows: List[Dict[str, Any]], best_by: str) -> str:
    base = next((r for r in rows if r.get("baseline")), rows[0] if rows else None)
    best = best_variant(rows, best_by)
    ranked = [r for r in rows if r.get(_rank_key(best_by))
              and (r["status"] == "completed" or r["status"].startswith("quality gate"))]
    if best is None and ranked:  # each fast enough to rank, and none whose quality passed
        return (f"**Best:** n/a: no variant with the {best_by} figure passed its quality gate ("
                + "; ".join(f"{r['variant']}: {r.get('quality_gate_note') or 'no gate ran'}" for r in ranked) + ").")
    if best is None or base is None:
        reasons = sorted({r["end_to_end_reason"] for r in rows if r.get("end_to_end_reason")})
        why = f" ({'; '.join(reasons)})" if best_by == "end-to-end" and reasons else ""
        return f"**Best:** n/a: no completed variant has the {best_by} figure{why}."
    key, other = _rank_key(best_by), "speedup" if best_by == "end-to-end" else "end_to_end_speedup"
    other_text = "n/a" if not best.get(other) else ratio_text(best[other])
    undecided = best_words(rows, eligible_rows(rows, best_by), best_by)
    lead = "**Best:** " if undecided is None else f"**Best:** not decided: {undecided}; fastest measured: "
    if best.get("baseline"):
        line = f"{lead}{best['variant']}, by {_basis_words(best, best_by)}: the baseline itself"
    else:
        line = (f"{lead}{best['variant']}, by {_basis_words(best, best_by)}: {ratio_text(best[key])} than the"
                f" baseline ({base['variant']}); {other_text}"
                f" {'steady state' if best_by == 'end-to-end' else 'end to end'}")
    if not best.get("baseline"):
        line += f"; break-even: {_break_even_words(best, base)}"
    return line + f"; quality: {best.get('quality_gate_note') or 'no gate ran'}."
