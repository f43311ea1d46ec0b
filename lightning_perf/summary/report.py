"""The phase table: one row per run with speed, change vs the first row, peak memory and quality."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from lightning_perf.summary.compare import headline
from lightning_perf.summary.fields import (
    SummaryLike,
    csv_text,
    eval_peak_mb,
    finite,
    fmt_mb,
    fmt_num,
    fmt_pct,
    markdown_table,
    quality,
    speed,
    train_peak_mb,
)
from lightning_perf.summary.model import PerfSummary, as_summary


#: Logged names shown as loss columns when a run has them (and whatever ModelCheckpoint monitored).
LOSS_NAMES = ("train_loss", "train/loss", "loss", "val_loss", "val/loss")


def _loss_names(summaries: List[PerfSummary]) -> List[str]:
    names: List[str] = []
    for summary in summaries:
        logged = summary.logged
        values = (logged.values if logged is not None else None) or {}
        monitor = logged.monitor if logged is not None else None
        wanted = [n for n in LOSS_NAMES if n in values]
        if monitor and monitor in values and not monitor.startswith("quality/"):
            wanted.append(monitor)
        names += [n for n in wanted if n not in names]
    return names


def report_rows(summaries: List[SummaryLike], names: List[str],
                notes: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """One dict per run. ``speedup`` and ``change_pct`` are the :func:`~lightning_perf.summary.compare.headline`
    against the first run: the same figure `compare` prints for that pair (samples/s where batch sizes differ).
    ``date`` is the run's start; ``notes`` the given note, else the run's ``run.notes``; loss columns are the last
    logged value of ``train_loss``/``val_loss`` (and the like, and what ModelCheckpoint monitored)."""
    typed = [as_summary(summary, name) for summary, name in zip(summaries, names)]
    rows: List[Dict[str, Any]] = []
    metric_names: List[str] = []
    for summary in typed:
        for name in quality(summary):
            if name not in metric_names:
                metric_names.append(name)
    # a logged or metric name equal to a fixed column ("run", "status", ...) would overwrite it
    losses = [n for n in _loss_names(typed) if n not in _FIXED]
    metric_names = [n for n in metric_names if n not in _FIXED]
    for i, (summary, name) in enumerate(zip(typed, names)):
        s = speed(summary)
        head = headline(typed[0], summary, with_ci=False)
        speedup = head["speedup"]
        q = quality(summary)
        values = (summary.logged.values if summary.logged is not None else None) or {}
        row: Dict[str, Any] = {
            "run": name,
            "date": summary.run.started_at,
            "notes": (notes[i] if notes else None) or summary.run.notes,
            "status": summary.status,
            "it_per_s": s["it_per_s"],
            "samples_per_s": s["samples_per_s"],
            "ms_per_iter_mean": s["ms_per_iter_mean"],
            "ms_per_iter_median": s["ms_per_iter_median"],
            "speedup": speedup,
            "speedup_basis": head["basis"] if speedup is not None else None,
            "change_pct": None if i == 0 or speedup is None else finite(100.0 * (speedup - 1.0)),
            "train_peak_mb": train_peak_mb(summary),
            "eval_peak_mb": eval_peak_mb(summary),
            "tflops_per_s": s["tflops_per_s"],
            "mfu_pct": s["mfu_pct"],
        }
        for loss in losses:
            row[loss] = values.get(loss)
        for metric in metric_names:
            row[metric] = q[metric].value if metric in q else None
        row["quality_gate"] = summary.quality_gate.passed if summary.quality_gate is not None else None
        rows.append(row)
    return rows


_FIXED = ("run", "date", "notes", "status", "it_per_s", "samples_per_s", "ms_per_iter_mean", "ms_per_iter_median", "speedup",
          "speedup_basis", "change_pct", "train_peak_mb", "eval_peak_mb", "tflops_per_s", "mfu_pct", "quality_gate")


def _date(iso: Optional[str]) -> str:
    """``2026-01-27T10:31:02.123+00:00`` -> ``2026-01-27 10:31`` (UTC), as a phase table wants it."""
    return iso[:16].replace("T", " ") if isinstance(iso, str) and len(iso) >= 16 else "-"


def format_report(rows: List[Dict[str, Any]], fmt: str = "markdown") -> str:
    if not rows:
        return ""
    if fmt == "csv":
        return csv_text(rows)
    metrics = [k for k in rows[0] if k not in _FIXED]
    compute = any(r.get("tflops_per_s") is not None for r in rows)  # columns only where a run counted FLOPs
    headers = ["Run", "Date", "Speed (it/s)", "Samples/s", "ms/iter (mean)", "ms/iter (median)", "Change",
               "Train peak", "Eval peak"] + (["TFLOP/s", "MFU"] if compute else [])
    headers += [m.upper() if m in ("psnr", "ssim", "lpips", "l1") else m for m in metrics] + ["Quality", "Status",
                                                                                              "Notes"]
    table = []
    for i, row in enumerate(rows):
        gate = {True: "passed", False: "FAILED", None: "-"}[row["quality_gate"]]
        change = "baseline" if i == 0 else ("n/a" if row["change_pct"] is None else fmt_pct(row["change_pct"]))
        if i and row["speedup_basis"] == "samples/s":
            change += " (samples/s)"
        table.append(
            [
                row["run"],
                _date(row["date"]),
                fmt_num(row["it_per_s"]),
                fmt_num(row["samples_per_s"], 1),
                fmt_num(row["ms_per_iter_mean"]),
                fmt_num(row["ms_per_iter_median"]),
                change,
                fmt_mb(row["train_peak_mb"]),
                fmt_mb(row["eval_peak_mb"]),
            ]
            + ([fmt_num(row["tflops_per_s"], 3), fmt_num(row["mfu_pct"], 1, "%")] if compute else [])
            + [fmt_num(row[m], 4) for m in metrics]
            + [gate, str(row["status"]), row["notes"] or ""]
        )
    text = markdown_table(headers, table)
    if any(r["speedup_basis"] == "samples/s" for r in rows[1:]):
        text += ("\n\nChange is the samples/s ratio where a run processes a different number of samples per"
                 " iteration than the first (its batch size differs); elsewhere it is the it/s ratio.")
    return text
