"""Reading figures out of summary sections, and formatting them for people. Pure Python."""

from __future__ import annotations

import csv
import io
import math
import os
from typing import Any, Dict, List, Optional, Union

from lightning_perf.measure.stats.streaming import BlockSeries
from lightning_perf.summary.model import IterationTimer, IterStats, Metric, PerfSummary, as_summary

#: What a reader takes: a typed summary, or a decoded file (validated on the way in).
SummaryLike = Union[PerfSummary, Dict[str, Any]]

#: Image metrics and whether higher is better.
IMAGE_METRIC_DIRECTIONS = {"psnr": "max", "ssim": "max", "lpips": "min", "l1": "min"}

#: Memory figures compared across runs: (label, phase, field in vram.phases.<phase>).
MEMORY_FIELDS = [
    ("train peak allocated", "train", "peak_allocated_mb"),
    ("train peak reserved", "train", "peak_reserved_mb"),
    ("train peak device used (NVML)", "train", "nvml_peak_used_mb"),
    ("train peak host RSS", "train", "host_rss_peak_mb"),
    ("eval peak allocated", "validation", "peak_allocated_mb"),
    ("eval peak reserved", "validation", "peak_reserved_mb"),
    ("eval peak device used (NVML)", "validation", "nvml_peak_used_mb"),
    ("eval peak host RSS", "validation", "host_rss_peak_mb"),
    ("eval in train hooks peak allocated", "eval_in_train_hooks", "peak_allocated_mb"),
    ("eval in train hooks peak host RSS", "eval_in_train_hooks", "host_rss_peak_mb"),
]


def dig(data: Any, *keys: str) -> Any:
    """``data[k1][k2]...`` or None where any level is missing or not a dict."""
    for key in keys:
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def run_name(path: str) -> str:
    """A run's name from its path: the folder that holds the summary file."""
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return folder or os.path.basename(path)


def run_names(paths: List[str], summaries: Optional[List[SummaryLike]] = None) -> List[str]:
    """A name per run: ``run.name`` when the run was given one (``run_name=``), else the part of its path that
    differs from the others' (``runs/amp/lightning_logs/version_0`` beside ``runs/base/...`` is ``amp``; the file
    name without ``.json`` counts where the files are named differently: ``runs/base.json`` beside
    ``runs/zero.json`` is ``base``), else the folder holding the file; numbered where two would still be the same."""
    files = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    named_apart = len(set(files)) > 1
    folders = [os.path.dirname(os.path.abspath(p)).split(os.sep) + ([files[i]] if named_apart else [])
               for i, p in enumerate(paths)]
    names: List[str] = []
    for i, parts in enumerate(folders):
        given = _given_name(summaries[i]) if summaries else None
        if given:
            names.append(given)
            continue
        others = [f for j, f in enumerate(folders) if j != i]
        head = 0
        while others and head < len(parts) and all(head < len(o) and o[head] == parts[head] for o in others):
            head += 1
        tail = 0
        while (others and tail < len(parts) - head
               and all(tail < len(o) and o[len(o) - 1 - tail] == parts[len(parts) - 1 - tail] for o in others)):
            tail += 1
        differing = parts[head:len(parts) - tail]
        names.append("/".join(differing) if differing else run_name(paths[i]))
    repeated = {name for name in names if names.count(name) > 1}
    seen: Dict[str, int] = {}
    for i, name in enumerate(names):
        if name in repeated:
            seen[name] = seen.get(name, 0) + 1
            names[i] = f"{name} ({seen[name]})"
    return names


def _given_name(summary: Any) -> Optional[str]:
    """``run.name`` of a typed summary, or of a dict that holds only the part naming needs."""
    if isinstance(summary, PerfSummary):
        return summary.run.name
    name = dig(summary, "run", "name")
    return name if isinstance(name, str) else None


def finite(value: Optional[float]) -> Optional[float]:
    """``value`` where it is a finite number, else None: arithmetic on valid figures can still overflow."""
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def ratio(numerator: Optional[float], denominator: Optional[float]) -> Optional[float]:
    """numerator / denominator where both are finite and > 0 and the result is finite and > 0, else None."""
    if not numerator or not denominator or finite(numerator) is None or finite(denominator) is None:
        return None
    if numerator <= 0 or denominator <= 0:
        return None
    value = numerator / denominator
    return value if 0.0 < value < math.inf else None


def blocks(summary: SummaryLike) -> Optional[BlockSeries]:
    """The run's iteration times as a block series (schema 2), or None (schema 1 or malformed)."""
    timer = as_summary(summary).iteration_timer
    data = timer.blocks_ms if timer is not None else None
    if data is None or data.block_len is None or data.sums is None:
        return None
    try:
        fields = {"block_len": data.block_len, "sums": data.sums, "open_sum": data.open_sum,
                  "open_count": data.open_count, "max_blocks": data.max_blocks}
        return BlockSeries.from_dict({k: v for k, v in fields.items() if v is not None})
    except ValueError:
        return None


