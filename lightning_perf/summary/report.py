"""The phase table: one row per run with speed, change vs the first (or the previous) row, peak memory and its
change, quality and any logged scalar asked for."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from lightning_perf.summary.compare import headline, memory_floor, memory_texts
from lightning_perf.summary.contention import contention, contention_line
from lightning_perf.summary.diagnosis import recorded_or_computed_straggler
from lightning_perf.summary.fields import (
    SummaryLike,
    csv_text,
    eval_peak_mb,
    finite,
    fixed,
    fmt_num,
    fmt_pct,
    markdown_table,
    quality,
    speed,
    train_peak_mb,
)
from lightning_perf.summary.energy import fmt_energy, train_energy
from lightning_perf.summary.model import TRAIN_HOOKS, PerfSummary, as_summary
from lightning_perf.summary.trial_view import trial_line


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
                notes: Optional[List[str]] = None, change_vs: str = "first",
                columns: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """One dict per run. ``speedup`` and ``change_pct`` are the :func:`~lightning_perf.summary.compare.headline`
    against the reference run (``change_vs``: the first row, or the row before): the same figure `compare` prints
    for that pair (samples/s where batch sizes differ). ``it_per_s_delta`` and ``samples_per_s_delta`` are the
    absolute changes, and each memory column has its change in MB and % (only where both runs read the same memory
    figure: allocator, NVML or host RSS). ``date`` is the run's start; ``notes`` the given note, else the run's
    ``run.notes``; loss columns are the last logged value of ``train_loss``/``val_loss`` (and the like, and what
    ModelCheckpoint monitored); ``columns`` adds any logged scalar by name (None where a run did not log it, see
    :func:`column_notes`)."""
    if change_vs not in CHANGE_VS:
        raise ValueError(f"change_vs={change_vs!r}; expected one of {', '.join(CHANGE_VS)}")
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
    extra = column_keys(columns or [], losses, metric_names)
    for i, (summary, name) in enumerate(zip(typed, names)):
        s = speed(summary)
        ref = 0 if change_vs == "first" or i == 0 else i - 1
        head = headline(typed[ref], summary)
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
            "change_vs": change_vs,
            "change_ci95": None if i == 0 else head["ci95"],
            "change_beyond_noise": None if i == 0 or speedup is None else head["significant"],
            "reference": None if i == 0 else names[ref],
            **_speed_deltas(speed(typed[ref]), s, i == 0),
            "train_peak_mb": train_peak_mb(summary),
            "eval_peak_mb": eval_peak_mb(summary),
            "eval_in_train_hooks_peak_mb": _peak(summary, HOOK_PHASES)[0],
            **_memory_deltas(typed[ref], summary, i == 0),
            "tflops_per_s": s["tflops_per_s"],
            "mfu_pct": s["mfu_pct"],
            **_energy_cells(typed[ref], summary, i == 0),
        }
        for loss in losses:
            row[loss] = values.get(loss)
        for key, logged_name in extra:
            row[key] = values.get(logged_name)
        for metric in metric_names:
            row[metric] = q[metric].value if metric in q else None
        row["quality_gate"] = summary.quality_gate.passed if summary.quality_gate is not None else None
        row["eval_in_training_mode"] = train_mode_note(summary)
        row["contention"] = contention_line(contention(summary))
        row["trial"] = trial_line(summary)
        found = recorded_or_computed_straggler(summary)
        row["straggler"] = found.get("line") if found else None
        rows.append(row)
    return rows


def train_mode_note(summary: PerfSummary) -> Optional[str]:
    """Where the run's EvalNoGradGuard found evaluation run with modules in training mode, in a few words: its
    quality figures were measured on a model that evaluation changed (BatchNorm) or randomised (Dropout)."""
    guard = summary.eval_no_grad_guard
    findings = [f for f in ((guard.train_mode_findings if guard is not None else None) or []) if f is not None]
    if not findings:
        return None
    where = "; ".join(f"{f.phase}: {', '.join(f.modules or []) or 'modules'}" for f in findings)
    changed = any(f.running_stats_changed for f in findings)
    # a training hook's own evaluation (sampling at an epoch end) gives no quality figure: its outputs are what it made
    what = ("what the training hooks evaluated (samples, images) is" if all(f.phase == TRAIN_HOOKS for f in findings)
            else "its quality figures are")
    return (f"evaluation ran modules in training mode ({where})"
            + ("; BatchNorm's running statistics changed" if changed else "")
            + f": {what} not the model's in eval mode (EvalNoGradGuard)")


#: Memory columns: (row key, label, phases it reads, the largest across them).
_MEMORY = (("train_peak", "Train peak", ("train",)), ("eval_peak", "Eval peak", ("validation", "test")),
           ("eval_in_train_hooks_peak", "Eval in train hooks peak", ("eval_in_train_hooks",)))
HOOK_PHASES = ("eval_in_train_hooks",)
#: Where ``report`` takes its change from: the first row, or the row before each.
CHANGE_VS = ("first", "previous")
#: The memory figures a peak is read from, in order of preference (as ``train_peak_mb`` and ``eval_peak_mb``).
_PEAK_FIELDS = ("peak_allocated_mb", "nvml_peak_used_mb", "host_rss_peak_mb")

_FIXED = ("run", "date", "notes", "status", "it_per_s", "samples_per_s", "ms_per_iter_mean", "ms_per_iter_median", "speedup",
          "speedup_basis", "change_pct", "change_vs", "reference", "it_per_s_delta", "samples_per_s_delta",
          "train_peak_mb", "eval_peak_mb", "eval_in_train_hooks_peak_mb",
          *(f"{key}_{part}" for key, _, _ in _MEMORY for part in ("delta_mb", "delta_pct", "floor_mb")),
          "change_ci95", "change_beyond_noise",
          "tflops_per_s", "mfu_pct", "quality_gate", "eval_in_training_mode", "contention", "j_per_sample",
          "j_per_sample_delta_pct", "samples_per_j", "trial", "straggler")


def _energy_cells(ref: PerfSummary, run: PerfSummary, first: bool) -> Dict[str, Any]:
    """The training phase's joules per sample (and its change from the reference row) and samples per joule."""
    a, b = train_energy(ref)["j_per_sample"], train_energy(run)
    change = None if first or a is None or b["j_per_sample"] is None or not a else finite(
        100.0 * (b["j_per_sample"] - a) / a)
    return {"j_per_sample": b["j_per_sample"], "j_per_sample_delta_pct": change, "samples_per_j": b["samples_per_j"]}


