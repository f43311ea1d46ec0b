"""``lightning-perf race``: two or more training commands (a baseline checkout and an optimised one, say) run in
interleaved rounds, each run a fresh process with the suite attached as ``lightning-perf run`` attaches it; each run's
summary in ``<out>/<name>/repeat_<k>/perf_summary.json``, and one comparison of every command against the first, the
verdict from the spread between the runs and against the A/A noise floor (the first command run again in the same
rounds)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lightning_perf._attach import DEFAULT_CALLBACKS, SUMMARY_NAME, read_manifest
from lightning_perf.bench.matrix import with_noise_floor, written_elsewhere
from lightning_perf.bench.noise_floor import (
    FASTER,
    MIN_EFFECT_PCT,
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
from lightning_perf.bench.process_group import run_in_group
from lightning_perf.bench.rounds import run_rounds, rounds_line
from lightning_perf.bench.sequential import DEFAULT_EQUIVALENCE_PCT, IN_RUN_HINT
from lightning_perf.bench.sequential import FASTER as SEQ_FASTER
from lightning_perf.bench.sequential import NO_VERDICT as SEQ_NO_VERDICT
from lightning_perf.bench.sequential import SAME as SEQ_SAME
from lightning_perf.bench.sequential import SLOWER as SEQ_SLOWER
from lightning_perf.bench.sequential import UNDECIDED as SEQ_UNDECIDED
from lightning_perf.bench.sequential import decide_rounds, round_log_ratios
from lightning_perf.bench.threads import thread_env
from lightning_perf.bench.what_would_decide import fixed_words, what_would_decide
from lightning_perf.summary.compare import compare_summaries, format_text, run_speed
from lightning_perf.summary.contention import contention, contention_line
from lightning_perf.summary.fields import finite, quality, train_peak_mb
from lightning_perf.summary.io import load_summary, probe_folder, special_kind
from lightning_perf.summary.memory_floor import floor_words, memory_change
from lightning_perf.summary.model import PerfSummary, as_summary
from lightning_perf.summary.schema import SummaryError

#: How the always-valid interval of ``--repeats auto`` is named where one is printed.
SEQUENTIAL_INTERVAL = "always valid, paired by round"

#: What would decide a race of CPU training run one command after the other, beside the in-run trial.
TOGETHER_HINT = ("(or rounds run --together, which start a round's commands at once on the same cores, or an in-run"
                 " trial, which pairs the change inside one fit: `lightning-perf run --trial ...` / ABTrial)")

#: The longest command name: it names a folder under --out.
MAX_NAME = 100


def parse_commands(specs: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """``NAME=COMMAND`` (the command split as a shell would split it, without running a shell) -> (name, argv); the
    first is the baseline. ValueError naming the bad ``--cmd``."""
    commands: List[Tuple[str, List[str]]] = []
    for spec in specs:
        name, sep, text = spec.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--cmd {spec!r}: expected NAME=COMMAND, e.g. --cmd 'baseline=python train.py'")
        if not all(c.isalnum() or c in "_-." for c in name) or name.startswith(".") or len(name) > MAX_NAME:
            raise ValueError(f"--cmd {spec[:60]!r}: the name {name[:40]!r} must be 1 to {MAX_NAME} letters, digits,"
                             " '_', '-' or '.', not starting with '.' (it names a folder under --out)")
        try:
            argv = shlex.split(text)
        except ValueError as err:
            raise ValueError(f"--cmd {spec!r}: the command cannot be split ({err})") from None
        if not argv:
            raise ValueError(f"--cmd {spec!r}: no command after '='")
        if any(n == name for n, _ in commands):
            raise ValueError(f"--cmd {name!r} is given twice; give each command its own name")
        commands.append((name, argv))
    if len(commands) < 2:
        raise ValueError(f"give at least two --cmd NAME=COMMAND to race (got {len(commands)})")
    return commands


def with_copy(commands: List[Tuple[str, List[str]]], how: str = "auto") -> Tuple[List[Tuple[str, List[str]]],
                                                                                  Optional[str]]:
    """The commands with the A/A copy of the first (``auto``: ``<name>_aa`` added, unless a command is the first's
    argv again; ``off``: none; else the name of the given command to take as the copy): the matrix's rule."""
    return with_noise_floor(commands, how, flag="--cmd", first="first", plural="commands", max_name=MAX_NAME)


