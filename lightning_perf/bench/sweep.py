"""A memory/throughput sweep of one model over input sizes x batch sizes, in inference or training mode."""

from __future__ import annotations

import csv
import datetime as _dt
import gc
import importlib
import math
import os
import statistics
import sys
from typing import Any, Callable, Dict, Iterable, List, Optional

from lightning_perf.bench.oom_snapshot import OomSnapshots, default_folder
from lightning_perf.bench.rounds import round_order
from lightning_perf.measure.timing.clock import now

CSV_COLUMNS = [
    "timestamp", "mode", "tile_size", "batch_size", "device", "precision", "model_params", "model_size_mb",
    "avg_time_ms", "std_time_ms", "throughput_samples_per_sec", "pixels_per_sec", "memory_allocated_mb",
    "memory_reserved_mb", "memory_peak_mb", "efficiency_pixels_per_sec_per_mb", "forward_time_ms",
    "backward_time_ms", "optimizer_time_ms", "total_time_ms", "error", "sweep_id",
]
#: The header before sweeps had ids: still read (its rows are one sweep, :data:`LEGACY_SWEEP_ID`), never appended to.
LEGACY_COLUMNS = CSV_COLUMNS[:-1]
LEGACY_SWEEP_ID = "legacy"
PRECISIONS = {"32": "float32", "16": "float16", "bf16": "bfloat16"}
DEFAULT_WARMUP = {"inference": 10, "train": 5}
DEFAULT_ITERS = {"inference": 50, "train": 20}


class BenchError(ValueError):
    """Bad input to a sweep (model path, factory, sizes, CSV header): a one-line message, exit code 2."""


class FactoryError(BenchError):
    """The model factory cannot build a model: it raised, or returned something that is not a ``torch.nn.Module``."""


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "a str", "an int"."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def load_callable(spec: str, what: str = "--model") -> Callable[..., Any]:
    """``pkg.module:name`` -> the object; a one-line BenchError when it does not import or is not callable."""
    if ":" not in spec:
        raise BenchError(f"{what} {spec!r}: expected 'package.module:callable'")
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001
        raise BenchError(f"{what} {spec!r}: cannot import {module_name!r}: {type(err).__name__}: {err}") from None
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise BenchError(f"{what} {spec!r}: {module_name!r} has no {attr!r}")
    if not callable(obj):
        raise BenchError(f"{what} {spec!r}: {attr!r} is not callable")
    return obj


def default_inputs(batch_size: int, size: int, device: Any, channels: int = 3) -> Any:
    """An image batch: (batch, channels, size, size) from a normal distribution."""
    import torch

    return torch.randn(batch_size, channels, size, size, device=device)


#: What an out-of-memory RuntimeError says: CUDA's allocator, and on CPU c10's DefaultCPUAllocator
#: ("[enforce fail at alloc_cpu.cpp:...] DefaultCPUAllocator: can't allocate memory: ... (Cannot allocate memory)").
OOM_MESSAGES = ("out of memory", "defaultcpuallocator", "can't allocate memory", "cannot allocate memory",
                "not enough memory")


def is_oom(err: BaseException) -> bool:
    """True for an allocation failure on any device: ``torch.OutOfMemoryError``, ``MemoryError``, or a
    RuntimeError whose message is one of :data:`OOM_MESSAGES`."""
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(err, oom_type):
        return True
    if isinstance(err, MemoryError):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and any(m in text for m in OOM_MESSAGES)


def new_sweep_id() -> str:
    """The id of one sweep: its UTC start time, to the second, and 4 random hex digits for two sweeps started in the
    same second (``20240501T101502Z-3fa1``)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{os.urandom(2).hex()}"


def check_csv(path: str) -> bool:
    """True when ``path`` exists with our header (rows will be appended); BenchError when its header differs."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return False
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), [])
    except (csv.Error, UnicodeDecodeError) as err:  # a field over the csv module's limit, bytes that are no UTF-8
        raise BenchError(f"--csv {path!r} is not a lightning-perf bench CSV ({err}); write to a new file") from None
    if header == LEGACY_COLUMNS:  # appending would leave the old rows without a sweep id: they would mix again
        raise BenchError(f"--csv {path!r} was written before sweeps had ids (no sweep_id column); it is still read by"
                         " --from-csv and bench-compare, but new rows need a new file: pass another --csv")
    if header != CSV_COLUMNS:
        pairs = list(zip(header, CSV_COLUMNS))
        first = next((i for i, (a, b) in enumerate(pairs) if a != b), len(pairs))
        raise BenchError(f"--csv {path!r}: its header does not match this version's columns ({len(header)} vs"
                         f" {len(CSV_COLUMNS)} columns; first difference at column {first}); write to a new file")
    return True


