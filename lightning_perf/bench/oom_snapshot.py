"""bench's out-of-memory snapshots: a configuration that ran out of memory on CUDA runs once more with the allocator's
history recorded, the snapshot is taken where it fails, and every OOM row of that configuration links it. The timed
runs never record: each row's figures come from a run with the history off."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

from lightning_perf.measure.memory import snapshot as snapshots
from lightning_perf.measure.timing.clock import now
from lightning_perf.summary.evidence import snapshot_findings

#: Allocator events kept while the configuration runs again (MemorySnapshot's default; the oldest drop out).
MAX_ENTRIES = 100_000
#: Snapshots one sweep takes at most: each costs a run of its configuration up to the error and a dump of up to
#: :data:`MAX_ENTRIES` events with two HTML views; the first configurations to run out of memory get them.
MAX_PER_SWEEP = 5
#: Largest live allocations kept per snapshot in its JSON (all of them are in the pickle).
TOP_K = 10
FOLDER_SUFFIX = "_oom_snapshots"
OFF = "off (--no-oom-snapshot)"
#: The row fields (not CSV columns: the CSV's header stays as it is; the link is in the file's name).
FIELDS = ("oom_snapshot", "oom_snapshot_unavailable")


def default_folder(csv_path: Optional[str]) -> str:
    """Beside the CSV: ``runs/bench.csv`` -> ``runs/bench_oom_snapshots``; with no CSV ``runs/bench_oom_snapshots``."""
    return os.path.splitext(csv_path or os.path.join("runs", "bench.csv"))[0] + FOLDER_SUFFIX


def snapshot_base(folder: str, sweep_id: str, size: int, batch: int) -> str:
    """The path of one configuration's snapshot without its ending (``.pickle``, ``.json``, ``.trace_plot.html``):
    ``<folder>/<sweep_id>/size<S>_batch<B>``, so a CSV row names its own."""
    return os.path.join(folder, str(sweep_id), f"size{size}_batch{batch}")


def history_unavailable(device: Any) -> Optional[str]:
    """Why the allocator's history cannot be recorded on ``device``; None on CUDA (a function: tests stand in)."""
    if device.type != "cuda":
        return f"the allocator's history is CUDA's; this sweep ran on {device.type}"
    return None


class OomSnapshots:
    """One sweep's snapshots. :meth:`link` gives each row ``oom_snapshot`` (the pickle's path) and
    ``oom_snapshot_unavailable`` (why an OOM row has none); a row that did not run out of memory gets neither."""

    def __init__(self, enabled: bool, folder: str, sweep_id: str, device: Any) -> None:
        self.reason = OFF if not enabled else history_unavailable(device)
        self.folder, self.sweep_id = folder, sweep_id
        self.taken: Dict[Tuple[int, int], Dict[str, Any]] = {}

    def link(self, row: Dict[str, Any], run_again: Callable[[Callable[[], None]], Dict[str, Any]]) -> None:
        """``run_again(on_oom)`` runs the row's configuration once more, calling ``on_oom`` where it fails."""
        row.update(dict.fromkeys(FIELDS))
        if row.get("error") != "OOM":
            return
        key = (row["tile_size"], row["batch_size"])
        if key not in self.taken:  # once a configuration: its later rounds link the same snapshot
            self.taken[key] = self._take(key, run_again)
        row["oom_snapshot"] = self.taken[key].get("path")
        row["oom_snapshot_unavailable"] = self.taken[key].get("reason")

    def _take(self, key: Tuple[int, int], run_again: Callable[[Callable[[], None]], Dict[str, Any]]
              ) -> Dict[str, Any]:
        if self.reason:
            return {"reason": self.reason}
        if sum(1 for t in self.taken.values() if t.get("path")) >= MAX_PER_SWEEP:
            return {"reason": f"the sweep took its {MAX_PER_SWEEP} snapshots (the first configurations to run out"
                              " of memory)"}
        base = snapshot_base(self.folder, self.sweep_id, *key)
        dumped: Dict[str, Any] = {}
        backend = None

        def dump() -> None:
            began = now()
            try:
                dumped.update(snapshots.dump(backend, base, True, TOP_K))
            except Exception as err:  # noqa: BLE001 - a snapshot is extra: the row stands
                dumped["error"] = f"{type(err).__name__}: {err}"
            dumped["dump_ms"] = 1000.0 * (now() - began)

        began = now()
        try:
            backend = snapshots.memory_backend()
            snapshots.start_recording(backend, MAX_ENTRIES, "python")
            try:
                again = run_again(dump)
            finally:
                snapshots.stop_recording(backend)
        except Exception as err:  # noqa: BLE001 - never raise into the sweep for a snapshot
            return {"reason": f"recording the allocator's history failed: {type(err).__name__}: {err}"}
        if dumped.get("error") or not dumped.get("path"):
            why = (f"the snapshot could not be written: {dumped['error']}" if dumped.get("error") else
                   "run again with the allocator's history on, it did not run out of memory" if not again["error"]
                   else f"run again with the allocator's history on, it failed otherwise: {again['error']}")
            return {"reason": why}
        entry = {"sweep_id": self.sweep_id, "tile_size": key[0], "batch_size": key[1], **dumped,
                 "history_full": dumped["trace_entries"] >= MAX_ENTRIES, "max_entries": MAX_ENTRIES,
                 "run_again_s": now() - began}
        try:
            with open(base + ".json", "w", encoding="utf-8") as fh:
                json.dump(entry, fh, indent=1, default=str)
        except OSError as err:
            entry["unavailable"]["json"] = f"{type(err).__name__}: {err}"
        return entry


def snapshot_line(entry: Dict[str, Any]) -> str:
    """``OOM at size 384 batch 4: see memory snapshot P (HTML: ...): it asked for ...; the largest live ...``."""
    text = f"OOM at size {entry['tile_size']} batch {entry['batch_size']}: see memory snapshot {entry['path']}"
    views = entry.get("html") or {}
    if views:
        text += " (HTML: " + ", ".join(views.values()) + ")"
    findings = snapshot_findings(entry)
    return text + (": " + "; ".join(findings) if findings else "")


def unavailable_line(rows: List[Dict[str, Any]]) -> Optional[str]:
    """For OOM rows without a snapshot: one line per reason, naming the configurations."""
    by_reason: Dict[str, List[str]] = {}
    for r in rows:
        if r.get("error") == "OOM" and not r.get("oom_snapshot") and r.get("oom_snapshot_unavailable"):
            named = by_reason.setdefault(r["oom_snapshot_unavailable"], [])
            config = f"size {r['tile_size']} batch {r['batch_size']}"
            if config not in named:
                named.append(config)
    if not by_reason:
        return None
    return "\n".join(f"no memory snapshot for the OOM rows ({', '.join(c)}): {why}" for why, c in by_reason.items())


def saved_lines(rows: List[Dict[str, Any]], folder: str) -> List[str]:
    """For a CSV read back: the snapshots its OOM rows left in ``folder`` (their JSON beside each pickle)."""
    out, seen = [], set()
    for r in rows:
        key = (r.get("sweep_id"), r.get("tile_size"), r.get("batch_size"))
        if r.get("error") != "OOM" or key in seen:
            continue
        seen.add(key)
        path = snapshot_base(folder, *key) + ".json"  # type: ignore[arg-type]
        try:
            with open(path, encoding="utf-8") as fh:
                entry = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and entry.get("path"):
            r["oom_snapshot"] = entry["path"]
            out.append(snapshot_line(entry))
    return out