def check_out(out: str, commands: List[Tuple[str, List[str]]]) -> None:
    """Before any run: ``out`` is a folder we can write, and no command's folder is something else."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ValueError(f"--out {out!r} is {special_kind(out) or 'a file'}; expected a folder")
    try:
        probe_folder(os.path.join(out, "race.json"))
    except (OSError, ValueError) as err:
        raise ValueError(f"--out {out!r} cannot be written: {getattr(err, 'strerror', None) or err}") from None
    for name, _ in commands:
        folder = os.path.join(out, name)
        if os.path.lexists(folder) and not os.path.isdir(folder):
            raise ValueError(f"--cmd {name!r}: {folder!r} is {special_kind(folder) or 'a file'}; expected a folder")


def run_once(name: str, argv: List[str], run_dir: str, callbacks: List[str], timeout_s: Optional[float],
             log: Callable[[str], None], threads: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """One run of one command in a fresh process, the suite attached, its output in ``run_dir/output.log``."""
    env, manifest = _prepared(name, argv, run_dir, callbacks, threads, log)
    code: Optional[int]
    try:
        start = time.perf_counter()
        with open(os.path.join(run_dir, "output.log"), "w") as out:
            try:  # in a group of its own: a timeout or a Ctrl-C ends every process of the command (bash -c '...')
                code = run_in_group(argv, out, env, timeout_s)
            except OSError as err:
                out.write(f"lightning-perf race: cannot run {argv[0]!r}: {err.strerror or err}\n")
                code = 127
        wall = time.perf_counter() - start
        events = read_manifest(manifest)
    finally:  # also after a Ctrl-C, once the run has ended: nothing writes to it any more
        _unlink(manifest)
    return _finished(name, run_dir, code, wall, events, log)


def run_round_together(names: Sequence[str], argv_of: Dict[str, List[str]], run_dir_of: Callable[[str], str],
                       callbacks: List[str], timeout_s: Optional[float], log: Callable[[str], None],
                       threads: Optional[Dict[str, Any]], cores: Sequence[int]) -> Dict[str, Dict[str, Any]]:
    """One round of ``--together``: every command's run at once, pinned to ``cores``
    (:func:`lightning_perf.bench.together.run_together`); each run as :func:`run_once` gives it."""
    from lightning_perf.bench.together import run_together

    prepared = {name: _prepared(name, argv_of[name], run_dir_of(name), callbacks, threads, log) for name in names}
    logs: Dict[str, Any] = {}
    try:
        for name in names:
            logs[name] = open(os.path.join(run_dir_of(name), "output.log"), "w")
        ended = run_together([(argv_of[name], logs[name], prepared[name][0]) for name in names], cores, timeout_s)
        events = {name: read_manifest(prepared[name][1]) for name in names}
    finally:
        for name in names:
            if name in logs:
                logs[name].close()
            _unlink(prepared[name][1])
    shared = _shared_elsewhere({name: written_elsewhere(events[name], os.path.join(run_dir_of(name), SUMMARY_NAME))
                                for name in names})
    return {name: _finished(name, run_dir_of(name), code, wall, events[name], log, name in shared)
            for name, (code, wall) in zip(names, ended)}


def _shared_elsewhere(elsewhere: Dict[str, Optional[str]]) -> Dict[str, str]:
    """name -> the file its own callbacks wrote their summary to, where another run of the same round wrote that file
    too: run at once, each may have overwritten the other's, so neither summary can be told apart."""
    seen: Dict[str, int] = {}
    for path in elsewhere.values():
        if path is not None:
            seen[path] = seen.get(path, 0) + 1
    return {name: path for name, path in elsewhere.items() if path is not None and seen[path] > 1}