def column_keys(columns: List[str], shown: List[str], other: List[str]) -> List[Tuple[str, str]]:
    """(row key, logged name) per ``--column``: a logged name already ``shown`` (a loss column) is not repeated, and
    one equal to a fixed or ``other`` column's key (a quality metric) is kept apart as ``logged:<name>``."""
    out: List[Tuple[str, str]] = []
    for name in columns:
        if name in shown or any(name == logged for _, logged in out):
            continue
        out.append((f"logged:{name}" if name in _FIXED or name in other else name, name))
    return out


def column_notes(summaries: List[SummaryLike], names: List[str], columns: Optional[List[str]]) -> List[str]:
    """What a ``--column`` could not show: a name no run logged (with the names they did log), or the runs that
    lack it. Said under the table; the cells read n/a."""
    typed = [as_summary(summary, name) for summary, name in zip(summaries, names)]
    logged = [set((t.logged.values if t.logged is not None else None) or {}) for t in typed]
    notes: List[str] = []
    for column in dict.fromkeys(columns or []):
        lacking = [name for name, values in zip(names, logged) if column not in values]
        if len(lacking) == len(names):
            known = sorted(set().union(*logged))
            shown = ", ".join(known[:20]) + (f", ... ({len(known)} in all)" if len(known) > 20 else "")
            notes.append(f"--column {column!r}: no run logged it; logged names: {shown or 'none'}")
        elif lacking:
            notes.append(f"--column {column!r}: not logged by {', '.join(lacking)} (n/a)")
    return notes


