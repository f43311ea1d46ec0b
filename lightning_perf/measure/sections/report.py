"""SectionProfiler's words: the printed tables and the plain-language insights, from its section table."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from lightning_perf.measure.sections import loader
from lightning_perf.measure.sections.ledger import AUTO_SECTIONS, BETWEEN, MANUAL_SECTIONS, OPTIMIZER_KIND
from lightning_perf.measure.stats.streaming import LogHistogram

# Insight thresholds (documented in docs/section_profiler.md).
DATA_LOADING_PCT = 15.0
BACKWARD_OVER_FORWARD = 3.0
FORWARD_PCT = 60.0
OPTIMIZER_PCT = 20.0
CHECKPOINT_PCT = 10.0
HOST_OVER_DEVICE = 1.5
BETWEEN_BATCHES_PCT = 15.0
THRESHOLDS = {"data_loading_pct": DATA_LOADING_PCT, "backward_over_forward": BACKWARD_OVER_FORWARD,
              "optimizer_pct": OPTIMIZER_PCT, "forward_pct": FORWARD_PCT, "checkpointing_pct": CHECKPOINT_PCT,
              "host_over_device": HOST_OVER_DEVICE, "between_batches_pct": BETWEEN_BATCHES_PCT,
              "workers_busy_pct": loader.WORKERS_BUSY_PCT, "workers_cpu_pct": loader.WORKERS_CPU_PCT}


def printed_rows(table: Dict[str, Dict[str, Any]]) -> List[tuple]:
    """(label, row) in the printed table's order: the top-level sections by total time, each followed by the user
    sections that ran inside it (by total, indented one step per level, ``name (in parent)``). A section whose parent
    has no row of its own is listed at the top level."""
    present = {name: r for name, r in table.items() if r["count"]}
    children: Dict[Optional[str], List[str]] = {}
    for name, r in present.items():
        parent = r["parent"] if r["kind"] != "auto" and r["parent"] in present and r["parent"] != name else None
        children.setdefault(parent, []).append(name)
    rows: List[tuple] = []
    placed = set()

    def by_total(names: Any) -> List[str]:
        return sorted(names, key=lambda n: -(present[n]["total_s"] or 0))

    def place(name: str, depth: int) -> None:
        placed.add(name)
        r = present[name]
        label = name if r["kind"] == "auto" or r["parent"] is None else f"{name} (in {r['parent']})"
        rows.append(("  " * depth + label, r))
        for child in by_total(children.get(name, ())):
            if child not in placed:
                place(child, depth + 1)

    for name in by_total(children.get(None, ())):
        place(name, 0)
    for name in by_total(set(present) - placed):  # parents in a loop (not made by a fit; a hand-edited
        if name not in placed:  # checkpoint): listed, never lost
            place(name, 0)
    return rows


def at_iteration(iteration: int, step: Optional[int]) -> str:
    """``iteration 50``, with the optimizer step beside it where the two differ (``iteration 50 (optimizer step
    100)``: two optimizers under manual optimization, a resume from another count)."""
    return f"iteration {iteration}" + (f" (optimizer step {step})" if step is not None and step != iteration else "")


def report_table(iteration: int, step: int, iters: int, mean_ms: float, rows: List[tuple]) -> str:
    """The periodic report's table (built on the printer's thread: see ``callbacks.core.printer``), in the final
    table's order; ``rows`` as :meth:`SectionLedger.take_window` gives them. ``iteration``: the iterations of the
    run so far (batches under manual optimization); ``step``: the trainer's global step, shown where it differs."""
    table = {row[0]: {"kind": row[7], "parent": row[8], "count": row[1], "total_s": row[2], "row": row}
             for row in rows}
    labelled = printed_rows(table)
    w = max([22] + [len(label) + 2 for label, _ in labelled])
    lines = [f"=== SectionProfiler report ({at_iteration(iteration, step)}, last {iters} iterations,"
             f" {mean_ms:.2f} ms mean) ===",
             f"{'section':<{w}}{'count':>7}{'total s':>9}{'mean ms':>9}{'min ms':>9}{'max ms':>9}{'share':>8}"]
    for label, r in labelled:
        _, n, total, mean, low, high, pct = r["row"][:7]
        lines.append(f"{label:<{w}}{n:>7}{total:>9.3f}{mean:>9.2f}{low:>9.2f}{high:>9.2f}{pct or 0:>7.1f}%")
    return "\n".join(lines)


def final_table(table: Dict[str, Dict[str, Any]], iteration: LogHistogram, final_row: Optional[Dict[str, Any]],
                insights: List[str]) -> str:
    """The table printed at the fit's end: every section, the work after the last iteration, the insights."""
    rows = printed_rows(table)
    w = max([22] + [len(label) + 2 for label, _ in rows])
    lines = [f"=== SectionProfiler: {iteration.count} iterations, {iteration.mean or 0:.2f} ms mean ===",
             f"{'section':<{w}}{'count':>8}{'total s':>10}{'mean ms':>10}{'min ms':>9}{'p50 ms':>9}{'p95 ms':>9}"
             f"{'max ms':>9}{'share':>8}"]
    for label, r in rows:
        lines.append(f"{label:<{w}}{r['count']:>8}{r['total_s']:>10.3f}{r['mean_ms']:>10.2f}{r['min_ms']:>9.2f}"
                     f"{r['p50_ms']:>9.2f}{r['p95_ms']:>9.2f}{r['max_ms']:>9.2f}{(r['share_pct'] or 0):>7.1f}%")
    if final_row is not None:
        parts = ", ".join(f"{name} {r['total_s']:.3f} s ({r['count']}x)" if r["kind"] == "user" or
                          name == "checkpointing" else f"{name} {r['total_s']:.3f} s"
                          for name, r in sorted(final_row["sections"].items(), key=lambda kv: -kv[1]["total_s"]))
        lines.append(f"after the last iteration: {final_row['total_s']:.3f} s ({parts})")
    lines += ["Insights:"] + [f"- {i}" for i in insights]
    return "\n".join(lines)