def _prepared(name: str, argv: List[str], run_dir: str, callbacks: List[str], threads: Optional[Dict[str, Any]],
              log: Callable[[str], None]) -> Tuple[Dict[str, str], str]:
    """The run's folder made ready (an earlier race's summary removed, an empty manifest), and its environment."""
    from lightning_perf._attach.launch import command_env

    os.makedirs(run_dir, exist_ok=True)
    summary_path = os.path.join(run_dir, SUMMARY_NAME)
    if os.path.isfile(summary_path):  # an earlier race's file: this run writes its own
        os.unlink(summary_path)
    manifest = os.path.join(run_dir, ".lightning_perf_manifest.jsonl")
    # fill: a Trainer with lightning_perf callbacks of its own keeps them (and gets the others), as in the matrix
    env = command_env(os.environ, callbacks, out=os.path.abspath(run_dir), name=name, baseline=None,
                      manifest=manifest, fill=True)
    env = thread_env(env, threads)
    log(f"[race] {name}: {' '.join(shlex.quote(a) for a in argv)}")
    open(manifest, "w").close()
    return env, manifest


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _finished(name: str, run_dir: str, code: Optional[int], wall: float, events: List[Dict[str, Any]],
              log: Callable[[str], None], shared: bool = False) -> Dict[str, Any]:
    """The run's result: its exit code, seconds and summary (copied here where its own callbacks wrote it
    elsewhere), or the problem that left it without one. ``shared``: another run of its round (``--together``)
    wrote the same file elsewhere, so that file is not taken for this run's."""
    summary_path = os.path.join(run_dir, SUMMARY_NAME)
    result: Dict[str, Any] = {"name": name, "exit_code": code, "wall_s": wall, "summary_path": summary_path,
                              "summary": None, "problem": None}
    elsewhere = written_elsewhere(events, summary_path)
    ended = f"[race] {name}: " + ("timed out" if code is None else f"exit {code}") + f", {wall:.1f} s"
    if shared:
        result["problem"] = (f"its own callbacks wrote the summary to {elsewhere}, as another run of the same round"
                             " did (--together runs them at once), so it cannot be told apart: give each run its own"
                             " summary path, or race without --together")
        log(f"{ended}; {result['problem']}")
        return result
    if elsewhere is not None:  # the command's own callbacks wrote it: a copy here, before the next run overwrites it
        try:
            shutil.copyfile(elsewhere, summary_path)
            log(f"[race] {name}: its own callbacks wrote the summary to {elsewhere}; copied to {summary_path}")
        except OSError as err:
            log(f"[race] {name}: cannot copy {elsewhere} to {summary_path} ({err.strerror or err})")
    try:
        result["summary"] = load_summary(summary_path)
    except SummaryError as err:
        unmeasured = [e.get("reason") for e in events if e.get("event") == "failed" and e.get("reason")]
        result["problem"] = str(err) + (f" ({'; '.join(unmeasured)})" if unmeasured else "")
    log(ended)
    return result


