"""``report --html`` and ``compare --html``: one self-contained HTML file (inline CSS and SVG drawn here, no script,
nothing fetched when it is opened) with the phase table, speed, memory and energy bars, each run's section breakdown,
iteration-time histogram, slow iterations, diagnosis, and links to the files the summaries name. Pure Python."""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from lightning_perf.measure.stats.streaming import MAX_RELATIVE_ACCURACY, MIN_RELATIVE_ACCURACY
from lightning_perf.measure.timing.tail_advice import iteration_named
from lightning_perf.summary.compare import _section_ms, format_text, tail_text
from lightning_perf.summary.diagnosis import diagnosis_line, recorded_or_computed
from lightning_perf.summary.energy import fmt_energy
from lightning_perf.summary.fields import fmt_num
from lightning_perf.summary.model import Histogram, PerfSummary, as_summary
from lightning_perf.summary.report import format_report, memory_cell, phase_table, report_rows

#: Display bins of the iteration-time histogram (log-spaced from the fastest to the slowest iteration).
HISTOGRAM_BINS = 30
#: Summary keys whose string values are files to link: ``*_path``, ``*_paths``, and these names.
FILE_KEYS = ("path", "paths", "trace", "snapshot", "html", "file")
#: A snapshot block (a key holding ``snapshot``) is shown as JSON up to this many characters.
SNAPSHOT_CHARS = 6000
#: A URL's scheme (the URL standard's), and what a browser drops from an href before it looks for one.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_URL_IGNORED = re.compile(r"[\t\n\r]")
_URL_LEADING = "".join(chr(c) for c in range(0x21))

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;max-width:1200px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #d8dce4}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0}th,td{border:1px solid #d8dce4;padding:3px 8px;text-align:left}
th{background:#f2f4f8}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f6f8fa;padding:8px;overflow:auto;font-size:12px}.diag{font-weight:600}
.note{color:#555}section.run{border-left:4px solid #4c78a8;padding-left:12px;margin:18px 0}
svg text{font:12px system-ui,sans-serif;fill:#1d2330}
"""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], table_id: Optional[str] = None) -> str:
    attr = f' id="{esc(table_id)}"' if table_id else ""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def bars_svg(title: str, items: Sequence[Tuple[str, Optional[float], str]], svg_id: str) -> str:
    """Horizontal bars, one per (label, value, text shown beside it); a value that is None draws no bar."""
    known = [v for _, v, _ in items if v is not None and math.isfinite(v) and v > 0]
    if not known:
        return ""
    top, row_h, label_w, bar_w = max(known), 22, 180, 420
    height = row_h * len(items) + 8
    parts = [f'<svg id="{esc(svg_id)}" role="img" aria-label="{esc(title)}" width="{label_w + bar_w + 160}"'
             f' height="{height}">']
    for i, (label, value, text) in enumerate(items):
        y = 4 + i * row_h
        width = 0.0 if value is None or not 0 < value < math.inf else bar_w * (value / top)  # 420 x 1e308: inf
        parts.append(f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{esc(label[:28])}</text>'
                     f'<rect x="{label_w}" y="{y + 3}" width="{width:.1f}" height="{row_h - 6}" fill="#4c78a8"/>'
                     f'<text x="{label_w + width + 6:.1f}" y="{y + 15}">{esc(text)}</text>')
    return f"<h3>{esc(title)}</h3>" + "".join(parts) + "</svg>"


def histogram_bars(hist: Optional[Histogram], bins: int = HISTOGRAM_BINS) -> List[Tuple[float, float, int]]:
    """The iteration-time histogram regrouped for display: (low ms, high ms, iterations) per log-spaced bin from the
    fastest to the slowest iteration; the counts add up to the histogram's ``count`` (zero times in the first bin)."""
    if hist is None or not hist.count or not hist.bin_keys or hist.min is None or hist.max is None:
        return []
    accuracy = hist.relative_accuracy or 0.005
    if not MIN_RELATIVE_ACCURACY <= accuracy <= MAX_RELATIVE_ACCURACY:
        return []  # (the writer's range: beyond it gamma is <= 0 or 1/0)
    log_gamma = math.log((1 + accuracy) / (1 - accuracy))
    low, high = max(hist.min, 1e-9), max(hist.max, hist.min, 1e-9)
    span = math.log(high / low) if high > low else 0.0
    n = bins if span > 0 else 1
    edges = [low * math.exp(span * i / n) for i in range(n + 1)]
    counts = [0] * n
    counts[0] += hist.zero_count or 0
    for key, count in zip(hist.bin_keys, hist.bin_counts or []):
        # the bucket (gamma^(k-1), gamma^k]'s middle, clamped; in logs, as gamma^k of a key of 1e6 overflows
        value = math.exp(min(max((key - 0.5) * log_gamma, math.log(low)), math.log(high)))
        index = min(n - 1, int(n * math.log(value / low) / span)) if span > 0 else 0
        counts[index] += count
    return [(edges[i], edges[i + 1], counts[i]) for i in range(n)]


def histogram_svg(summary: PerfSummary, svg_id: str) -> str:
    timer = summary.iteration_timer
    groups = histogram_bars(timer.histogram_ms if timer is not None else None)
    if not groups:
        return '<p class="note">No iteration-time histogram in this summary.</p>'
    top, width, height, left = max(c for _, _, c in groups) or 1, 640, 200, 40
    bar = (width - left) / len(groups)
    parts = [f'<svg id="{esc(svg_id)}" role="img" aria-label="iteration time histogram" width="{width + 20}"'
             f' height="{height + 40}">']
    for i, (lo, hi, count) in enumerate(groups):
        h = (height - 10) * count / top
        parts.append(f'<rect class="bin" data-count="{count}" x="{left + i * bar:.1f}" y="{height - h:.1f}"'
                     f' width="{max(bar - 1, 1):.1f}" height="{h:.1f}" fill="#72b7b2">'
                     f"<title>{fmt_num(lo)}-{fmt_num(hi)} ms: {count} iterations</title></rect>")
    parts.append(f'<text x="{left}" y="{height + 16}">{fmt_num(groups[0][0])} ms</text>'
                 f'<text x="{width}" y="{height + 16}" text-anchor="end">{fmt_num(groups[-1][1])} ms</text>'
                 f'<text x="{left}" y="{height + 34}">{sum(c for _, _, c in groups)} iterations, log-spaced bins;'
                 f" tallest bin {top}</text></svg>")
    stats = timer.ms_per_iter
    caption = ("" if stats is None else f"<p>median {fmt_num(stats.median)}, mean {fmt_num(stats.mean)}, p95"
               f" {fmt_num(stats.p95)}, p99 {fmt_num(stats.p99)}, max {fmt_num(stats.max)} ms</p>")
    return "".join(parts) + caption


def _is_file_key(key: str) -> bool:
    return key.endswith(("_path", "_paths")) or key in FILE_KEYS


def evidence_files(data: Any, where: str = "") -> Iterator[Tuple[str, str]]:
    """(where in the summary, file path) for every string (or list of strings) under a key ending ``_path`` or
    ``_paths`` or named in :data:`FILE_KEYS`, at any depth: snapshots and traces whatever section adds them."""
    if isinstance(data, dict):
        for key, value in data.items():
            here = f"{where}.{key}" if where else str(key)
            values = value if isinstance(value, list) else [value]
            if _is_file_key(str(key)) and all(isinstance(v, str) for v in values):
                for v in values:
                    yield here, v
            else:
                yield from evidence_files(value, here)
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from evidence_files(value, f"{where}[{i}]")


def _link(path: str) -> str:
    """A link to a local file: an absolute path as ``file://``, a relative one relative to the page. What a browser
    would read as anything else is shown as text only: a URL of any scheme (``https:``, ``javascript:``, ``data:``,
    a drive letter's ``C:``) and a ``//host`` or ``\\\\host`` path, nothing this report should fetch, run or point at."""
    # as a browser reads an href: leading spaces and control characters dropped, tabs and line breaks anywhere
    plain = _URL_IGNORED.sub("", path).lstrip(_URL_LEADING)
    if _SCHEME.match(plain) or "://" in plain or (len(plain) > 1 and plain[0] in "/\\" and plain[1] in "/\\"):
        return f"<code>{esc(path)}</code>"
    href = ("file://" + path) if path.startswith("/") else path
    return f'<a href="{esc(href)}">{esc(path)}</a>'


def _files_html(dump: Dict[str, Any]) -> str:
    found = list(evidence_files(dump))
    snapshots = list(_snapshot_blocks(dump))
    out = ""
    if found:
        out += "<h3>Files</h3><ul class=\"files\">" + "".join(
            f"<li><code>{esc(where)}</code>: {_link(path)}</li>" for where, path in found) + "</ul>"
    for where, block in snapshots:
        text = json.dumps(block, indent=1, default=str)
        text = text if len(text) <= SNAPSHOT_CHARS else text[:SNAPSHOT_CHARS] + "\n... (cut)"
        out += f"<h3>Memory snapshot (<code>{esc(where)}</code>)</h3><pre>{esc(text)}</pre>"
    return out


def _snapshot_blocks(data: Any, where: str = "") -> Iterator[Tuple[str, Any]]:
    if isinstance(data, dict):
        for key, value in data.items():
            here = f"{where}.{key}" if where else str(key)
            if "snapshot" in str(key) and isinstance(value, (dict, list)) and value:
                yield here, value
            else:
                yield from _snapshot_blocks(value, here)


def _sections_html(summary: PerfSummary, name: str) -> str:
    rows = _section_ms(summary)
    if not rows:
        return '<p class="note">No SectionProfiler sections in this summary.</p>'
    kinds = {k: (v.kind if v is not None else None) for k, v in (summary.section_profiler.sections or {}).items()}
    cells = [[section, kinds.get(section) or "", fmt_num(r["ms_per_iter"]), fmt_num(r["share_pct"], 1, "%")]
             for section, r in rows.items()]
    bars = bars_svg(f"Share of iteration time ({name})",
                    [(section, r["share_pct"], fmt_num(r["share_pct"], 1, "%")) for section, r in rows.items()],
                    f"sections-{name}")
    return _table(["section", "kind", "ms/iter", "share"], cells, f"sections-table-{name}") + bars


def _tail_html(summary: PerfSummary) -> str:
    tail = summary.iteration_timer.tail if summary.iteration_timer is not None else None
    line = tail_text(summary)
    if tail is None or line is None:
        return ""
    rows = []
    for entry in [e for e in (tail.slowest or []) if e is not None]:
        extra = entry.model_dump(exclude={"step", "iteration", "epoch", "ms", "causes", "gc_pause_ms", "section"})
        files = ", ".join(path for _, path in evidence_files(extra))
        rows.append([iteration_named({"iteration": entry.iteration, "step": entry.step}), fmt_num(entry.ms),
                     ", ".join(entry.causes or []),
                     entry.section.section if entry.section is not None and entry.section.section else "", files])
    headers = ["iteration", "ms", "causes", "section over its median", "files"]
    if not any(row[-1] for row in rows):  # the files column only where an entry names one (a trace)
        headers, rows = headers[:-1], [row[:-1] for row in rows]
    return f"<h3>Slow iterations</h3><p>{esc(line)}</p>" + (_table(headers, rows) if rows else "")


def _energy_html(summary: PerfSummary) -> str:
    vram = summary.vram
    energy = vram.activity.energy if vram is not None and vram.activity is not None else None
    if energy is None:
        return ""
    rows = [[phase, fmt_energy(p.energy_j), fmt_num(p.seconds), fmt_energy(p.mean_power_w),
             fmt_energy(p.j_per_iteration), fmt_energy(p.j_per_sample), fmt_energy(p.samples_per_j)]
            for phase, p in (energy.phases or {}).items() if p is not None]
    return (f"<h3>Energy ({esc(energy.source or 'n/a')})</h3>"
            + _table(["phase", "J", "s", "mean W", "J/iteration", "J/sample", "samples/J"], rows))


def _run_html(summary: PerfSummary, name: str, dump: Dict[str, Any]) -> str:
    run = summary.run
    facts = ", ".join(f"{k} {v}" for k, v in (("device", run.device), ("precision", run.precision),
                                               ("started", run.started_at), ("status", summary.status)) if v)
    return (f'<section class="run" id="run-{esc(name)}"><h2>{esc(name)}</h2><p class="note">{esc(facts)}</p>'
            f'<p class="diag">{esc(diagnosis_line(recorded_or_computed(summary), name))}</p>'
            f"<h3>Sections</h3>{_sections_html(summary, name)}"
            f"<h3>Iteration time</h3>{histogram_svg(summary, f'histogram-{name}')}"
            f"{_tail_html(summary)}{_energy_html(summary)}{_files_html(dump)}</section>")


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline';"
            " img-src data:\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><h1>{esc(title)}</h1>{body}</body></html>\n")


def report_html(summaries: List[Any], names: List[str], notes: Optional[List[str]] = None,
                change_vs: str = "first", columns: Optional[List[str]] = None, table_notes: Sequence[str] = (),
                title: str = "lightning_perf report", before: str = "") -> str:
    """The whole page: the phase table (the cells ``report`` prints), the notes under it, speed, memory and energy
    bars, then one section per run. ``before``: HTML put above the table (compare's block)."""
    typed = [as_summary(s, n) for s, n in zip(summaries, names)]
    rows = report_rows(typed, names, notes, change_vs=change_vs, columns=columns)
    headers, cells = phase_table(rows)
    text = format_report(rows, "markdown", list(table_notes))
    below = text.split("\n\n", 1)[1] if "\n\n" in text else ""
    body = before + "<h2>Phase table</h2>" + _table(headers, cells, "phase-table")
    body += "".join(f'<p class="note">{esc(p[2:] if p.startswith("- ") else p)}</p>' for p in below.split("\n")
                    if p.strip())
    # the bars in the headline's unit: samples/s where a run's batch size differs from its reference's
    key, unit = (("samples_per_s", "samples/s") if any(r["speedup_basis"] == "samples/s" for r in rows[1:])
                 else ("it_per_s", "it/s"))
    body += bars_svg(f"Speed ({unit})", [(r["run"], r[key], fmt_num(r[key], 1 if key == "samples_per_s" else 2))
                                         for r in rows], "speed-bars")
    for key, label in (("train_peak_mb", "Train peak memory"), ("eval_peak_mb", "Eval peak memory")):
        # each bar's text is its table cell's figure (with the decimals the change needs beside the reference's)
        body += bars_svg(label, [(r["run"], r[key], memory_cell(r, key[:-3], i == 0).split(" (")[0])
                                 for i, r in enumerate(rows)],
                         f"{key.replace('_', '-')}-bars")
    body += bars_svg("Energy per sample (J, training)",
                     [(r["run"], r["j_per_sample"], fmt_energy(r["j_per_sample"])) for r in rows], "energy-bars")
    body += "".join(_run_html(s, n, s.model_dump(mode="json")) for s, n in zip(typed, names))
    return _page(title, body)


def compare_html(base: Any, candidate: Any, result: Dict[str, Any]) -> str:
    """``compare --html``: compare's text (the same lines it prints) above the two runs' report page."""
    names = [result["base"]["name"], result["candidate"]["name"]]
    block = f'<h2>Comparison</h2><pre id="compare-text">{esc(format_text(result))}</pre>'
    return report_html([base, candidate], names, title=f"lightning_perf compare: {names[0]} vs {names[1]}",
                       before=block)

