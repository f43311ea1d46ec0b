"""Compare two runs: speedup with a 95% confidence interval, time to N iterations, memory and quality deltas."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from lightning_perf.measure.stats import bootstrap_median_ratio_ci
from lightning_perf.summary.fields import (
    IMAGE_METRIC_DIRECTIONS,
    dig,
    fmt_duration,
    fmt_mb,
    fmt_num,
    fmt_pct,
    histogram,
    markdown_table,
    memory,
    quality,
    run_name,
    speed,
)


def _delta(base: Optional[float], cand: Optional[float]) -> Dict[str, Optional[float]]:
    delta = None if base is None or cand is None else cand - base
    pct = None if delta is None or not base else 100.0 * delta / abs(base)
    return {"base": base, "candidate": cand, "delta": delta, "delta_pct": pct}


def compare_summaries(
    base: Dict[str, Any],
    candidate: Dict[str, Any],
    iterations: int = 30000,
    base_name: str = "base",
    candidate_name: str = "candidate",
) -> Dict[str, Any]:
    """The comparison as a dict (what ``--format json`` prints). Speedup is base median / candidate median."""
    b, c = speed(base), speed(candidate)
    notes: List[str] = []
    for name, run in ((base_name, base), (candidate_name, candidate)):
        if run.get("status") != "completed":
            notes.append(f"{name} run status is {run.get('status')!r}: its figures cover only part of a run")
    devices = (dig(base, "run", "device"), dig(candidate, "run", "device"))
    if devices[0] != devices[1]:
        notes.append(f"runs used different devices ({devices[0]} vs {devices[1]}): speed is not comparable")

    speedup = ci = slower_pct = None
    if b["ms_per_iter_median"] and c["ms_per_iter_median"]:
        speedup = b["ms_per_iter_median"] / c["ms_per_iter_median"]
        slower_pct = 100.0 * (c["ms_per_iter_median"] / b["ms_per_iter_median"] - 1.0)
        hb, hc = histogram(base), histogram(candidate)
        if hb is not None and hc is not None:
            ci = bootstrap_median_ratio_ci(hb, hc)
    else:
        notes.append("speedup unavailable: a run has no measured iterations")

    sample_speedup = None
    if b["samples_per_s"] and c["samples_per_s"]:
        sample_speedup = c["samples_per_s"] / b["samples_per_s"]
        per_iter = [
            run["samples_per_s"] / run["it_per_s"] if run["it_per_s"] else None for run in (b, c)
        ]
        if None not in per_iter and abs(per_iter[0] - per_iter[1]) > 0.01 * per_iter[0]:
            notes.append(
                f"the runs process different samples per iteration ({per_iter[0]:.1f} vs {per_iter[1]:.1f}):"
                " it/s and time to N iterations are not like for like; compare samples/s"
            )

    def time_to_n(s: Dict[str, Optional[float]]) -> Optional[float]:
        return iterations * s["ms_per_iter_median"] / 1000.0 if s["ms_per_iter_median"] else None

    t_base, t_cand = time_to_n(b), time_to_n(c)
    saved = None if t_base is None or t_cand is None else t_base - t_cand
    mem_b, mem_c = memory(base), memory(candidate)
    mem = {k: _delta(mem_b[k], mem_c[k]) for k in mem_b if mem_b[k] is not None and mem_c[k] is not None}
    q_b, q_c = quality(base), quality(candidate)
    qual = {}
    for name in q_b:
        if name in q_c:
            entry = _delta(dig(q_b, name, "value"), dig(q_c, name, "value"))
            entry["mode"] = dig(q_c, name, "mode") or IMAGE_METRIC_DIRECTIONS.get(name)
            entry["candidate_passed"] = dig(q_c, name, "passed")
            qual[name] = entry
    significant = None
    if ci is not None:
        significant = ci[0] > 1.0 or ci[1] < 1.0
    return {
        "base": {"name": base_name, "status": base.get("status"), "device": devices[0], **b},
        "candidate": {"name": candidate_name, "status": candidate.get("status"), "device": devices[1], **c},
        "speedup": speedup,
        "speedup_ci95": list(ci) if ci else None,
        "speedup_significant": significant,
        "change_pct": None if speedup is None else 100.0 * (speedup - 1.0),
        "samples_per_s_speedup": sample_speedup,
        "candidate_slower_pct": slower_pct,
        "iterations": iterations,
        "time_to_iterations_s": {"base": t_base, "candidate": t_cand},
        "time_saved_s": saved,
        "time_saved_pct": None if saved is None or not t_base else 100.0 * saved / t_base,
        "memory_mb": mem,
        "quality": qual,
        "quality_gate_passed": {
            "base": dig(base, "quality_gate", "passed"),
            "candidate": dig(candidate, "quality_gate", "passed"),
        },
        "notes": notes,
    }


def _speed_line(run: Dict[str, Any]) -> str:
    return (
        f"{fmt_num(run['ms_per_iter_median'])} ms/iter median, {fmt_num(run['ms_per_iter_mean'])} mean"
        f" ({fmt_num(run['it_per_s'])} it/s), p95 {fmt_num(run['ms_per_iter_p95'])} ms,"
        f" {fmt_num(run['samples_per_s'], 1)} samples/s"
    )


def _speedup_text(result: Dict[str, Any]) -> str:
    if result["speedup"] is None:
        return "n/a"
    text = f"{result['speedup']:.2f}x ({fmt_pct(result['change_pct'])})"
    if result["speedup_ci95"]:
        lo, hi = result["speedup_ci95"]
        verdict = "significant" if result["speedup_significant"] else "not significant: within noise"
        text += f", 95% CI {lo:.3f}x to {hi:.3f}x, {verdict}"
    return text


def format_text(result: Dict[str, Any]) -> str:
    b, c = result["base"], result["candidate"]
    n = result["iterations"]
    width = max(len(b["name"]), len(c["name"]), len("Time saved")) + 2
    lines = [
        "TRAINING TIME COMPARISON",
        "=" * 70,
        "",
        "Training performance:",
        f"  {b['name'] + ':':<{width}}{_speed_line(b)}",
        f"  {c['name'] + ':':<{width}}{_speed_line(c)}",
        f"  {'Speedup:':<{width}}{_speedup_text(result)}",
        f"  {'Samples/s:':<{width}}"
        + ("n/a" if result["samples_per_s_speedup"] is None else f"{result['samples_per_s_speedup']:.2f}x"),
        "",
        f"Estimated time to {n:,} iterations (from the median):",
        f"  {b['name'] + ':':<{width}}{fmt_duration(result['time_to_iterations_s']['base'])}",
        f"  {c['name'] + ':':<{width}}{fmt_duration(result['time_to_iterations_s']['candidate'])}",
        f"  {'Time saved:':<{width}}{fmt_duration(result['time_saved_s'])}"
        f" ({fmt_pct(result['time_saved_pct'])})",
    ]
    if result["memory_mb"]:
        lines += ["", "Peak memory:"]
        for label, d in result["memory_mb"].items():
            lines.append(
                f"  {label}: {fmt_mb(d['base'])} -> {fmt_mb(d['candidate'])} ({fmt_pct(d['delta_pct'])})"
            )
    if result["quality"]:
        lines += ["", "Quality:"]
        for name, d in result["quality"].items():
            verdict = {True: "passed", False: "FAILED", None: ""}[d["candidate_passed"]]
            lines.append(
                f"  {name}: {fmt_num(d['base'], 4)} -> {fmt_num(d['candidate'], 4)}"
                f" ({fmt_pct(d['delta_pct'])}) {verdict}".rstrip()
            )
    if result["notes"]:
        lines += ["", "Notes:"] + [f"  - {note}" for note in result["notes"]]
    return "\n".join(lines)


def format_markdown(result: Dict[str, Any]) -> str:
    b, c = result["base"], result["candidate"]
    rows = [
        [
            run["name"],
            fmt_num(run["ms_per_iter_median"]),
            fmt_num(run["ms_per_iter_mean"]),
            fmt_num(run["it_per_s"]),
            fmt_num(run["ms_per_iter_p95"]),
            fmt_num(run["samples_per_s"], 1),
            fmt_duration(result["time_to_iterations_s"][key]),
        ]
        for run, key in ((b, "base"), (c, "candidate"))
    ]
    headers = ["run", "ms/iter (median)", "ms/iter (mean)", "it/s", "p95 ms", "samples/s", f"time to {result['iterations']:,}"]
    parts = [
        markdown_table(headers, rows),
        "",
        f"**Speedup:** {_speedup_text(result)}. **Time saved:** {fmt_duration(result['time_saved_s'])}"
        f" ({fmt_pct(result['time_saved_pct'])}).",
    ]
    if result["memory_mb"]:
        mem_rows = [
            [label, fmt_mb(d["base"]), fmt_mb(d["candidate"]), fmt_pct(d["delta_pct"])]
            for label, d in result["memory_mb"].items()
        ]
        parts += ["", markdown_table(["peak memory", b["name"], c["name"], "change"], mem_rows)]
    if result["quality"]:
        q_rows = [
            [name, fmt_num(d["base"], 4), fmt_num(d["candidate"], 4), fmt_pct(d["delta_pct"])]
            for name, d in result["quality"].items()
        ]
        parts += ["", markdown_table(["quality", b["name"], c["name"], "change"], q_rows)]
    if result["notes"]:
        parts += [""] + [f"- {note}" for note in result["notes"]]
    return "\n".join(parts)


def format_json(result: Dict[str, Any]) -> str:
    return json.dumps(result, indent=2)


FORMATTERS = {"text": format_text, "markdown": format_markdown, "json": format_json}


def default_names(base_path: str, candidate_path: str) -> tuple:
    names = (run_name(base_path), run_name(candidate_path))
    return names if names[0] != names[1] else ("base", "candidate")
