"""What a sweep's rows say, as seed 003 wrote it by hand: per-sample cost and pixel throughput by size, batch-size
effects, the memory/throughput frontier with its trade-offs, the verdicts, and the change between two sweeps. Reads
and writes plain rows; needs no torch."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

from lightning_perf.bench.sweep import (CSV_COLUMNS, LEGACY_COLUMNS, LEGACY_SWEEP_ID, BenchError, noisy_note,
                                        significant, speed_noise_pct, spread_pct)
from lightning_perf.bench.sweep_rounds import (DEFAULT_ROUNDS, between_rounds, combine_rounds, interval_words,
                                               per_round_ratio, rounds_of)
from lightning_perf.summary.fields import markdown_table
from lightning_perf.summary.memory_floor import memory_change

_INTS = ("tile_size", "batch_size", "model_params")
_TEXT = ("timestamp", "mode", "device", "precision", "error", "sweep_id")
#: What makes two rows the same configuration in two sweeps.
MATCH_ON = ("mode", "tile_size", "batch_size", "precision", "device")


def read_csv(path: str) -> List[Dict[str, Any]]:
    """The rows of a sweep CSV, typed as :func:`~lightning_perf.bench.sweep.run_sweep` returns them, in file order.
    A CSV written before sweeps had ids is read as one sweep, ``sweep_id`` ``legacy``."""
    raw: List[Dict[str, str]] = []
    line = 1  # the header's, then each row's (as the errors below count them)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames not in (CSV_COLUMNS, LEGACY_COLUMNS):
                raise BenchError(f"{path!r} is not a lightning-perf bench CSV (its header differs from this version's"
                                 f" {len(CSV_COLUMNS)} columns)")
            line = 2
            for r in reader:
                raw.append(r)
                line += 1
    except FileNotFoundError:
        raise BenchError(f"{path!r}: no such file") from None
    except csv.Error as err:  # a field over the csv module's 131,072 characters: not a file we wrote
        raise BenchError(f"{path!r} line {line}: not a lightning-perf bench CSV ({err})") from None
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


def groups(rows: List[Dict[str, Any]]) -> List[Tuple[Tuple[Any, ...], List[Dict[str, Any]]]]:
    """The successful rows by what makes them comparable, in sweep order: ``((sweep_id, mode, device, precision),
    rows)``, ``sweep_id`` None where ``rows`` hold one sweep."""
    out: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = defaultdict(list)
    several = len(sweep_ids(rows)) > 1
    for r in _ok(rows):
        out[(r["sweep_id"] if several else None, r["mode"], r["device"], r["precision"])].append(r)
    order = {sweep: i for i, sweep in enumerate(sweep_ids(rows))}
    return sorted(out.items(), key=lambda kv: (order[kv[1][0]["sweep_id"]], str(kv[0])))


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
    for key, group in groups(rows):
        sweep = "" if key[0] is None else f"sweep {key[0]}, "
        mode, device, precision = key[1:]
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
                found = _decide(r.get("_pixels_rounds"), base.get("_pixels_rounds"), pixel, (r, base))
                noise = f" (within noise, {found[2]})" if found is not None and found[1] == 0 else ""
                parts.append(f"- {size} is {per_sample_words(r['avg_time_ms'] / base['avg_time_ms'])}"
                             f" than {sizes[0]} (batch {b0}) and processes {abs(pixel):.0f}%"
                             f" {'more' if pixel >= 0 else 'fewer'} pixels per second{noise}.")
        if len(batches) > 1:
            headers = ["Batch size"] + [f"{s} throughput" for s in sizes] + ["Memory vs batch " + str(b0)]
            table = []
            for b in batches:
                row = [str(b)]
                mem_ratios: List[float] = []
                mem_decided: List[bool] = []
                for s in sizes:
                    r, first = cells.get((s, b)), cells.get((s, b0))
                    if r is None or first is None:
                        row.append("-")
                        continue
                    gain = (r["throughput_samples_per_sec"] / first["throughput_samples_per_sec"] - 1.0) * 100.0
                    row.append(f"{r['throughput_samples_per_sec']:.1f} /s" + ("" if b == b0 else f" ({gain:+.0f}%)"))
                    if r["memory_peak_mb"] and first["memory_peak_mb"]:
                        mem_ratios.append(r["memory_peak_mb"] / first["memory_peak_mb"])
                        mem_decided.append(memory_change([first["memory_peak_mb"]], [r["memory_peak_mb"]],
                                                         _source(r))["decided"])
                row.append("baseline" if b == b0 else (f"{sum(mem_ratios) / len(mem_ratios):.2f}x" + (
                    "" if any(mem_decided) else " (within the memory noise floor)") if mem_ratios else "n/a"))
                table.append(row)
            parts += ["", "Batch size effects:", markdown_table(headers, table)]
        parts += [""] + frontier_lines(list(cells.values()))
        said = verdicts(list(cells.values()))
        if said:
            parts += ["", "Verdicts:"] + said
        parts.append("")
    return "\n".join(parts).rstrip()


def label(row: Dict[str, Any]) -> str:
    """A configuration as the plots name it: ``48/b2`` is input size 48, batch size 2."""
    return f"{row['tile_size']}/b{row['batch_size']}"


def frontier(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The memory/throughput frontier of one sweep's rows (one mode, device and precision; see :func:`groups`): the
    successful rows with a peak memory that no other row beats, a row being beaten by one with at least its pixels/s
    at no more peak memory and better on one of the two; peaks within the memory noise floor of each other
    (:func:`lightning_perf.summary.memory_floor.memory_change`) count as the same. Least memory first."""
    placed = [r for r in _ok(rows) if r["memory_peak_mb"] is not None and r["pixels_per_sec"] is not None]

    def beats(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
        # memory is compared against its noise floor (summary/memory_floor.py): 12 against 6 MiB is the same peak
        sign = memory_change([b["memory_peak_mb"]], [a["memory_peak_mb"]], _source(a))["sign"]
        return (a["pixels_per_sec"] >= b["pixels_per_sec"] and sign != 1
                and (a["pixels_per_sec"] > b["pixels_per_sec"] or sign == -1))

    on = [r for r in placed if not any(beats(other, r) for other in placed)]
    return sorted(on, key=lambda r: (r["memory_peak_mb"], r["pixels_per_sec"]))


def _source(row: Dict[str, Any]) -> str:
    """Where a sweep row's peak comes from (memory_floor.SOURCES): the allocator on CUDA, the process's RSS rise on
    CPU."""
    return "allocator" if str(row.get("device") or "").startswith("cuda") else "process"


def _sign(change_pct: float, noise_pct: float) -> int:
    """+1 / -1 for a change beyond the noise either way, 0 inside it (or none at all)."""
    return 1 if change_pct > noise_pct else -1 if change_pct < -noise_pct else 0


def _mpx(row: Dict[str, Any]) -> str:
    return f"{significant(row['pixels_per_sec'] / 1e6)} Mpx/s"


def _mb(value: float) -> str:
    return f"{significant(value, 2)} MiB"


def frontier_lines(rows: List[Dict[str, Any]]) -> List[str]:
    """The frontier of one group's rows (one row per configuration), then the trade-off list: what each step along
    it gains in pixels/s and pays in peak memory."""
    on = frontier(rows)
    if not on:
        return []
    unplaced = [label(r) for r in _ok(rows) if r["memory_peak_mb"] is None or r["pixels_per_sec"] is None]
    names = [label(r) + (" (noisy)" if noisy_note(r) else "") for r in on]
    lines = ["Frontier (pixels/s against peak memory; no other configuration has as many pixels/s for as little"
             " memory), least memory first: " + ", ".join(names)
             + (f" (not placed, no peak memory: {', '.join(unplaced)})" if unplaced else "")]
    if len(on) == 1:
        placed = [r for r in _ok(rows) if r["memory_peak_mb"] is not None and r is not on[0]]
        tied = [r for r in placed if not memory_change([on[0]["memory_peak_mb"]], [r["memory_peak_mb"]],
                                                      _source(r))["decided"]]
        lines.append(f"Trade-offs: none; {label(on[0])} has the most pixels/s ({_mpx(on[0])}) and "
                     + (f"a peak ({_mb(on[0]['memory_peak_mb'])}) within the memory noise floor of"
                        f" {'every other' if len(tied) == len(placed) else 'those of ' + ', '.join(map(label, tied))}"
                        if tied else f"the least peak memory ({_mb(on[0]['memory_peak_mb'])}) of all"))
        return lines
    lines.append("Trade-offs along the frontier:")
    lines.append(f"- {label(on[0])}: the least peak memory ({_mb(on[0]['memory_peak_mb'])}), {_mpx(on[0])}")
    for a, b in zip(on, on[1:]):
        gain = _pct(b["pixels_per_sec"], a["pixels_per_sec"])
        noise = speed_noise_pct(a, b)
        cost = _pct(b["memory_peak_mb"], a["memory_peak_mb"])
        paid = (f"{cost:+.0f}%" if cost is not None
                else f"+{significant(b['memory_peak_mb'] - a['memory_peak_mb'], 2)} MiB")
        if not memory_change([a["memory_peak_mb"]], [b["memory_peak_mb"]], _source(a))["decided"]:
            paid += " (within the memory noise floor)"
        lines.append(f"- {label(a)} -> {label(b)}: {gain:+.0f}% pixels/s ({_mpx(a).split()[0]} -> {_mpx(b)})"
                     + (f", within noise (±{noise:.0f}%)," if _sign(gain, noise) == 0 else "")
                     + f" for {paid} peak memory ({_mb(a['memory_peak_mb']).split()[0]} ->"
                       f" {_mb(b['memory_peak_mb'])})")
    lines.append(f"- {label(on[-1])}: the most pixels/s ({_mpx(on[-1])}), {_mb(on[-1]['memory_peak_mb'])}")
    return lines


def verdicts(rows: List[Dict[str, Any]]) -> List[str]:
    """Seed 003's verdict sentences, each only where the rows decide it (one row per configuration of one group).

    Per pixel: each size against the smallest, at every batch size both ran; "N is more efficient per pixel" when
    its pixels/s is higher beyond the noise at every one of them (lower: the smallest is). Batching: samples/s from
    the smallest batch to the largest batch that two sizes or more ran, per size; "Larger inputs benefit less from
    batching" when that gain falls beyond the noise from each size to the next (rises: "more"). Noise is bench-
    compare's: :data:`NOISE_FACTOR` x the largest std/mean time of the rows compared. Where the rows do not decide,
    a "no verdict" line says why."""
    cells = _latest(_ok(rows))
    if not cells:
        return []
    sizes = sorted({s for s, _ in cells})
    batches = sorted({b for _, b in cells})
    out: List[str] = []
    s0 = sizes[0]
    for size in sizes[1:]:
        marks = []
        for b in batches:
            r, base = cells.get((size, b)), cells.get((s0, b))
            if r is None or base is None:
                continue
            found = _decide(r.get("_pixels_rounds"), base.get("_pixels_rounds"),
                            _pct(r["pixels_per_sec"], base["pixels_per_sec"]), (r, base))
            if found is not None:
                marks.append((b, *found[:3]))
        if not marks:
            continue
        signs = {sign for _, _, sign, _ in marks}
        detail = ", ".join(f"{g:+.0f}% at batch {b}" + (f" (within noise, {noise})" if sign == 0 else "")
                           for b, g, sign, noise in marks)
        if signs == {1}:
            out.append(f"- {size} is more efficient per pixel than {s0}: more pixels per second at every batch size"
                       f" both ran ({detail}).")
        elif signs == {-1}:
            out.append(f"- {s0} is more efficient per pixel than {size}: {size} processes fewer pixels per second at"
                       f" every batch size both ran ({detail}).")
        else:
            why = "the batch sizes disagree" if {1, -1} <= signs else "not beyond the noise at every batch size"
            out.append(f"- {size} against {s0} per pixel: no verdict ({why}): pixels/s {detail}.")
    b0 = batches[0]
    for top in reversed(batches[1:]):
        ran = [s for s in sizes if (s, b0) in cells and (s, top) in cells]
        if len(ran) >= 2:
            break
    else:
        ran = []
    if ran:
        gains = [cells[(s, top)]["throughput_samples_per_sec"] / cells[(s, b0)]["throughput_samples_per_sec"]
                 for s in ran]
        # each round's gain from batch b0 to top, per size: the rounds pair up (one round measured both batches)
        round_gains = {s: per_round_ratio(cells[(s, top)].get("_samples_rounds") or [],
                                          cells[(s, b0)].get("_samples_rounds") or []) for s in ran}
        steps = [_decide(round_gains[s2], round_gains[s1], _pct(g2, g1),
                         (cells[(s1, b0)], cells[(s1, top)], cells[(s2, b0)], cells[(s2, top)]))
                 for s1, s2, g1, g2 in zip(ran, ran[1:], gains, gains[1:])]
        steps = [step for step in steps if step is not None]
        signs = {sign for _, sign, _, _ in steps}
        detail = f"samples/s from batch {b0} to {top}: " + ", ".join(
            f"{100 * (g - 1):+.0f}% at {s}" for s, g in zip(ran, gains))
        if signs == {-1}:
            out.append(f"- Larger inputs benefit less from batching: {detail}.")
        elif signs == {1}:
            out.append(f"- Larger inputs benefit more from batching: {detail}.")
        elif 0 in signs:
            noise = max((step for step in steps if step[1] == 0), key=lambda step: step[3])[2]
            out.append(f"- Batching, {detail}; no verdict on input size: the gains differ by less than the noise"
                       f" ({noise}).")
        else:
            out.append(f"- Batching, {detail}; no verdict on input size: the gain neither falls nor rises steadily"
                       " with size.")
    noisy = [f"{label(r)} (std {spread_pct(r):.0f}% of mean)" for r in cells.values() if noisy_note(r)]
    if out and noisy and rounds_of(list(cells.values())) < 2:
        out.append(f"- Noisy rows: {', '.join(noisy)}; their spread counts as noise above, so they decide less.")
    if out and rounds_of(list(cells.values())) < 2:
        out.append("- Noise: the spread over each configuration's iterations in one round; the drift between rounds"
                   f" was not measured (bench --rounds 2 or more; default {DEFAULT_ROUNDS}).")
    elif out:
        out.append(f"- Noise: the spread between {rounds_of(list(cells.values()))} interleaved rounds of every"
                   " configuration; a sentence is said only where the 95% intervals exclude no change.")
    return out


def _decide(new_rounds: Optional[List[Optional[float]]], old_rounds: Optional[List[Optional[float]]],
            change: Optional[float], rows: Tuple[Dict[str, Any], ...]) -> Optional[Tuple[float, int, str, float]]:
    """(change %, sign, noise in words, its width in %) of one comparison: from the interval between rounds where
    both sides ran two rounds or more, else against :func:`speed_noise_pct` of ``rows`` (one round: the spread over its
    iterations)."""
    found = between_rounds(new_rounds or [], old_rounds or []) if len(new_rounds or []) > 1 else None
    if found is not None:
        return found["change_pct"], found["sign"], interval_words(found), found["high_pct"] - found["low_pct"]
    if change is None:
        return None
    noise = speed_noise_pct(*rows)
    return change, _sign(change, noise), f"±{noise:.0f}%", noise


def compare_bench(old: List[Dict[str, Any]], new: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per configuration in both sweeps (matched on mode, size, batch, precision, device; the last row of each):
    samples/s of each and its change, peak memory of each and its change. Configurations in one sweep only, or
    failed in either, are listed with what happened.

    Noise: ``noise_pct`` is :data:`NOISE_FACTOR` x the larger of the two rows' std over iterations as a percentage of
    their mean time; a speed change whose size is below it is ``within_noise``. A row whose std is over 25% of its
    mean is named noisy in ``note``."""
    def key(r: Dict[str, Any]) -> Tuple[Any, ...]:
        return tuple(r[k] for k in MATCH_ON)

    a = {key(r): r for r in combine_rounds(old)}
    b = {key(r): r for r in combine_rounds(new)}
    out = []
    for k in list(a) + [k for k in b if k not in a]:
        ra, rb = a.get(k), b.get(k)
        row: Dict[str, Any] = dict(zip(MATCH_ON, k))
        row.update(old_samples_per_s=None, new_samples_per_s=None, speed_change_pct=None, old_spread_pct=None,
                   new_spread_pct=None, noise_pct=None, within_noise=None, old_peak_mb=None, new_peak_mb=None,
                   memory_change_pct=None, memory_decided=None, note="")
        if ra is None or rb is None:
            row["note"] = "only in the new sweep" if ra is None else "only in the old sweep"
        elif ra["error"] or rb["error"]:
            row["note"] = f"old: {ra['error'] or 'ok'}, new: {rb['error'] or 'ok'}"
        else:
            row.update(old_samples_per_s=ra["throughput_samples_per_sec"], new_samples_per_s=rb["throughput_samples_per_sec"],
                       old_peak_mb=ra["memory_peak_mb"], new_peak_mb=rb["memory_peak_mb"])
            row["speed_change_pct"] = _pct(rb["throughput_samples_per_sec"], ra["throughput_samples_per_sec"])
            row["memory_change_pct"] = _pct(rb["memory_peak_mb"], ra["memory_peak_mb"])
            change = memory_change([ra["memory_peak_mb"]], [rb["memory_peak_mb"]], _source(ra))
            row["memory_decided"] = change["decided"] if change["sign"] is not None else None
            row["old_spread_pct"], row["new_spread_pct"] = spread_pct(ra), spread_pct(rb)
            spread = row["old_spread_pct"] is not None or row["new_spread_pct"] is not None
            if spread and row["speed_change_pct"] is not None:
                row["noise_pct"] = speed_noise_pct(ra, rb)
                row["within_noise"] = abs(row["speed_change_pct"]) < row["noise_pct"]
            row["note"] = "; ".join(f"{which} {noisy_note(r)}" for which, r in (("old", ra), ("new", rb))
                                    if noisy_note(r))
            found = between_rounds(rb["_samples_rounds"], ra["_samples_rounds"])
            if found is not None:  # both sweeps ran rounds: the noise is the spread between them
                row["noise_pct"] = (found["high_pct"] - found["low_pct"]) / 2.0
                row["within_noise"] = found["sign"] == 0
                row["note"] = "; ".join(n for n in (interval_words(found), row["note"]) if n)
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

    def memory(r: Dict[str, Any]) -> str:  # a change inside the memory noise floor is no change (memory_floor.py)
        if r.get("memory_decided") is False:
            return f"within floor ({r['new_peak_mb'] - r['old_peak_mb']:+.1f} MiB)"
        return pct(r["memory_change_pct"])

    table = [[r["mode"], str(r["tile_size"]), str(r["batch_size"]), str(r["precision"]), str(r["device"]),
              num(r["old_samples_per_s"]), num(r["new_samples_per_s"]), speed(r),
              "-" if r["noise_pct"] is None else f"±{r['noise_pct']:.1f}%",
              num(r["old_peak_mb"], 0), num(r["new_peak_mb"], 0), memory(r), r["note"]]
             for r in rows]
    return markdown_table(["mode", "size", "batch", "precision", "device", "old samples/s", "new samples/s", "speed",
                           "noise", "old peak MiB", "new peak MiB", "memory", "note"], table)