def slowest_section(table: Dict[str, Dict[str, Any]]) -> Optional[str]:
    """The automatic or top-level user section with the largest total (nested user sections are inside theirs, as
    the per-optimizer rows are inside ``optimizer_step``)."""
    top_level = AUTO_SECTIONS + MANUAL_SECTIONS
    ranked = [(r["total_s"], n) for n, r in table.items()
              if (r["kind"] == "auto" or r["parent"] is None or r["parent"] in top_level) and r["total_s"] > 0
              and r["kind"] != OPTIMIZER_KIND]
    return max(ranked)[1] if ranked else None


def insights(table: Dict[str, Dict[str, Any]], workers: Optional[Dict[str, Any]]) -> List[str]:
    """Plain-language findings. Automatic sections are compared on inclusive times: a user section inside the
    forward (an EMA, a sampler) is still forward time when weighing backward against forward."""
    share = {n: r.get("inclusive_share_pct", r["share_pct"]) or 0.0 for n, r in table.items()}
    out: List[str] = []
    data = share.get("data_loading", 0.0)
    if data > DATA_LOADING_PCT:
        advice = loader.wait_advice(workers)
        out.append(f"Data loading takes {data:.1f}% of each iteration (above {DATA_LOADING_PCT:g}%): the loop"
                   " waits for batches. " + (advice[0].upper() + advice[1:] + "." if advice else
                                             "Raise DataLoader num_workers, set pin_memory=True and"
                                             " persistent_workers=True, or make preprocessing lighter."))
    elif "data_loading" in table:
        busy = workers.get("busy_pct") if workers else None
        out.append(f"Data loading {data:.1f}%: efficient" + (
            f"; the loop hardly waits for batches (workers busy {busy:.0f}%): more workers would gain nothing."
            if busy is not None else "."))
    between = share.get(BETWEEN, 0.0)
    if between > BETWEEN_BATCHES_PCT:
        out.append(f"Lightning's loop between batches takes {between:.1f}% (above {BETWEEN_BATCHES_PCT:g}%): host"
                   " work of the loop, not data loading (batch-end hooks of callbacks and the module, logging, the"
                   " progress bar). Log less often (log_every_n_steps), refresh the progress bar less often"
                   " (TQDMProgressBar(refresh_rate=...)), or put profile_section in your batch-end hooks.")
    fwd, bwd = (table.get(n, {}).get("inclusive_mean_ms") for n in ("forward", "backward"))
    if fwd and bwd and bwd > BACKWARD_OVER_FORWARD * fwd:
        out.append(f"Backward takes {bwd / fwd:.1f}x the forward (usually about 2x): look for gradient"
                   " checkpointing recomputation, ops with slow backward kernels, or parameters that need no grad.")
    forward = share.get("forward", 0.0)
    if forward > FORWARD_PCT:
        out.append(f"The forward pass takes {forward:.1f}% of each iteration (above {FORWARD_PCT:g}%): mixed"
                   " precision (Trainer(precision='bf16-mixed')), torch.compile, a smaller model or distillation"
                   " cut it; profile_section shows which part of it is slow.")
    opt = share.get("optimizer_step", 0.0)
    if opt > OPTIMIZER_PCT:
        out.append(f"The optimizer step takes {opt:.1f}% (above {OPTIMIZER_PCT:g}%): try a fused or foreach"
                   " optimizer (e.g. torch.optim.AdamW(..., fused=True)) or fewer parameter groups.")
    ckpt = share.get("checkpointing", 0.0)
    if ckpt > CHECKPOINT_PCT:
        out.append(f"Checkpointing takes {ckpt:.1f}% (above {CHECKPOINT_PCT:g}%): save less often"
                   " (every_n_train_steps) or asynchronously.")
    host = sum(table[n]["total_s"] for n in ("forward", "backward", "optimizer_step") if n in table)
    device = sum((table[n]["device_mean_ms"] or 0.0) * table[n]["count"] / 1000.0
                 for n in ("forward", "backward", "optimizer_step") if n in table)
    if device > 0 and host > HOST_OVER_DEVICE * device:
        out.append(f"Host time is {host / device:.1f}x device time in the step: iterations are host-bound (the GPU"
                   " waits for Python). Larger batches, torch.compile or CUDA graphs help.")
    slowest = slowest_section(table)
    if slowest:
        out.append(f"Slowest component: {slowest} ({table[slowest]['mean_ms']:.2f} ms mean).")
    return out
