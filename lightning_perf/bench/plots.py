"""PNG plots for `bench --plot` (the four panels of seed 003) and `report --plot` (it/s and peak memory per run)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Dict, List


#: Most characters of a run name on a plot (the report's table keeps the whole name): matplotlib lays out every
#: character of a label, and a 100,000-character name took it most of a minute.
PLOT_LABEL_CHARS = 40


def plot_label(name: str, limit: int = PLOT_LABEL_CHARS) -> str:
    """A run name as a plot label: at most ``limit`` characters, its start and end kept around an ellipsis (names
    alike but for their ends stay apart), ``$`` escaped so matplotlib does not parse it as math text, unencodable
    characters (a lone surrogate) replaced."""
    text = name.encode("utf-8", errors="replace").decode("utf-8")
    if len(text) > limit:
        head = limit // 2
        text = text[:head] + "\u2026" + text[len(text) - (limit - head - 1):]
    return text.replace("$", r"\$")


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ValueError(f"--plot needs matplotlib (pip install matplotlib): {err}") from None
    return plt


def _save(fig: Any, path: str) -> None:
    """Saves into a regular file (or a new one) only: matplotlib would open a named pipe and block on it."""
    from lightning_perf.summary.io import special_kind

    kind = special_kind(path)
    if kind is not None:
        raise ValueError(f"--plot {path!r} is {kind}, not a regular file")
    fig.savefig(path, dpi=110)


def plot_sweep(rows: List[Dict[str, Any]], path: str, title: str = "") -> None:
    """Memory vs size, throughput vs size (one line per batch size, and per sweep where the rows hold several), time
    breakdown, memory-throughput scatter with the frontier drawn as a line through its configurations (one per sweep,
    mode, device and precision: :func:`~lightning_perf.bench.analysis.frontier`)."""
    from lightning_perf.bench.analysis import frontier, groups

    plt = _pyplot()
    ok = [r for r in rows if not r["error"]]
    sweeps = list(dict.fromkeys(r.get("sweep_id") for r in rows))
    several = len(sweeps) > 1
    by_batch: Dict[Any, List[Dict[str, Any]]] = defaultdict(list)
    for r in ok:  # one line per sweep and batch: two sweeps on one line would zig-zag between them
        by_batch[(sweeps.index(r.get("sweep_id")), r["batch_size"])].append(r)
    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (ax_mem, ax_thr), (ax_time, ax_front) = axes
    for (sweep, batch), rs in sorted(by_batch.items()):
        rs = sorted(rs, key=lambda r: r["tile_size"])
        sizes = [r["tile_size"] for r in rs]
        label = f"{sweeps[sweep]} batch {batch}" if several else f"batch {batch}"
        style = ["-", "--", ":", "-."][sweep % 4]
        ax_mem.plot(sizes, [r["memory_peak_mb"] or 0 for r in rs], marker="o", linestyle=style, label=label)
        ax_thr.plot(sizes, [r["throughput_samples_per_sec"] for r in rs], marker="o", linestyle=style, label=label)
    device = ok[0]["device"] if ok else ""
    mem_label = "peak memory (MiB, allocator)" if device.startswith("cuda") else "peak memory (MiB, RSS growth)"
    ax_mem.set(title="GPU memory vs input size" if device.startswith("cuda") else "Memory vs input size",
               xlabel="input size (pixels per side)", ylabel=mem_label)
    ax_thr.set(title="Throughput vs input size", xlabel="input size (pixels per side)", ylabel="samples / s")
    for ax in (ax_mem, ax_thr):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7 if several else None)
    labels = [(f"s{sweeps.index(r.get('sweep_id')) + 1} " if several else "") + f"{r['tile_size']}/b{r['batch_size']}"
              for r in ok]
    if ok and ok[0]["forward_time_ms"] is not None:
        bottom = [0.0] * len(ok)
        for key, name in (("forward_time_ms", "forward"), ("backward_time_ms", "backward"),
                          ("optimizer_time_ms", "optimizer")):
            values = [r[key] or 0.0 for r in ok]
            ax_time.bar(labels, values, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values)]
        ax_time.legend()
    else:
        ax_time.bar(labels, [r["avg_time_ms"] for r in ok], yerr=[r["std_time_ms"] for r in ok], label="forward")
    ax_time.set(title="Time per iteration", xlabel="input size / batch size", ylabel="ms per iteration")
    ax_time.tick_params(axis="x", rotation=45)
    ax_front.scatter([r["memory_peak_mb"] or 0 for r in ok], [r["pixels_per_sec"] / 1e6 for r in ok])
    for r, label in zip(ok, labels):
        ax_front.annotate(label, (r["memory_peak_mb"] or 0, r["pixels_per_sec"] / 1e6), fontsize=8,
                          xytext=(3, 3), textcoords="offset points")
    parts = groups(rows)
    for key, group in parts:
        on = frontier(list({(r["tile_size"], r["batch_size"]): r for r in group}.values()))
        if not on:
            continue
        what = ([f"s{sweeps.index(key[0]) + 1}"] if key[0] is not None else []) + (
            ["/".join(str(k) for k in key[1:])] if len({k[1:] for k, _ in parts}) > 1 else [])
        # rings around its points: a frontier of one configuration draws no line
        colour = {"color": "tab:red"} if len(parts) == 1 else {}
        ax_front.plot([r["memory_peak_mb"] for r in on], [r["pixels_per_sec"] / 1e6 for r in on], linestyle="-",
                      marker="o", markersize=10, fillstyle="none", label=" ".join(["frontier"] + what), **colour)
    if ax_front.get_lines():
        ax_front.legend(fontsize=7 if len(parts) > 1 else None)
    ax_front.set(title="Memory vs throughput (up and left is better)", xlabel=mem_label,
                 ylabel="throughput (Mpixels / s)")
    ax_front.grid(alpha=0.3)
    failed = [r for r in rows if r["error"]]
    note = f"  ({len(failed)} configuration(s) failed: " + ", ".join(
        f"{r['tile_size']}/b{r['batch_size']} {r['error'][:20]}" for r in failed[:4]) + ")" if failed else ""
    which = ("  (" + ", ".join(f"s{i} = {sweep}" for i, sweep in enumerate(sweeps, start=1)) + ")") if several else ""
    fig.suptitle((title or f"{ok[0]['mode'] if ok else ''} sweep on {device}") + which + note, fontsize=10)
    fig.tight_layout()
    try:
        _save(fig, path)
    finally:
        plt.close(fig)


def plot_report(rows: List[Dict[str, Any]], path: str) -> None:
    """Speed against the first (or previous) run (the report's Change), peak train and eval memory, and quality per
    run."""
    plt = _pyplot()
    names = [r["run"] for r in rows]
    has_quality = any(r.get("psnr") is not None for r in rows)
    fig, axes = plt.subplots(1, 3 if has_quality else 2, figsize=(5 * (3 if has_quality else 2), 4.5))
    axes[0].bar(names, [r["speedup"] or 0 for r in rows], color="tab:blue")
    axes[0].axhline(1.0, color="grey", linewidth=1)
    samples = any(r["speedup_basis"] == "samples/s" for r in rows[1:])
    previous = rows[0].get("change_vs") == "previous"
    axes[0].set(title="Speed vs " + ("the previous run" if previous else names[0]), ylabel="x " + ("(samples/s where batch sizes differ)" if samples
                                                             else "(iterations / s)"))
    width = 0.4
    xs = range(len(rows))
    axes[1].bar([x - width / 2 for x in xs], [r["train_peak_mb"] or 0 for r in rows], width, label="train")
    axes[1].bar([x + width / 2 for x in xs], [r["eval_peak_mb"] or 0 for r in rows], width, label="eval")
    axes[1].set_xticks(list(xs), names)
    axes[1].set(title="Peak memory", ylabel="MiB")
    axes[1].legend()
    if has_quality:
        axes[2].bar(names, [r.get("psnr") or 0 for r in rows], color="tab:green")
        axes[2].set(title="Quality", ylabel="PSNR (dB)")
        low = min(r["psnr"] for r in rows if r.get("psnr") is not None)
        axes[2].set_ylim(bottom=max(0.0, low - 2.0))
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    try:
        _save(fig, path)
    finally:
        plt.close(fig)
