"""What a sweep's rows say, as seed 003 wrote it by hand: per-sample cost and pixel throughput by size, batch-size
effects, and the change between two sweeps. Reads and writes plain rows; needs no torch."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

from lightning_perf.bench.sweep import CSV_COLUMNS, LEGACY_COLUMNS, LEGACY_SWEEP_ID, BenchError, noisy_note, spread_pct
from lightning_perf.summary.fields import markdown_table

_INTS = ("tile_size", "batch_size", "model_params")
_TEXT = ("timestamp", "mode", "device", "precision", "error", "sweep_id")
#: A speed change is within noise when its size is below this many times the larger of the two rows' spreads.
NOISE_FACTOR = 2.0
#: What makes two rows the same configuration in two sweeps.
MATCH_ON = ("mode", "tile_size", "batch_size", "precision", "device")


def read_csv(path: str) -> List[Dict[str, Any]]:
    """The rows of a sweep CSV, typed as :func:`~lightning_perf.bench.sweep.run_sweep` returns them, in file order.
    A CSV written before sweeps had ids is read as one sweep, ``sweep_id`` ``legacy``."""
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames not in (CSV_COLUMNS, LEGACY_COLUMNS):
                raise BenchError(f"{path!r} is not a lightning-perf bench CSV (its header differs from this version's"
                                 f" {len(CSV_COLUMNS)} columns)")
            raw = list(reader)
    except FileNotFoundError:
        raise BenchError(f"{path!r}: no such file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BenchError(f"{path!r}: cannot read: {err}") from None
    rows = []
    for i, r in enumerate(raw, start=2):
        row: Dict[str, Any] = {}
        try:
            for key in CSV_COLUMNS:
                value = r.get(key) or ""
                if key in _TEXT:
                    row[key] = value or None
                elif value == "":
                    row[key] = None
                else:
                    row[key] = int(value) if key in _INTS else float(value)
        except ValueError as err:
            raise BenchError(f"{path!r} line {i}: {err}") from None
        row["sweep_id"] = row["sweep_id"] or LEGACY_SWEEP_ID
        rows.append(row)
    if not rows:
        raise BenchError(f"{path!r} has a header but no rows")
    return rows


def sweep_ids(rows: List[Dict[str, Any]]) -> List[str]:
    """The sweeps in ``rows``, in the order they first appear (appended CSVs: oldest first)."""
    return list(dict.fromkeys(r["sweep_id"] for r in rows))


def select_sweep(rows: List[Dict[str, Any]], which: Optional[str] = None, what: str = "--sweep") -> List[Dict[str, Any]]:
    """The rows of one sweep: ``None`` the latest (the sweep of the file's last row), ``"all"`` every row, else the
    sweep whose id is ``which``; BenchError naming the ids there are when there is no such sweep."""
    if which == "all":
        return list(rows)
    ids = sweep_ids(rows)
    chosen = ids[-1] if which is None else which
    if chosen not in ids:
        shown = ", ".join(ids[-5:]) + (f" (and {len(ids) - 5} older)" if len(ids) > 5 else "")
        raise BenchError(f"{what} {which!r}: no such sweep; the file has {shown}, or 'all'")
    return [r for r in rows if r["sweep_id"] == chosen]


def _ok(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in rows if not r["error"] and r["throughput_samples_per_sec"]]


def _groups(rows: List[Dict[str, Any]]) -> Dict[Tuple[Any, ...], List[Dict[str, Any]]]:
    out: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = defaultdict(list)
    several = len(sweep_ids(rows)) > 1
    for r in _ok(rows):
        out[((r["sweep_id"],) if several else ()) + (r["mode"], r["device"], r["precision"])].append(r)
    return out


def _latest(rows: List[Dict[str, Any]]) -> Dict[Tuple[int, int], Dict[str, Any]]:
    """One row per (size, batch): the last one, should a sweep hold a configuration twice."""
    return {(r["tile_size"], r["batch_size"]): r for r in rows}


def per_sample_words(time_ratio: float) -> str:
    """A per-sample time ratio (candidate / reference, same batch) in words whose factor is always >= 1:
    1.54 -> "1.54x slower per sample", 0.15 -> "6.67x faster per sample"."""
    if time_ratio >= 1.0:
        return f"{time_ratio:.2f}x slower per sample"
    return f"{1.0 / time_ratio:.2f}x faster per sample"


def analysis(rows: List[Dict[str, Any]]) -> str:
    """Seed 003's "Analysis" and "Batch Size Effects": per sample cost and pixel throughput of each size against the
    smallest (at the smallest batch), then per size the throughput and memory of each batch against the smallest."""
    parts: List[str] = []
    order = {sweep: i for i, sweep in enumerate(sweep_ids(rows))}
    for key, group in sorted(_groups(rows).items(), key=lambda kv: (order[kv[1][0]["sweep_id"]], str(kv[0]))):
        sweep = f"sweep {key[0]}, " if len(key) == 4 else ""
        mode, device, precision = key[-3:]
        cells = _latest(group)
        sizes = sorted({s for s, _ in cells})
        batches = sorted({b for _, b in cells})
        parts.append(f"Analysis ({sweep}{mode}, {device}, precision {precision}):")
        b0 = batches[0]
        base = cells.get((sizes[0], b0))
        if base is not None:
            for size in sizes[1:]:
                r = cells.get((size, b0))
                if r is None:
                    continue
                pixel = (r["pixels_per_sec"] / base["pixels_per_sec"] - 1.0) * 100.0
                parts.append(f"- {size} is {per_sample_words(r['avg_time_ms'] / base['avg_time_ms'])}"
                             f" than {sizes[0]} (batch {b0}) and processes {abs(pixel):.0f}%"
                             f" {'more' if pixel >= 0 else 'fewer'} pixels per second.")
        if len(batches) > 1:
            headers = ["Batch size"] + [f"{s} throughput" for s in sizes] + ["Memory vs batch " + str(b0)]
            table = []
            for b in batches:
                row = [str(b)]
                mem_ratios = []
                for s in sizes:
                    r, first = cells.get((s, b)), cells.get((s, b0))
                    if r is None or first is None:
                        row.append("-")
                        continue
                    gain = (r["throughput_samples_per_sec"] / first["throughput_samples_per_sec"] - 1.0) * 100.0
                    row.append(f"{r['throughput_samples_per_sec']:.1f} /s" + ("" if b == b0 else f" ({gain:+.0f}%)"))
                    if r["memory_peak_mb"] and first["memory_peak_mb"]:
                        mem_ratios.append(r["memory_peak_mb"] / first["memory_peak_mb"])
                row.append("baseline" if b == b0 else (f"{sum(mem_ratios) / len(mem_ratios):.2f}x" if mem_ratios
                                                        else "n/a"))
                table.append(row)
            parts += ["", "Batch size effects:", markdown_table(headers, table)]
        parts.append("")
    return "\n".join(parts).rstrip()


def compare_bench(old: List[Dict[str, Any]], new: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per configuration in both sweeps (matched on mode, size, batch, precision, device; the last row of each):
    samples/s of each and its change, peak memory of each and its change. Configurations in one sweep only, or
    failed in either, are listed with what happened.

    Noise: ``noise_pct`` is :data:`NOISE_FACTOR` x the larger of the two rows' std over iterations as a percentage of
    their mean time; a speed change whose size is below it is ``within_noise``. A row whose std is over 25% of its
    mean is named noisy in ``note``."""
    def key(r: Dict[str, Any]) -> Tuple[Any, ...]:
        return tuple(r[k] for k in MATCH_ON)

    a = {key(r): r for r in old}
    b = {key(r): r for r in new}
    out = []
    for k in list(a) + [k for k in b if k not in a]:
        ra, rb = a.get(k), b.get(k)
        row: Dict[str, Any] = dict(zip(MATCH_ON, k))
        row.update(old_samples_per_s=None, new_samples_per_s=None, speed_change_pct=None, old_spread_pct=None,
                   new_spread_pct=None, noise_pct=None, within_noise=None, old_peak_mb=None, new_peak_mb=None,
                   memory_change_pct=None, note="")
        if ra is None or rb is None:
            row["note"] = "only in the new sweep" if ra is None else "only in the old sweep"
        elif ra["error"] or rb["error"]:
            row["note"] = f"old: {ra['error'] or 'ok'}, new: {rb['error'] or 'ok'}"
        else:
            row.update(old_samples_per_s=ra["throughput_samples_per_sec"], new_samples_per_s=rb["throughput_samples_per_sec"],
                       old_peak_mb=ra["memory_peak_mb"], new_peak_mb=rb["memory_peak_mb"])
            row["speed_change_pct"] = _pct(rb["throughput_samples_per_sec"], ra["throughput_samples_per_sec"])
            row["memory_change_pct"] = _pct(rb["memory_peak_mb"], ra["memory_peak_mb"])
            row["old_spread_pct"], row["new_spread_pct"] = spread_pct(ra), spread_pct(rb)
            spreads = [v for v in (row["old_spread_pct"], row["new_spread_pct"]) if v is not None]
            if spreads and row["speed_change_pct"] is not None:
                row["noise_pct"] = NOISE_FACTOR * max(spreads)
                row["within_noise"] = abs(row["speed_change_pct"]) < row["noise_pct"]
            row["note"] = "; ".join(f"{which} {noisy_note(r)}" for which, r in (("old", ra), ("new", rb))
                                    if noisy_note(r))
        out.append(row)
    return out


def _pct(new: Optional[float], old: Optional[float]) -> Optional[float]:
    if new is None or not old or math.isnan(old) or math.isnan(new):
        return None
    return 100.0 * (new / old - 1.0)


def format_bench_compare(rows: List[Dict[str, Any]]) -> str:
    def num(v: Optional[float], digits: int = 1) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    def pct(v: Optional[float]) -> str:
        return "-" if v is None else f"{v:+.1f}%"

    def speed(r: Dict[str, Any]) -> str:
        return f"within noise ({pct(r['speed_change_pct'])})" if r["within_noise"] else pct(r["speed_change_pct"])

    table = [[r["mode"], str(r["tile_size"]), str(r["batch_size"]), str(r["precision"]), str(r["device"]),
              num(r["old_samples_per_s"]), num(r["new_samples_per_s"]), speed(r),
              "-" if r["noise_pct"] is None else f"±{r['noise_pct']:.1f}%",
              num(r["old_peak_mb"], 0), num(r["new_peak_mb"], 0), pct(r["memory_change_pct"]), r["note"]]
             for r in rows]
    return markdown_table(["mode", "size", "batch", "precision", "device", "old samples/s", "new samples/s", "speed",
                           "noise", "old peak MB", "new peak MB", "memory", "note"], table)
