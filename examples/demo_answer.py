"""The last block `make demo` prints: the answer to "did the change help?", read from the two runs' summaries.

    python examples/demo_answer.py runs/demo/baseline/perf_summary.json runs/demo/workers2/perf_summary.json

The speed verdict, the section that moved most, memory and quality in a line each, and where the full tables and
files are. The figures are compare's (:func:`lightning_perf.summary.compare.compare_summaries`), so this block and
`lightning-perf compare` never disagree. With one run a side the drift between runs is not measured: the block gives
the candidate/base speed and its interval inside each run, and says the direction is not decided (issue 59: a
direction word only where the verdict decides one).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional

from lightning_perf.summary import read_summary
from lightning_perf.summary.compare import compare_summaries, memory_texts, ratio_words
from lightning_perf.summary.comparison import Comparison
from lightning_perf.summary.contention import contention
from lightning_perf.summary.fields import IMAGE_METRIC_DIRECTIONS, eval_peak_mb, fmt_pct, run_names, train_peak_mb

RULE = "=" * 78


def interval_words(lo: float, hi: float) -> str:
    """A speedup interval in words: ``1.14x to 1.50x slower``, or each bound in its own words where it holds 1."""
    if lo >= 1.0:
        return f"{lo:.2f}x to {hi:.2f}x faster"
    if hi <= 1.0:
        return f"{1.0 / hi:.2f}x to {1.0 / lo:.2f}x slower"
    return f"{ratio_words(lo)} to {ratio_words(hi)}"


def speed_lines(result: Dict[str, Any]) -> List[str]:
    """The verdict: faster, slower or within noise, by how much, with the interval and what it covers."""
    speedup = result["speedup"]
    if speedup is None:
        return [f"Speed:    no verdict: {next(iter(result['notes']), 'a run has no speed')}"]
    b, c = result["base"], result["candidate"]
    decided = Comparison.of(result).direction is not None
    words = ratio_words(speedup) if decided else f"candidate/base speed {speedup:.3f}"
    change = (f"{words} ({fmt_pct(result['change_pct'])} {result['speedup_basis']}),"
              f" {b['ms_per_iter_mean']:.2f} -> {c['ms_per_iter_mean']:.2f} ms/iter mean")
    ci = result["speedup_ci95"]
    if ci is None:
        return [f"Speed:    {change}; no interval, so no verdict"]
    if result["speedup_interval"] == "between runs":
        runs = result["repeats"]
        verdict = "" if result["speedup_significant"] else "within noise: "
        bounds = interval_words(*ci) if decided else f"{ci[0]:.2f} to {ci[1]:.2f}"
        return [f"Speed:    {verdict}{change}",
                f"          95% CI {bounds}, from the spread between {runs['base']} + {runs['candidate']} runs"]
    beyond = result["speedup_beyond_within_run_noise"]
    return [f"Speed:    {'not decided: ' if beyond else 'within noise: '}{change}",
            f"          95% CI {ci[0]:.2f} to {ci[1]:.2f} within each run; one run a side does not measure the",
            "          drift between runs, so no claim of a direction (repeat each side: compare --base-repeats ...)"]


def section_line(result: Dict[str, Any]) -> str:
    sections = result["sections"]
    row = next((r for r in (sections or {}).get("rows", []) if r["name"] == (sections or {}).get("moved_most")), None)
    if row is None:
        return "Moved:    no section past its noise (or a run has no SectionProfiler table)"
    if Comparison.of(result).direction is None:
        return (f"Moved:    not decided (the speed is not); past its noise within these runs: {row['name']},"
                f" {row['base_ms_per_iter']:.2f} -> {row['candidate_ms_per_iter']:.2f} ms/iter")
    whole = sections["iteration_delta_ms"]
    return (f"Moved:    {row['name']} most, {row['base_ms_per_iter']:.2f} -> {row['candidate_ms_per_iter']:.2f}"
            f" ms/iter ({row['delta_ms']:+.2f} ms)"
            + (f" of the whole iteration's {whole:+.2f} ms" if whole is not None else ""))


def memory_lines(base: Any, candidate: Any, result: Dict[str, Any]) -> List[str]:
    """Train and eval peak, each change past compare's noise floor for that figure, else ``same`` (and the floor on
    a line of its own)."""
    parts, floors = [], []
    for label, read in (("train peak", train_peak_mb), ("eval peak", eval_peak_mb)):
        old, new, change = memory_texts(read(base), read(candidate))
        entry = next((d for key, d in result["memory_mb"].items() if key.startswith(label)
                      and d["base"] == read(base) and d["candidate"] == read(candidate)), None)
        if entry is not None and entry.get("beyond_floor") is False:
            floors.append(entry["floor_mb"])
            change = "same"
        parts.append(f"{label} {old} -> {new} ({change})")
    source = candidate.vram.source if candidate.vram is not None else None
    same = [f"          same: within the noise floor (\u00b1{memory_texts(None, max(floors))[1]})"] if floors else []
    return ["Memory:   " + ", ".join(parts) + (f" ({source})" if source else "")] + same


def quality_line(result: Dict[str, Any], candidate: Any) -> str:
    passed = result["quality_gate_passed"]["candidate"]
    if not result["quality"]:
        return "Quality:  not measured in both runs"
    values = ", ".join(f"{name.upper()} {q['base']:.4f} -> {q['candidate']:.4f}"
                       for name, q in result["quality"].items())
    tolerance = {m.tolerance for m in candidate.quality_gate.metrics.values() if m is not None and m.tolerance}
    within = f" (within {100 * tolerance.pop():g}%)" if len(tolerance) == 1 else ""
    verdict = {True: f"gate passed{within}", False: "gate FAILED", None: "not gated"}[passed]
    gate = candidate.quality_gate
    missing = sorted(set(gate.unavailable or {}) & set(IMAGE_METRIC_DIRECTIONS) - set(result["quality"]))
    return (f"Quality:  {verdict}: {values}"
            + (f"; not measured: {', '.join(m.upper() for m in missing)}" if missing else ""))


def answer_lines(base_path: str, candidate_path: str, out_dir: Optional[str] = None) -> List[str]:
    """The block, line by line. ``out_dir``: where `make demo` wrote compare.txt and report.md beside the runs."""
    base, candidate = read_summary(base_path), read_summary(candidate_path)
    base_name, candidate_name = run_names([base_path, candidate_path], [base, candidate])
    result = compare_summaries(base, candidate, base_name=base_name, candidate_name=candidate_name)
    lines = [RULE, f"The answer: {candidate_name} against {base_name}", RULE]
    lines += speed_lines(result)
    lines += [section_line(result), *memory_lines(base, candidate, result), quality_line(result, candidate)]
    for name, run in ((base_name, base), (candidate_name, candidate)):
        busy = contention(run)  # the speed above may be the machine's: say so where the verdict is read
        if busy["contended"]:
            lines.append(f"Machine:  busy during {name}: {busy['causes'][0].split(' (')[0]}; its speed may be the"
                         " machine's")
    if out_dir:
        lines.append(f"Tables:   {os.path.join(out_dir, 'compare.txt')} (lightning-perf compare),"
                     f" {os.path.join(out_dir, 'report.md')} (lightning-perf report)")
    lines.append(f"Files:    {base_path}, {candidate_path}")
    if out_dir:
        lines.append(f"          tensorboard --logdir {out_dir}")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", help="the baseline run's perf_summary.json")
    parser.add_argument("candidate", help="the changed run's perf_summary.json")
    parser.add_argument("--out", default=None, help="the folder of the runs, compare.txt and report.md")
    args = parser.parse_args(argv)
    print("\n".join(answer_lines(args.base, args.candidate, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
