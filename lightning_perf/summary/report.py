"""The phase table: one row per run with speed, change vs the first row, peak memory and quality."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from lightning_perf.summary.fields import (
    csv_text,
    eval_peak_mb,
    fmt_mb,
    fmt_num,
    fmt_pct,
    markdown_table,
    quality,
    speed,
    train_peak_mb,
)


def report_rows(summaries: List[Dict[str, Any]], names: List[str]) -> List[Dict[str, Any]]:
    """One dict per run; ``change_pct`` is it/s relative to the first run."""
    rows: List[Dict[str, Any]] = []
    first_its: Optional[float] = None
    metric_names: List[str] = []
    for summary in summaries:
        for name in quality(summary):
            if name not in metric_names:
                metric_names.append(name)
    for i, (summary, name) in enumerate(zip(summaries, names)):
        s = speed(summary)
        its = s["it_per_s"]
        if i == 0:
            first_its = its
        change = None if i == 0 or not its or not first_its else 100.0 * (its / first_its - 1.0)
        q = quality(summary)
        gate = summary.get("quality_gate", {}).get("passed") if isinstance(summary.get("quality_gate"), dict) else None
        row: Dict[str, Any] = {
            "run": name,
            "status": summary.get("status"),
            "it_per_s": its,
            "ms_per_iter_median": s["ms_per_iter_median"],
            "change_pct": change,
            "train_peak_mb": train_peak_mb(summary),
            "eval_peak_mb": eval_peak_mb(summary),
        }
        for metric in metric_names:
            row[metric] = q.get(metric, {}).get("value") if isinstance(q.get(metric), dict) else None
        row["quality_gate"] = gate
        rows.append(row)
    return rows


def format_report(rows: List[Dict[str, Any]], fmt: str = "markdown") -> str:
    if not rows:
        return ""
    if fmt == "csv":
        return csv_text(rows)
    fixed = {"run", "status", "it_per_s", "ms_per_iter_median", "change_pct", "train_peak_mb", "eval_peak_mb",
             "quality_gate"}
    metrics = [k for k in rows[0] if k not in fixed]
    headers = ["Run", "Speed (it/s)", "ms/iter (median)", "Change", "Train peak", "Eval peak"]
    headers += [m.upper() if m in ("psnr", "ssim", "lpips", "l1") else m for m in metrics] + ["Quality", "Status"]
    table = []
    for row in rows:
        gate = {True: "passed", False: "FAILED", None: "-"}[row["quality_gate"]]
        table.append(
            [
                row["run"],
                fmt_num(row["it_per_s"]),
                fmt_num(row["ms_per_iter_median"]),
                "-" if row["change_pct"] is None else fmt_pct(row["change_pct"]),
                fmt_mb(row["train_peak_mb"]),
                fmt_mb(row["eval_peak_mb"]),
            ]
            + [fmt_num(row[m], 4) for m in metrics]
            + [gate, str(row["status"])]
        )
    return markdown_table(headers, table)
