"""Reading figures out of summary sections, and formatting them for people. Pure Python."""

from __future__ import annotations

import csv
import io
import os
from typing import Any, Dict, List, Optional

from lightning_perf.measure.stats import BlockSeries

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


def run_names(paths: List[str], summaries: Optional[List[Dict[str, Any]]] = None) -> List[str]:
    """A name per run: ``run.name`` when the run was given one (``run_name=``), else the folders of its path that
    differ from the others' (``runs/amp/lightning_logs/version_0`` beside ``runs/base/...`` is ``amp``), else the
    folder holding the file; numbered where two would still be the same."""
    folders = [os.path.dirname(os.path.abspath(p)).split(os.sep) for p in paths]
    names: List[str] = []
    for i, parts in enumerate(folders):
        given = dig(summaries[i], "run", "name") if summaries else None
        if isinstance(given, str) and given:
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


def blocks(summary: Dict[str, Any]) -> Optional[BlockSeries]:
    """The run's iteration times as a block series (schema 2), or None (schema 1 or malformed)."""
    data = dig(summary, "iteration_timer", "blocks_ms")
    if not isinstance(data, dict):
        return None
    try:
        return BlockSeries.from_dict(data)
    except ValueError:
        return None


def speed(summary: Dict[str, Any]) -> Dict[str, Optional[float]]:
    """ms/iter (mean, median, min, max, p95, p99), it/s and samples/s of a run, None where not measured."""
    stats = dig(summary, "iteration_timer", "ms_per_iter") or {}
    it_per_s = dig(summary, "iteration_timer", "it_per_s")
    samples_per_s = dig(summary, "iteration_timer", "samples_per_s")
    return {
        "ms_per_iter_mean": stats.get("mean"),
        "ms_per_iter_median": stats.get("median"),
        "ms_per_iter_min": stats.get("min"),
        "ms_per_iter_max": stats.get("max"),
        "ms_per_iter_p95": stats.get("p95"),
        "ms_per_iter_p99": stats.get("p99"),
        "it_per_s": it_per_s,
        "samples_per_s": samples_per_s,
        "samples_per_iter": samples_per_s / it_per_s if samples_per_s and it_per_s else None,
        "measured_iterations": dig(summary, "iteration_timer", "measured_iterations"),
    }


def memory(summary: Dict[str, Any]) -> Dict[str, Optional[float]]:
    return {label: dig(summary, "vram", "phases", phase, field) for label, phase, field in MEMORY_FIELDS}


def eval_peak_mb(summary: Dict[str, Any]) -> Optional[float]:
    """The largest evaluation peak (validation or test), allocator first, else NVML, else host RSS."""
    for field in ("peak_allocated_mb", "nvml_peak_used_mb", "host_rss_peak_mb"):
        values = [dig(summary, "vram", "phases", phase, field) for phase in ("validation", "test")]
        known = [v for v in values if v is not None]
        if known:
            return max(known)
    return None


def train_peak_mb(summary: Dict[str, Any]) -> Optional[float]:
    for field in ("peak_allocated_mb", "nvml_peak_used_mb", "host_rss_peak_mb"):
        value = dig(summary, "vram", "phases", "train", field)
        if value is not None:
            return value
    return None


def quality(summary: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Metric name -> {value, mode, passed} from the quality_gate section."""
    metrics = dig(summary, "quality_gate", "metrics")
    return dict(metrics) if isinstance(metrics, dict) else {}


def fmt_num(value: Optional[float], digits: int = 2, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:.{digits}f}{suffix}"


def fmt_mb(value: Optional[float]) -> str:
    if value is None:
        return "n/a"
    return f"{value / 1024:.2f} GB" if value >= 1024 else f"{value:.0f} MB"


def fmt_duration(seconds: Optional[float]) -> str:
    if seconds is None:
        return "n/a"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s >= 3600:
        return f"{sign}{s / 3600:.2f} hours"
    if s >= 60:
        return f"{sign}{s / 60:.1f} min"
    return f"{sign}{s:.1f} s"


def fmt_pct(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:+.1f}%"


def markdown_table(headers: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
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