def run_race(commands: List[Tuple[str, List[str]]], out: str, repeats: int, budget_s: Optional[float] = None,
             timeout_s: Optional[float] = None, callbacks: Optional[List[str]] = None,
             log: Callable[[str], None] = print, threads: Optional[Dict[str, Any]] = None,
             until: Optional[Callable[[Dict[str, Any]], bool]] = None,
             together: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Runs every command once a round, ``repeats`` rounds interleaved (:func:`run_rounds`); run ``k`` of command
    ``name`` in ``<out>/<name>/repeat_<k>``, with ``threads`` (:func:`lightning_perf.bench.threads.choose_threads`).
    With ``until`` (``--repeats auto``: :func:`decided_race`), ``repeats`` is the cap and the rounds end once it
    says every comparison is decided. With ``together`` (cores), each round's runs start at once on those cores
    (:func:`run_round_together`); ``info["together"]`` says so."""
    check_out(out, commands)
    argv_of = dict(commands)
    chosen = list(callbacks or DEFAULT_CALLBACKS)
    round_at_once = None
    if together is not None:
        cores = list(together)
        round_at_once = lambda names, k: run_round_together(  # noqa: E731
            names, argv_of, lambda name: os.path.join(out, name, f"repeat_{k}"), chosen, timeout_s, log, threads,
            cores)
    info = run_rounds([name for name, _ in commands], repeats,
                      lambda name, k: run_once(name, argv_of[name], os.path.join(out, name, f"repeat_{k}"), chosen,
                                               timeout_s, log, threads),
                      budget_s=budget_s, log=log, what="race", until=until, run_round=round_at_once)
    info["threads"] = threads
    info["together"] = None if together is None else {"cores": list(together)}
    return info


def decided_race(commands: List[Tuple[str, List[str]]], copy: Optional[str], min_effect_pct: float = MIN_EFFECT_PCT,
                 same_within_pct: float = DEFAULT_EQUIVALENCE_PCT) -> Callable[[Dict[str, Any]], bool]:
    """``run_race``'s ``until`` for ``--repeats auto``: after a round, True where every command but the A/A copy
    has a decided sequential verdict (faster, slower, the same, or none where the A/A pair drifted), or no verdict
    at all (no completed run on one side: more rounds of a failing command decide nothing)."""
    def until(sofar: Dict[str, Any]) -> bool:
        found = race_result(commands, dict(sofar, rule="sequential"), copy, min_effect_pct, same_within_pct)
        return all((cmp.get("sequential") or {}).get("verdict") != SEQ_UNDECIDED
                   for name, cmp in found["comparisons"].items() if name != copy)
    return until


def race_result(commands: List[Tuple[str, List[str]]], info: Dict[str, Any], copy: Optional[str],
                min_effect_pct: float = MIN_EFFECT_PCT, same_within_pct: float = DEFAULT_EQUIVALENCE_PCT
                ) -> Dict[str, Any]:
    """The comparison of every command against the first (compare's result between runs, and the verdict against
    the noise floor), the noise floor, the best or the ties, and each run's status."""
    runs = info["results"]
    base_name = commands[0][0]
    # a failed or interrupted run decides nothing: its speed is of the steps before the crash
    typed = {name: [as_summary(r["summary"], r["summary_path"]) for r in runs[name] if _completed(r)]
             for name, _ in commands}
    out: Dict[str, Any] = {"baseline": base_name, "noise_floor_copy": copy,
                           "rounds": {k: v for k, v in info.items() if k != "results"},
                           "runs": {name: [_run_record(r) for r in runs[name]] for name, _ in commands},
                           "comparisons": {}, "noise_floor": None, "best": None, "tie": []}
    rates: Dict[str, List[Optional[float]]] = {}
    for name, _ in commands:
        if name == base_name:
            continue
        if not typed[name] or not typed[base_name]:  # a verdict line all the same, saying why there is no speed
            why = _no_speed(name, runs[name]) if not typed[name] else (
                f"the baseline's runs: {_no_speed(base_name, runs[base_name])}")
            out["comparisons"][name] = {"verdict": {"verdict": NO_VERDICT, "why": why}, "between_runs": None}
            continue
        base_runs, cand_runs = typed[base_name], typed[name]
        cmp = compare_summaries(base_runs[0], cand_runs[0], base_name=base_name, candidate_name=name,
                                min_effect_pct=min_effect_pct, base_repeats=base_runs[1:],
                                candidate_repeats=cand_runs[1:], shared_cores=bool(info.get("together")))
        basis = cmp["speedup_basis"] or "it/s"
        rates[name] = [run_speed(r, basis) for r in cand_runs]
        rates.setdefault(f"{base_name}@{basis}", [run_speed(r, basis) for r in base_runs])
        out["comparisons"][name] = cmp
    floor = None
    if copy is not None and copy in rates:
        basis = out["comparisons"][copy]["speedup_basis"] or "it/s"
        floor = noise_floor(rates[copy], rates[f"{base_name}@{basis}"],
                            by_rounds=_every_round(runs[copy], info) and _every_round(runs[base_name], info))
        out["noise_floor"] = floor
    for name, cmp in out["comparisons"].items():
        if name not in rates:
            continue
        basis = cmp["speedup_basis"] or "it/s"
        copies = [[run_speed(r, basis) for r in typed[copy]]] if copy in typed and name != copy else []
        setups = [name, base_name] + ([copy] if copies else [])
        # against the baseline's setup's runs (and its copy's), within rounds where every run of them has a summary
        between = shift_by_rounds(rates[name], [rates[f"{base_name}@{basis}"]] + copies,
                                  by_rounds=all(_every_round(runs[n], info) for n in setups))
        cmp["verdict"] = decide(between, None if name == copy else floor, min_effect_pct)
        cmp["between_runs"] = between
        if info.get("rule") == "sequential":  # --repeats auto: the always-valid interval, round by round
            _sequential_verdict(cmp, name, runs, typed, base_name, copy, basis, min_effect_pct, same_within_pct)
        elif name != copy:
            _fixed_what_would_decide(cmp, name, runs, typed, base_name, copy, basis)
    if not info.get("together") and _all_on_cpu(runs):
        _offer_together(out["comparisons"], copy)
    out["memory"], out["quality"] = _memory_verdicts(typed, base_name, copy), _quality_verdicts(typed, base_name, copy)
    pool = {name: [run_speed(r, "samples/s") for r in typed[name] + (typed.get(copy, []) if name == base_name else [])]
            for name, _ in commands if name != copy and typed[name]}
    if len(pool) >= 2 and all(len([v for v in values if v]) >= 2 for values in pool.values()):
        found = best_or_tie(pool, floor, min_effect_pct)
        out["best"], out["tie"] = found["best"], found["tie"]
    return out


def _round_rates(runs: List[Dict[str, Any]], basis: str) -> List[Optional[float]]:
    """A command's rate in each round that ran (None where its run did not complete)."""
    return [run_speed(as_summary(r["summary"], r["summary_path"]), basis) if _completed(r) else None for r in runs]


def _sequential_verdict(cmp: Dict[str, Any], name: str, runs: Dict[str, List[Dict[str, Any]]],
                        typed: Dict[str, Any], base: str, copy: Optional[str], basis: str, min_effect_pct: float,
                        same_within_pct: float) -> None:
    """``--repeats auto``: the verdict from the per-round log-ratios against the baseline (and its A/A copy's run of
    the same round) by the always-valid interval (:func:`lightning_perf.bench.sequential.decide_rounds`);
    ``sequential`` keeps it whole, ``verdict`` and ``between_runs`` say it as the fixed design's do."""
    mine = _round_rates(runs[name], basis)
    refs = [_round_rates(runs[base], basis)]
    with_copy = copy is not None and copy in typed and name != copy
    if with_copy:
        refs.append(_round_rates(runs[copy], basis))
    floor_diffs = round_log_ratios(refs[1], [refs[0]]) if with_copy else None
    found = decide_rounds(round_log_ratios(mine, refs), floor_diffs, same_within_pct, min_effect_pct)
    cmp["sequential"] = found
    same = f"the same within +/-{same_within_pct:g}%"
    verdict = {SEQ_FASTER: FASTER, SEQ_SLOWER: SLOWER, SEQ_SAME: same,
               SEQ_NO_VERDICT: NO_VERDICT}.get(found["verdict"], WITHIN_NOISE)
    cmp["verdict"] = {"verdict": verdict, "why": "" if verdict == same else found["why"]}
    cmp["between_runs"] = {"ratio": found["ratio"], "low": found["low"], "high": found["high"],
                           "runs": (found["rounds"], found["rounds"]), "method": SEQUENTIAL_INTERVAL,
                           "round_drift_f": None}


def _all_on_cpu(runs: Dict[str, List[Dict[str, Any]]]) -> bool:
    """Every run with a summary trained on the CPU (and one did at least): ``--together`` suits the race."""
    devices = [((r["summary"] or {}).get("run") or {}).get("accelerator") for rs in runs.values() for r in rs
               if r["summary"] is not None]
    return bool(devices) and all(device == "CPUAccelerator" for device in devices)


def _offer_together(comparisons: Dict[str, Dict[str, Any]], copy: Optional[str]) -> None:
    """An undecided verdict of a race run one command after the other on the CPU names ``--together`` beside the
    in-run trial, in what would decide it."""
    for name, cmp in comparisons.items():
        if name == copy:
            continue
        for said in (cmp.get("verdict"), cmp.get("sequential")):
            if said and IN_RUN_HINT in (said.get("why") or ""):
                said["why"] = said["why"].replace(IN_RUN_HINT, TOGETHER_HINT)


def _fixed_what_would_decide(cmp: Dict[str, Any], name: str, runs: Dict[str, List[Dict[str, Any]]],
                             typed: Dict[str, Any], base: str, copy: Optional[str], basis: str) -> None:
    """``--repeats N`` left the command within noise (its interval holds 1 or reaches the A/A band):
    ``what_would_decide`` (:func:`lightning_perf.bench.what_would_decide.what_would_decide`, from its per-round
    log-ratios against the baseline and its A/A copy) and those words after the verdict's why."""
    verdict = cmp["verdict"]
    if verdict["verdict"] != WITHIN_NOISE or verdict["why"].startswith("a change below"):
        return
    refs = [_round_rates(runs[base], basis)]
    if copy is not None and copy in typed:
        refs.append(_round_rates(runs[copy], basis))
    found = what_would_decide(round_log_ratios(_round_rates(runs[name], basis), refs))
    cmp["what_would_decide"] = found
    verdict["why"] = f"{verdict['why']}; {fixed_words(found)}"


def _memory_verdicts(typed: Dict[str, List[PerfSummary]], base: str, copy: Optional[str]) -> Dict[str, Any]:
    """name -> its train peak against the baseline setup's runs (the first command's and its A/A copy's), decided
    only beyond the memory noise floor (:func:`lightning_perf.summary.memory_floor.memory_change`)."""
    reference = typed.get(base, []) + (typed.get(copy) or [])
    if not reference:
        return {}
    train = (reference[0].vram.phases or {}).get("train") if reference[0].vram is not None else None
    source = "allocator" if train is not None and train.peak_allocated_mb is not None else "process"
    peaks = [train_peak_mb(r) for r in reference]
    return {name: memory_change(peaks, [train_peak_mb(r) for r in runs], source) for name, runs in typed.items()
            if name not in (base, copy) and runs}


def _quality_verdicts(typed: Dict[str, List[PerfSummary]], base: str, copy: Optional[str]) -> Dict[str, Any]:
    """name -> metric -> ``change_pct`` (its median against the first command's) and ``noise_pct`` (how far the
    first command's own second runs, its A/A copy's and its repeats, moved the metric; None where none scored it):
    a change within that noise is no change of the command's."""
    def median_of(runs: List[PerfSummary], metric: str) -> Optional[float]:
        values = [finite(quality(r)[metric].value) for r in runs if metric in quality(r)]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    reference = typed.get(base, [])
    metrics = [m for m in quality(reference[0]) if median_of(reference, m)] if reference else []
    out: Dict[str, Any] = {}
    for metric in metrics:
        middle = median_of(reference, metric)
        again = [finite(quality(r)[metric].value) for r in reference + (typed.get(copy) or []) if metric in quality(r)]
        moved = [100.0 * abs(v - middle) / abs(middle) for v in again if v is not None]
        noise = max(moved) if len(moved) >= 2 else None
        for name, runs in typed.items():
            value = median_of(runs, metric) if name not in (base, copy) and runs else None
            if value is not None:
                out.setdefault(name, {})[metric] = {"change_pct": 100.0 * (value - middle) / abs(middle),
                                                    "noise_pct": noise}
    return out


def _completed(run: Dict[str, Any]) -> bool:
    """The run wrote a summary of a fit that completed: the only kind whose speed a verdict uses."""
    return run["summary"] is not None and run["summary"].get("status") == "completed"


def _no_speed(name: str, runs: List[Dict[str, Any]]) -> str:
    """Why none of a command's runs gives a speed: how many wrote a summary, and how those ended."""
    statuses = [r["summary"].get("status") for r in runs if r["summary"] is not None]
    if not runs:
        return f"{name} did not run"
    if not statuses:
        return f"no summary: none of the {len(runs)} runs of {name} wrote one ({_outcomes(runs)})"
    counted = ", ".join(f"{statuses.count(s)} {s}" for s in dict.fromkeys(statuses))
    missing = len(runs) - len(statuses)
    return (f"no run of {name} completed ({len(runs)} runs: {counted}" + (f", {missing} without a summary" if missing
            else "") + "): a failed run decides nothing, its speed is of the steps before it ended")


def _outcomes(runs: List[Dict[str, Any]]) -> str:
    """``timed out``, ``exit 0``, ...: each distinct way the runs ended, with how many."""
    ended = ["timed out" if r["exit_code"] is None else f"exit {r['exit_code']}" for r in runs]
    return ", ".join(f"{ended.count(e)} {e}" if len(runs) > 1 else e for e in dict.fromkeys(ended))


def _every_round(runs: List[Dict[str, Any]], info: Dict[str, Any]) -> bool:
    """A command ran in every round that ran, each run completed: its rates line up with the rounds."""
    return len(runs) == info.get("done") and all(_completed(r) for r in runs)


def _run_record(run: Dict[str, Any]) -> Dict[str, Any]:
    record = {key: run[key] for key in ("exit_code", "wall_s", "summary_path", "problem")}
    summary = run["summary"]
    record["status"] = summary.get("status") if summary is not None else None
    error = (summary or {}).get("error")
    record["error"] = str(error.get("message") or error.get("type") or "")[:200] or None if isinstance(
        error, dict) else None
    record["contention"] = contention_line(contention(summary)) if summary is not None else None
    return record


def race_ok(result: Dict[str, Any]) -> bool:
    """Every run exited 0 with a summary of a completed fit."""
    return all(r["exit_code"] == 0 and r["problem"] is None and r["status"] in ("completed", None)
               for runs in result["runs"].values() for r in runs)


def format_race(result: Dict[str, Any]) -> str:
    """Seed 000's comparison for each command against the first, then the verdicts between runs."""
    base = result["baseline"]
    lines: List[str] = []
    for name, cmp in result["comparisons"].items():
        if name == result["noise_floor_copy"] or cmp["between_runs"] is None:  # no speed: nothing to compare
            continue
        lines += [f"### {name} against {base}", "", format_text(_one_voice(cmp, base, name, result.get("quality"))), ""]
    lines += ["RACE VERDICT", "=" * 70, rounds_line(result["rounds"]) or ""]
    for name, runs in result["runs"].items():
        bad = [f"run {k}: " + ("timed out" if r["exit_code"] is None else f"exit {r['exit_code']}")
               + (f", status {r['status']}" + (f" ({r['error']})" if r["error"] else "")
                  if r["status"] not in ("completed", None) else "")
               + (f" ({r['problem']})" if r["problem"] else "")
               for k, r in enumerate(runs, start=1) if r["exit_code"] != 0 or r["problem"]
               or r["status"] not in ("completed", None)]
        # --together: every run shares its cores by design, and its waits for them are not the machine's
        busy = [] if result["rounds"].get("together") else [k for k, r in enumerate(runs, start=1) if r["contention"]]
        line = (f"  {name}: {len(runs)} runs, {sum(r['status'] is not None for r in runs)} with a summary,"
                f" {sum(r['status'] == 'completed' for r in runs)} completed")
        line += (f"; {'; '.join(bad)}" if bad else "") + (
            f"; measured on a busy machine in run(s) {', '.join(map(str, busy))}" if busy else "")
        lines.append(line)
    copy = result["noise_floor_copy"]
    if copy is None:
        lines.append("  Noise floor: not measured (--noise-floor off)")
    elif result["comparisons"].get(copy, {}).get("between_runs", 0) is None:  # the copy or the baseline: no speed
        lines.append(f"  Noise floor (A/A: {copy} against {base}): not measured: "
                     + result["comparisons"][copy]["verdict"]["why"])
    else:
        lines.append(f"  Noise floor (A/A: {copy} against {base}): {floor_text(result['noise_floor'])}")
    for name, cmp in result["comparisons"].items():
        if name == copy:
            continue
        between, verdict = cmp["between_runs"], cmp["verdict"]
        if between is None:
            lines.append(f"  {name} against {base}: {verdict['verdict']}: {verdict['why']}")
            continue
        unused = [r for side in (name, base) for r in result["runs"][side] if r["status"] != "completed"]
        lines.append(f"  {name} against {base}: {between_words(between, verdict, cmp['speedup_basis'])}"
                     + (f" ({len(unused)} run(s) of {name} and {base} left out: not completed)" if unused else ""))
    for name, change in (result.get("memory") or {}).items():
        if change["sign"] is None:
            continue
        said = floor_words(change) if not change["decided"] else (
            f"{floor_words(change)} (beyond the {change['floor_mib']:.0f} MiB floor: {change['how']})")
        lines.append(f"  Train peak memory, {name} against {base}: {said}")
    for name, metrics in (result.get("quality") or {}).items():
        for metric, d in metrics.items():
            noise = d["noise_pct"]
            said = (f"{d['change_pct']:+.2f}%, the run-to-run noise not measured (one run of {base}, no A/A copy)"
                    if noise is None else
                    f"{d['change_pct']:+.2f}%, within noise: the A/A pair moved {metric} by {noise:.2f}%"
                    if abs(d["change_pct"]) <= noise else
                    f"{d['change_pct']:+.2f}%, beyond the run-to-run noise (the A/A pair moved it by {noise:.2f}%)")
            lines.append(f"  Quality {metric}, {name} against {base}: {said}")
    if result["best"]:
        lines.append(f"  Fastest: {result['best']}, decided against every other command (samples/s).")
    elif len(result["tie"]) > 1:
        lines.append(f"  Fastest: not decided: {', '.join(result['tie'])} tie within noise between runs.")
    return "\n".join(lines)


def _ratio_words(ratio: float) -> str:
    """``1.048x faster`` / ``1.048x slower``: a ratio of rates with its direction, the factor never below 1."""
    return f"{ratio:.3f}x faster" if ratio >= 1.0 else f"{1.0 / ratio:.3f}x slower"


def between_words(between: Dict[str, Any], verdict: Dict[str, Any], basis: Optional[str]) -> str:
    """The race's verdict on one command in a sentence: ``1.30x slower, decided (95% CI ...)``, ``within noise
    (1.048x slower, 95% CI 0.93x to 1.02x, rank interval, it/s, over 6 + 3 runs): its interval holds 1`` or
    ``no verdict ...``; the ratio always with its direction."""
    why = f": {verdict['why']}" if verdict.get("why") else ""
    if between.get("ratio") is None:
        return f"{verdict['verdict']}{why}"
    interval = (f"95% CI {between['low']:.3f}x to {between['high']:.3f}x, {between['method']}, {basis or 'it/s'},"
                f" over {between['runs'][1]} + {between['runs'][0]} runs" if between.get("low") is not None
                else f"{basis or 'it/s'}, over {between['runs'][1]} + {between['runs'][0]} runs")
    if verdict["verdict"] in (FASTER, SLOWER):
        return f"{ratio_text(between['ratio'])}, decided ({interval}){why}"
    return f"{verdict['verdict']} ({_ratio_words(between['ratio'])}, {interval}){why}"


def _one_voice(cmp: Dict[str, Any], base: str, name: str = "",
               quality: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The comparison of the first runs as the race shows it: its between-runs line is the race's verdict in a
    sentence, and it calls the change significant only where that verdict decided it (one verdict, every view)."""
    view = dict(cmp)
    between, verdict = cmp["between_runs"], cmp["verdict"]
    decided = verdict["verdict"] in (FASTER, SLOWER)
    view["between_runs"] = (f"{between_words(between, verdict, cmp.get('speedup_basis'))}; by ranks against the runs"
                            f" of {base} and of its A/A copy (the race verdict below)")
    view["speedup_significant"] = decided
    if not decided:
        view["speedup_verdict_words"] = f"not significant: {verdict['verdict']} by the race verdict below"
    moved = (quality or {}).get(name) or {}
    if view.get("quality"):  # a quality change within the first command's own noise is not the command's to fail
        view["quality"] = {metric: dict(d, candidate_passed=None) if _within_own_noise(moved.get(metric)) else d
                           for metric, d in view["quality"].items()}
    return view


def _within_own_noise(d: Optional[Dict[str, Any]]) -> bool:
    return d is not None and d["noise_pct"] is not None and abs(d["change_pct"]) <= d["noise_pct"]


def write_result(result: Dict[str, Any], path: str) -> None:
    from lightning_perf.summary.io import write_json_atomic

    write_json_atomic(path, json.loads(json.dumps(result, default=str)))