def speed(summary: SummaryLike) -> Dict[str, Optional[float]]:
    """ms/iter (mean, median, min, max, p95, p99), it/s and samples/s of a run, None where not measured."""
    timer = as_summary(summary).iteration_timer or IterationTimer()
    stats = timer.ms_per_iter or IterStats()
    return {
        "ms_per_iter_mean": stats.mean,
        "ms_per_iter_median": stats.median,
        "ms_per_iter_min": stats.min,
        "ms_per_iter_max": stats.max,
        "ms_per_iter_p95": stats.p95,
        "ms_per_iter_p99": stats.p99,
        "it_per_s": timer.it_per_s,
        "samples_per_s": timer.samples_per_s,
        "samples_per_iter": ratio(timer.samples_per_s, timer.it_per_s),
        "measured_iterations": timer.measured_iterations,
        "tflops_per_s": timer.tflops_per_s,
        "mfu_pct": timer.mfu_pct,
        "items_per_s": timer.items_per_s,
    }


def _phase(summary: SummaryLike, phase: str, field: str) -> Optional[float]:
    vram = as_summary(summary).vram
    values = (vram.phases or {}).get(phase) if vram is not None else None
    return getattr(values, field) if values is not None else None


def memory(summary: SummaryLike) -> Dict[str, Optional[float]]:
    return {label: _phase(summary, phase, field) for label, phase, field in MEMORY_FIELDS}


def eval_peak_mb(summary: SummaryLike) -> Optional[float]:
    """The largest evaluation peak (validation or test), allocator first, else NVML, else host RSS."""
    for field in ("peak_allocated_mb", "nvml_peak_used_mb", "host_rss_peak_mb"):
        values = [_phase(summary, phase, field) for phase in ("validation", "test")]
        known = [v for v in values if v is not None]
        if known:
            return max(known)
    return None


def train_peak_mb(summary: SummaryLike) -> Optional[float]:
    for field in ("peak_allocated_mb", "nvml_peak_used_mb", "host_rss_peak_mb"):
        value = _phase(summary, "train", field)
        if value is not None:
            return value
    return None


def quality(summary: SummaryLike) -> Dict[str, Metric]:
    """Metric name -> its entry (``value``, ``mode``, ``passed``) in the quality_gate section."""
    gate = as_summary(summary).quality_gate
    metrics = gate.metrics if gate is not None else None
    return {name: entry for name, entry in (metrics or {}).items() if entry is not None}


#: From this size on a printed figure has an exponent (``1.00e+300``, as
#: :func:`~lightning_perf.summary.energy.fmt_energy` prints joules): a file may hold 1e300 ms, and its 301 digits
#: would read as no figure at all.
HUGE = 1e15


def fixed(value: float, spec: str = ".2f") -> str:
    """``format(value, spec)`` for a fixed-point ``spec`` (``.2f``, ``+.1f``), with an exponent instead (``.2e``)
    from :data:`HUGE` on."""
    return format(value, spec[:-1] + "e" if spec.endswith("f") and abs(value) >= HUGE else spec)


def fmt_num(value: Optional[float], digits: int = 2, suffix: str = "") -> str:
    return "n/a" if finite(value) is None else fixed(value, f".{digits}f") + suffix


def fmt_mb(value: Optional[float]) -> str:
    """A figure of 2^20 bytes (the summary's ``_mb`` fields): ``816 MiB``, ``1.50 GiB``."""
    if finite(value) is None:
        return "n/a"
    return f"{fixed(value / 1024)} GiB" if value >= 1024 else f"{fixed(value, '.0f')} MiB"


def fmt_duration(seconds: Optional[float]) -> str:
    if finite(seconds) is None:
        return "n/a"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s >= 3600:
        return f"{sign}{fixed(s / 3600)} hours"
    if s >= 60:
        return f"{sign}{s / 60:.1f} min"
    return f"{sign}{s:.1f} s"


def fmt_pct(value: Optional[float]) -> str:
    return "n/a" if finite(value) is None else f"{fixed(value, '+.1f')}%"


def one_line(text: str) -> str:
    """Free text (a run name, a note) on one line: line breaks become spaces."""
    return " ".join(str(text).splitlines())


def markdown_cell(text: str) -> str:
    """A table cell that cannot end its row or open a new one: ``|`` escaped, line breaks as spaces."""
    return one_line(text).replace("\\", "\\\\").replace("|", "\\|")


def markdown_table(headers: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(markdown_cell(h) for h in headers) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(markdown_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def csv_text(rows: List[Dict[str, Any]]) -> str:
    """Rows as CSV text: columns in first-seen order across rows, None as an empty cell."""
    keys: List[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in keys})
    return buf.getvalue().rstrip("\n")