def _release_free_heap() -> None:
    """Hands memory that glibc keeps after frees back to the OS, so each CPU configuration's RSS growth is its own."""
    from lightning_perf.measure.memory.readers import heap_trimmer

    trim = heap_trimmer()
    if trim is not None:
        trim()


def _sync(device: Any) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _loss(output: Any) -> Any:
    import torch

    if isinstance(output, torch.Tensor):
        return output.float().mean()
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        return sum(_loss(o) for o in output if isinstance(o, torch.Tensor) and o.is_floating_point())
    raise TypeError(f"cannot make a loss from a {type(output).__name__} output")


def run_config(factory: Callable[[], Any], size: int, batch_size: int, mode: str, device: Any, precision: str,
               warmup: int, iters: int, input_builder: Callable[..., Any], check_factory: bool = False,
               on_oom: Optional[Callable[[], None]] = None) -> Dict[str, Any]:
    """One configuration: a fresh model, a clean allocator, warm-up, then ``iters`` timed iterations.

    A factory that returns no ``nn.Module`` raises :class:`FactoryError`; with ``check_factory`` (the sweep's first,
    discarded configuration) so does a factory that raises anything but an out-of-memory error. ``on_oom`` is called
    on an out-of-memory error before anything is freed (the failing frames' tensors still live): where a snapshot of
    the allocator is taken."""
    import torch
    from torch import nn

    from lightning_perf.measure.memory.readers import PeakSampler, RssReader

    row: Dict[str, Any] = {k: None for k in CSV_COLUMNS}
    row.update(timestamp=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), mode=mode,
               tile_size=size, batch_size=batch_size, device=str(device), precision=precision, error="")
    gc.collect()
    _release_free_heap()
    rss = RssReader()
    sampler = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    else:
        sampler = PeakSampler(lambda: {"rss": rss()}, 0.005)
        sampler.set_phase("config")
        sampler.start()
    base_rss = rss()
    model = opt = x = None
    try:
        try:
            model = factory()
        except Exception as err:  # noqa: BLE001
            if not check_factory or is_oom(err):
                raise
            text = " ".join(str(err).split())[:300]
            raise FactoryError(f"the factory raised {type(err).__name__}" + (f": {text}" if text else "")) from None
        if not isinstance(model, nn.Module):
            what = "None" if model is None else _a(type(model).__name__)
            raise FactoryError(f"the factory returned {what}, not a torch.nn.Module")
        model = model.to(device)
        params = sum(p.numel() for p in model.parameters())
        row["model_params"] = params
        row["model_size_mb"] = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
        dtype = getattr(torch, PRECISIONS[precision])
        autocast = torch.autocast(device.type, dtype=dtype, enabled=precision != "32")
        x = input_builder(batch_size, size, device)
        fwd, bwd, step, total = [], [], [], []
        if mode == "train":
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=1e-4)
            for i in range(warmup + iters):
                _sync(device)
                t0 = now()
                with autocast:
                    loss = _loss(model(x))
                _sync(device)
                t1 = now()
                loss.backward()
                _sync(device)
                t2 = now()
                opt.step()
                opt.zero_grad(set_to_none=True)
                _sync(device)
                t3 = now()
                if i >= warmup:
                    fwd.append(t1 - t0), bwd.append(t2 - t1), step.append(t3 - t2), total.append(t3 - t0)
        else:
            model.eval()
            with torch.inference_mode():
                for i in range(warmup + iters):
                    _sync(device)
                    t0 = now()
                    with autocast:
                        model(x)
                    _sync(device)
                    if i >= warmup:
                        total.append(now() - t0)
        mean = statistics.fmean(total)
        row["avg_time_ms"] = 1000 * mean
        row["std_time_ms"] = 1000 * statistics.stdev(total) if len(total) > 1 else 0.0
        row["total_time_ms"] = 1000 * mean
        if fwd:
            row["forward_time_ms"] = 1000 * statistics.fmean(fwd)
            row["backward_time_ms"] = 1000 * statistics.fmean(bwd)
            row["optimizer_time_ms"] = 1000 * statistics.fmean(step)
        row["throughput_samples_per_sec"] = batch_size / mean
        row["pixels_per_sec"] = batch_size * size * size / mean
        if device.type == "cuda":
            row["memory_allocated_mb"] = torch.cuda.memory_allocated(device) / 2**20
            row["memory_reserved_mb"] = torch.cuda.memory_reserved(device) / 2**20
            row["memory_peak_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        else:
            sampler.set_phase(None)
            row["memory_peak_mb"] = max(0.0, (sampler.peak("config", "rss") or base_rss) - base_rss)
        if row["memory_peak_mb"]:
            row["efficiency_pixels_per_sec_per_mb"] = row["pixels_per_sec"] / row["memory_peak_mb"]
    except BenchError:
        raise
    except Exception as err:  # noqa: BLE001 - one configuration's failure is its row, the sweep goes on
        row["error"] = "OOM" if is_oom(err) else f"{type(err).__name__}: {err}"[:300]
        if on_oom is not None and row["error"] == "OOM":
            on_oom()
    finally:
        if sampler is not None:
            sampler.stop()
        rss.close()
        del model, opt, x
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def run_sweep(
    factory: Callable[[], Any],
    input_sizes: Iterable[int],
    batch_sizes: Iterable[int],
    mode: str = "inference",
    device: str = "cpu",
    precision: str = "32",
    warmup: Optional[int] = None,
    iters: Optional[int] = None,
    input_builder: Optional[Callable[..., Any]] = None,
    csv_path: Optional[str] = None,
    progress: bool = True,
    sweep_id: Optional[str] = None,
    rounds: int = 1,
    oom_snapshot: bool = True,
    oom_snapshot_dir: Optional[str] = None,
) -> List[Dict[str, Any]]:
    """Runs every (input size, batch size) configuration ``rounds`` times, in interleaved rounds (every configuration
    once a round, the order reversed each round: a drift of the machine lands on all alike), and returns one row per
    configuration and round, in the order run (:func:`lightning_perf.bench.sweep_rounds.combine_rounds` makes one
    row per configuration of them, with the spread between rounds).

    Every row carries ``sweep_id`` (default :func:`new_sweep_id`), so that sweeps appended to one CSV stay apart.

    Rows are appended to ``csv_path`` as each finishes (a header only when the file is new), so an interruption
    keeps every finished row. With ``oom_snapshot`` on CUDA, a configuration that runs out of memory runs once more
    with the allocator's history recorded and its rows link the snapshot (``oom_snapshot``, else
    ``oom_snapshot_unavailable`` says why; :mod:`lightning_perf.bench.oom_snapshot`), written under
    ``oom_snapshot_dir`` (default beside the CSV, :func:`~lightning_perf.bench.oom_snapshot.default_folder`).

    Raises BenchError for bad arguments before anything runs, and :class:`FactoryError` when the factory cannot build
    a model, before anything is written (the CSV untouched, no progress bar drawn).
    """
    import torch

    sizes, batches = list(input_sizes), list(batch_sizes)
    for name, values in (("input size", sizes), ("batch size", batches)):
        if not values or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in values):
            raise BenchError(f"every {name} must be a positive integer, got {values}")
    if mode not in DEFAULT_WARMUP:
        raise BenchError(f"mode {mode!r}: expected inference or train")
    if precision not in PRECISIONS:
        raise BenchError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BenchError("device cuda: no CUDA device is available here")
    warmup = DEFAULT_WARMUP[mode] if warmup is None else warmup
    iters = DEFAULT_ITERS[mode] if iters is None else iters
    for name, value, least in (("warmup", warmup, 0), ("iters", iters, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise BenchError(f"{name} must be an integer >= {least}, got {value!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise BenchError(f"rounds must be an integer >= 1, got {rounds!r}")
    if not isinstance(oom_snapshot, bool):
        raise BenchError(f"oom_snapshot must be True or False, got {oom_snapshot!r}")
    folder = oom_snapshot_dir or default_folder(csv_path)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise BenchError(f"--oom-snapshot-dir {folder!r} is not a folder")
    builder = input_builder or default_inputs
    sweep_id = sweep_id or new_sweep_id()
    oom_snapshots = OomSnapshots(oom_snapshot, folder, sweep_id, dev)
    appending = check_csv(csv_path) if csv_path else False
    if csv_path:
        from lightning_perf.summary.io import special_kind

        kind = special_kind(csv_path)
        if kind is not None:  # appending to a named pipe blocks; a device is not ours to write
            raise BenchError(f"--csv {csv_path!r} is {kind}, not a regular file")
    configs = [(s, b) for s in sizes for b in batches]
    # one discarded configuration first: libraries load their kernels and threads lazily, once per process, and that
    # memory and time must not land on the first row. It runs before the CSV is opened and the bar drawn, so that a
    # factory that cannot build a model writes nothing and is one clean line on stderr.
    run_config(factory, configs[0][0], configs[0][1], mode, dev, precision, 1, 1, builder, check_factory=True)
    rows: List[Dict[str, Any]] = []
    fh = writer = None
    if csv_path:
        os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
        fh = open(csv_path, "a", newline="", encoding="utf-8")
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        if not appending:
            writer.writeheader()
            fh.flush()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(configs) * rounds, desc="bench", unit="config", file=sys.stderr)
    try:
        for k, (size, batch) in ((k, c) for k in range(1, rounds + 1) for c in round_order(configs, k)):
            if bar is not None:
                bar.set_postfix_str(f"size {size} batch {batch}" + (f" round {k}" if rounds > 1 else ""))
            row = run_config(factory, size, batch, mode, dev, precision, warmup, iters, builder)
            row["sweep_id"] = sweep_id
            rows.append(row)
            if writer is not None:
                writer.writerow({k: ("" if row[k] is None else row[k]) for k in CSV_COLUMNS})
                fh.flush()
            oom_snapshots.link(row, lambda on_oom: run_config(factory, size, batch, mode, dev, precision, warmup,
                                                              iters, builder, on_oom=on_oom))
            if bar is not None:
                bar.update(1)
    finally:
        try:
            if bar is not None:
                bar.close()  # on a closed stderr this raises again: the CSV is closed all the same
        finally:
            if fh is not None:
                fh.close()
    return rows


#: A row whose std over iterations is more than this share of its mean time is flagged noisy.
NOISY_SPREAD = 0.25


#: A speed change is within noise when its size is below this many times the larger of the two rows' spreads (std /
#: mean time): bench-compare's, the analysis' and the table's best rows'.
NOISE_FACTOR = 2.0


def spread_pct(row: Dict[str, Any]) -> Optional[float]:
    """The row's std over timed iterations as a percentage of their mean (None without both)."""
    mean, std = row.get("avg_time_ms"), row.get("std_time_ms")
    if mean is None or std is None or not mean or math.isnan(mean) or math.isnan(std):
        return None
    return 100.0 * std / mean


def speed_noise_pct(*rows: Dict[str, Any]) -> float:
    """:data:`NOISE_FACTOR` x the largest spread (std / mean time, %) of ``rows``: a speed difference between them
    within it is noise (bench-compare's, the analysis' and the table's rule); 0 where no row has a spread."""
    spreads = [v for v in (spread_pct(r) for r in rows) if v is not None]
    return NOISE_FACTOR * max(spreads) if spreads else 0.0


def noisy_note(row: Dict[str, Any]) -> str:
    """``noisy (std 31% of mean)`` for a row over :data:`NOISY_SPREAD`, else empty."""
    spread = spread_pct(row)
    return f"noisy (std {spread:.0f}% of mean)" if spread is not None and spread > 100 * NOISY_SPREAD else ""


def significant(value: float, digits: int = 3) -> str:
    """``value`` with at least ``digits`` significant digits and no exponent: 2.2 -> "2.20", 0.00123 -> "0.00123",
    1234.5 -> "1234" (a small input's Mpx/s must not read 0.00)."""
    if value == 0 or not math.isfinite(value):
        return format(value, f".{digits - 1}f")
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return format(value, f".{decimals}f")


def _row_note(row: Dict[str, Any]) -> str:
    """The note of a row: noisy over its iterations, and over how many rounds its figures are, with their spread."""
    notes = [noisy_note(row)]
    if (row.get("rounds") or 1) > 1:
        notes.append(f"{row['rounds']} rounds, ±{row['between_rounds_pct']:.1f}% between them")
    if row.get("round_errors"):
        notes.append(row["round_errors"])
    return "; ".join(n for n in notes if n)


def format_table(rows: List[Dict[str, Any]]) -> str:
    """The printed table, with the best throughput and the best efficiency named; where the rows come from more
    than one sweep, a first column says which."""
    ids = list(dict.fromkeys(r.get("sweep_id") for r in rows))
    width = max(len(str(i)) for i in ids) if len(ids) > 1 else 0
    lead = (lambda r: f"{str(r.get('sweep_id')):<{width}} ") if width else (lambda r: "")
    of = (lambda r: f", sweep {r.get('sweep_id')}") if width else (lambda r: "")
    lines = [f"{'sweep':<{width}} " * bool(width) + f"{'size':>6} {'batch':>6} {'time ms':>10} {'± std':>8} {'samples/s':>11} {'Mpx/s':>8} {'peak MiB':>9}"
             f" {'px/s/MiB':>10}  error / note"]
    for r in rows:
        def f(key: str, fmt: str) -> str:
            v = r.get(key)
            return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)

        mpx = None if r["pixels_per_sec"] is None else r["pixels_per_sec"] / 1e6
        lines.append(f"{lead(r)}{r['tile_size']:>6} {r['batch_size']:>6} {f('avg_time_ms', '.2f'):>10}"
                     f" {f('std_time_ms', '.2f'):>8} {f('throughput_samples_per_sec', '.1f'):>11}"
                     f" {'-' if mpx is None else significant(mpx):>8} {f('memory_peak_mb', '.0f'):>9}"
                     f" {f('efficiency_pixels_per_sec_per_mb', '.0f'):>10}  {r['error'] or _row_note(r)}")
    ok = [r for r in rows if not r["error"]]
    if ok:
        best = max(ok, key=lambda r: r["throughput_samples_per_sec"])
        lines.append(f"best throughput: size {best['tile_size']} batch {best['batch_size']}"
                     f" ({best['throughput_samples_per_sec']:.1f} samples/s{of(best)})"
                     + _tied_words(best, ok, "throughput_samples_per_sec"))
        eff = [r for r in ok if r["efficiency_pixels_per_sec_per_mb"]]
        if eff:
            best = max(eff, key=lambda r: r["efficiency_pixels_per_sec_per_mb"])
            lines.append(f"best efficiency: size {best['tile_size']} batch {best['batch_size']}"
                         f" ({best['efficiency_pixels_per_sec_per_mb']:.0f} pixels/s per MiB{of(best)})"
                         + _tied_words(best, eff, "efficiency_pixels_per_sec_per_mb"))
    return "\n".join(lines)


def _tied_words(best: Dict[str, Any], rows: List[Dict[str, Any]], key: str) -> str:
    """``; within noise of it: size 32 batch 2`` for the rows whose ``key`` is within the noise of the best's
    (:data:`NOISE_FACTOR` x the larger spread of the two rows' times, as bench-compare's), so the best is named as
    the highest reading, not as a winner the spread cannot tell apart; '' where none is."""
    tied = []
    for r in rows:
        if r is best or not r.get(key) or not best.get(key):
            continue
        if 100.0 * (best[key] - r[key]) / best[key] <= speed_noise_pct(best, r):
            tied.append(f"size {r['tile_size']} batch {r['batch_size']}")
    return f"; within noise of it: {', '.join(tied)}" if tied else ""