def _speed_deltas(ref: Dict[str, Optional[float]], run: Dict[str, Optional[float]], first: bool) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key in ("it_per_s", "samples_per_s"):
        a, b = ref[key], run[key]
        out[f"{key}_delta"] = None if first or a is None or b is None else finite(b - a)
    return out


def _peak(summary: PerfSummary, phases: Tuple[str, ...]) -> Tuple[Optional[float], Optional[str]]:
    """The largest peak over ``phases`` and the figure it is (allocator first, else NVML, else host RSS)."""
    vram = summary.vram
    held = (vram.phases or {}) if vram is not None else {}
    for field in _PEAK_FIELDS:
        known = [getattr(held[p], field) for p in phases if held.get(p) is not None]
        known = [v for v in known if v is not None]
        if known:
            return max(known), field
    return None, None


def _memory_deltas(ref: PerfSummary, run: PerfSummary, first: bool) -> Dict[str, Any]:
    """Each memory column's change from the reference run, in MB and %: None where either lacks it or the two read
    different figures (an allocator peak against host RSS is no change)."""
    out: Dict[str, Any] = {}
    for key, _, phases in _MEMORY:
        (a, field_a), (b, field_b) = _peak(ref, phases), _peak(run, phases)
        same = not first and a is not None and b is not None and field_a == field_b
        delta = finite(b - a) if same else None
        out[f"{key}_delta_mb"] = delta
        out[f"{key}_delta_pct"] = finite(100.0 * delta / a) if delta is not None and a else None
        out[f"{key}_floor_mb"] = memory_floor(field_a, a, b) if delta is not None else None
    return out


def memory_cell(row: Dict[str, Any], key: str, first: bool) -> str:
    """``1039 MiB``, or with the change from the reference row in the same unit: ``1039 MiB (+0 MiB, +0.0%)`` (the
    rule of compare's memory lines: :func:`~lightning_perf.summary.compare.memory_texts`)."""
    value, delta, floor = row[f"{key}_mb"], row[f"{key}_delta_mb"], row.get(f"{key}_floor_mb")
    if first or finite(value) is None or finite(delta) is None:
        return memory_texts(None, value)[1]
    _, text, change = memory_texts(value - delta, value)
    if finite(floor) is not None and abs(delta) <= floor:
        return f"{text} (same within the noise floor, \u00b1{memory_texts(None, floor)[1]})"
    return f"{text} ({change}, {fmt_pct(row[f'{key}_delta_pct'])})"


def _fmt_logged(value: Optional[float]) -> str:
    """A logged scalar: four decimals (a loss, PSNR), whole numbers from 1000 on (a count), three significant
    digits below 0.001."""
    if finite(value) is None:
        return "n/a"
    if abs(value) >= 1000:
        return fixed(value, ".0f")
    if 0 < abs(value) < 0.001:
        return f"{value:.3g}"
    return fixed(value, ".4f")


def _date(iso: Optional[str]) -> str:
    """``2026-01-27T10:31:02.123+00:00`` -> ``2026-01-27 10:31`` (UTC), as a phase table wants it."""
    return iso[:16].replace("T", " ") if isinstance(iso, str) and len(iso) >= 16 else "-"


def format_report(rows: List[Dict[str, Any]], fmt: str = "markdown", notes: Optional[List[str]] = None) -> str:
    """The rows as a markdown table (with ``notes`` under it, e.g. :func:`column_notes`) or as CSV (no notes: the
    command prints them on stderr)."""
    if not rows:
        return ""
    if fmt == "csv":
        return csv_text(rows)
    text = markdown_table(*phase_table(rows))
    previous = rows[0].get("change_vs") == "previous"
    if previous:
        text += "\n\nChange and the memory changes are against the row before each (`--change-vs previous`)."
    if any(r["speedup_basis"] == "samples/s" for r in rows[1:]):
        text += ("\n\nChange is the samples/s ratio where a run processes a different number of samples per"
                 f" iteration than {'the row before' if previous else 'the first'} (its batch size differs);"
                 " elsewhere it is the it/s ratio.")
    notes = list(notes or []) + [f"{row['run']}: {row['eval_in_training_mode']}" for row in rows
                                 if row.get("eval_in_training_mode")]
    notes += [f"{row['run']}: measured while {row['contention']}: its speed and its Change may be the machine's"
              for row in rows if row.get("contention")]
    notes += [f"{row['run']}: trial {row['trial']}" for row in rows if row.get("trial")]
    notes += [f"{row['run']}: straggler (DDP): {row['straggler']}" for row in rows if row.get("straggler")]
    if notes:
        text += "\n\n" + "\n".join(f"- {note}" for note in notes)
    return text


def phase_table(rows: List[Dict[str, Any]]) -> Tuple[List[str], List[List[str]]]:
    """The phase table's headers and cells, as ``report`` prints them (``report --html`` shows the same cells)."""
    metrics = [k for k in rows[0] if k not in _FIXED]
    compute = any(r.get("tflops_per_s") is not None for r in rows)  # columns only where a run counted FLOPs
    energy = any(r.get("j_per_sample") is not None for r in rows)  # and where a run measured energy per sample
    memory = [(key, label) for key, label, _ in _MEMORY
              if key != "eval_in_train_hooks_peak" or any(r.get(f"{key}_mb") is not None for r in rows)]
    headers = ["Run", "Date", "Speed (it/s)", "Samples/s", "ms/iter (mean)", "ms/iter (median)", "Change"]
    headers += [label for _, label in memory] + (["TFLOP/s", "MFU"] if compute else [])
    headers += ["J/sample", "Samples/J"] if energy else []
    headers += [m.upper() if m in ("psnr", "ssim", "lpips", "l1") else m for m in metrics] + ["Quality", "Status",
                                                                                              "Notes"]
    table = []
    for i, row in enumerate(rows):
        gate = {True: "passed", False: "FAILED", None: "-"}[row["quality_gate"]]
        table.append(
            [
                row["run"],
                _date(row["date"]),
                fmt_num(row["it_per_s"]),
                fmt_num(row["samples_per_s"], 1),
                fmt_num(row["ms_per_iter_mean"]),
                fmt_num(row["ms_per_iter_median"]),
                _change_cell(row, i == 0),
            ]
            + [memory_cell(row, key, i == 0) for key, _ in memory]
            + ([fmt_num(row["tflops_per_s"], 3), fmt_num(row["mfu_pct"], 1, "%")] if compute else [])
            + ([fmt_energy(row["j_per_sample"]) + ("" if row["j_per_sample_delta_pct"] is None else
                                                   f" ({fmt_pct(row['j_per_sample_delta_pct'])})"),
                fmt_energy(row["samples_per_j"])] if energy else [])
            + [_fmt_logged(row[m]) for m in metrics]
            + [gate, str(row["status"]), row["notes"] or ""]
        )
    return headers, table


def _change_cell(row: Dict[str, Any], first: bool) -> str:
    """``+2.7%, +0.30 it/s``: the headline change and the absolute change in its unit, followed by ``within noise``
    where the change is inside the noise within the runs (or below the smallest effect), or ``not decided: no
    interval`` where no interval could be made (fewer than 32 measured iterations)."""
    if first:
        return "baseline"
    if row["change_pct"] is None:
        return "n/a"
    samples = row["speedup_basis"] == "samples/s"
    text = fmt_pct(row["change_pct"])
    if samples:
        text += " (samples/s)"
    delta = row["samples_per_s_delta"] if samples else row["it_per_s_delta"]
    if delta is not None:
        text += f", {fixed(delta, '+.1f')} samples/s" if samples else f", {fixed(delta, '+.2f')} it/s"
    if row.get("change_beyond_noise") is not True:  # a figure, but no change: said so beside it
        text += ", within noise" if row.get("change_ci95") else ", not decided: no interval"
    return text
