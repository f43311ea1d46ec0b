"""Run one LightningCLI training under named variants, each in its own process with the suite attached, and
report them like seed 002: total time, speedup with a CI, peak memory, per-epoch times, quality, the best."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from lightning_perf.summary.compare import compare_summaries
from lightning_perf.summary.fields import (
    csv_text,
    dig,
    fmt_duration,
    fmt_mb,
    fmt_num,
    markdown_table,
    train_peak_mb,
)
from lightning_perf.summary.io import load_summary
from lightning_perf.summary.schema import SummaryError

#: Shipped presets: name -> LightningCLI overrides. Model and data presets need those init arguments.
PRESETS: Dict[str, str] = {
    "baseline": "",
    "amp": "--trainer.precision=bf16-mixed",
    "fp16": "--trainer.precision=16-mixed",
    "cudnn_benchmark": "--trainer.benchmark=true",
    "channels_last": "--model.channels_last=true",
    "compile": "--model.compile=true",
    "persistent_workers": "--data.num_workers=2 --data.persistent_workers=true",
}

SUITE = ["IterationTimer", "SectionProfiler", "VRAMMonitor", "EvalNoGradGuard"]
SUMMARY_ENV = "LIGHTNING_PERF_SUMMARY_PATH"


def parse_variants(specs: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """``name`` (a preset) or ``name=--overrides ...``; the first variant is the baseline of the report."""
    variants: List[Tuple[str, List[str]]] = []
    for spec in specs:
        name, sep, overrides = spec.partition("=")
        name = name.strip()
        if not name or not all(c.isalnum() or c in "_-." for c in name):
            raise ValueError(f"--variant {spec!r}: a name of letters, digits, '_', '-' or '.' comes first")
        if not sep:
            if name not in PRESETS:
                raise ValueError(f"--variant {name!r} is no preset ({', '.join(PRESETS)}); write {name}=--overrides")
            overrides = PRESETS[name]
        if any(n == name for n, _ in variants):
            raise ValueError(f"--variant {name!r} is given twice")
        variants.append((name, shlex.split(overrides)))
    if not variants:
        raise ValueError("give at least one --variant")
    return variants


def variant_command(python: str, script: str, config: Optional[str], overrides: List[str], out: str) -> List[str]:
    cmd = [python, script, "fit"]
    if config:
        cmd += ["--config", config]
    cmd += overrides + [f"--trainer.default_root_dir={out}"]
    cmd += [f"--trainer.callbacks+=lightning_perf.{name}" for name in SUITE]
    return cmd


def run_matrix(script: str, variants: List[Tuple[str, List[str]]], out_dir: str, config: Optional[str] = None,
               python: str = sys.executable, timeout_s: Optional[float] = None,
               log=print) -> List[Dict[str, Any]]:
    """Runs each variant in its own process; returns one result per variant (summary or the reason it has none)."""
    results = []
    for name, overrides in variants:
        run_dir = os.path.join(out_dir, name)
        os.makedirs(run_dir, exist_ok=True)
        summary_path = os.path.join(run_dir, "perf_summary.json")
        if os.path.exists(summary_path):
            os.unlink(summary_path)
        cmd = variant_command(python, script, config, overrides, run_dir)
        env = dict(os.environ, **{SUMMARY_ENV: summary_path})
        log(f"[matrix] {name}: {' '.join(shlex.quote(c) for c in cmd)}")
        start = time.perf_counter()
        with open(os.path.join(run_dir, "output.log"), "w") as out:
            try:
                proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout_s)
                code: Optional[int] = proc.returncode
            except subprocess.TimeoutExpired:
                code = None
        wall = time.perf_counter() - start
        result: Dict[str, Any] = {"name": name, "overrides": overrides, "exit_code": code, "wall_s": wall,
                                  "summary_path": summary_path, "summary": None, "log": out.name}
        try:
            result["summary"] = load_summary(summary_path)
        except SummaryError as err:
            result["problem"] = str(err)
        results.append(result)
        log(f"[matrix] {name}: exit {code}, {wall:.1f} s")
    return results


def _status(result: Dict[str, Any]) -> str:
    summary = result["summary"]
    if result["exit_code"] is None:
        return "timed out"
    if summary is None:
        tail = ""
        try:
            with open(result["log"]) as fh:
                lines = [ln.strip() for ln in fh.read().splitlines() if ln.strip()]
            tail = lines[-1][:120] if lines else ""
        except OSError:
            pass
        oom = "out of memory" in tail.lower()
        return ("OOM" if oom else f"crashed (exit {result['exit_code']})") + (f": {tail}" if tail and not oom else "")
    if summary["status"] != "completed":
        message = (summary.get("error") or {}).get("message", "")
        return ("OOM" if "out of memory" in message.lower() else summary["status"]) + (
            f": {message[:120]}" if message and "out of memory" not in message.lower() else "")
    return "completed"


def matrix_rows(results: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    base = next((r["summary"] for r in results if r["summary"] is not None), None)
    rows = []
    for r in results:
        s = r["summary"]
        row: Dict[str, Any] = {"variant": r["name"], "status": _status(r), "overrides": " ".join(r["overrides"]),
                               "wall_s": r["wall_s"]}
        if s is not None:
            cmp = compare_summaries(base, s) if base is not None else {}
            epochs = dig(s, "iteration_timer", "epochs") or []
            row.update(
                train_time_s=dig(s, "iteration_timer", "train_time_s"),
                eval_time_s=dig(s, "iteration_timer", "eval_time_s"),
                ms_per_iter=dig(s, "iteration_timer", "ms_per_iter", "mean"),
                samples_per_s=dig(s, "iteration_timer", "samples_per_s"),
                speedup=cmp.get("speedup"),
                speedup_basis=cmp.get("speedup_basis"),
                speedup_ci_low=(cmp.get("speedup_ci95") or [None, None])[0],
                speedup_ci_high=(cmp.get("speedup_ci95") or [None, None])[1],
                peak_memory_mb=train_peak_mb(s),
                epoch_times_s=" ".join(f"{e['time_s']:.1f}" for e in epochs),
                psnr=dig(s, "quality_gate", "metrics", "psnr", "value"),
                quality_gate=dig(s, "quality_gate", "passed"),
            )
        rows.append(row)
    return rows


def best_variant(rows: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The fastest completed variant whose gate did not fail, by the headline (samples/s where batch sizes differ)."""
    ok = [r for r in rows if r["status"] == "completed" and r.get("speedup") and r.get("quality_gate") is not False]
    return max(ok, key=lambda r: r["speedup"]) if ok else None


def format_matrix(rows: List[Dict[str, Any]], fmt: str = "markdown") -> str:
    if fmt == "csv":
        return csv_text(rows)
    table = []
    for r in rows:
        if r.get("speedup"):
            ci = (f" [{r['speedup_ci_low']:.2f}-{r['speedup_ci_high']:.2f}]" if r.get("speedup_ci_low") else "")
            speed = f"{r['speedup']:.2f}x{ci}"
        else:
            speed = "-"
        gate = {True: "passed", False: "FAILED", None: "-"}[r.get("quality_gate")]
        if r.get("speedup") and r.get("speedup_basis") == "samples/s":
            speed += " samples/s"
        table.append([r["variant"], fmt_duration(r.get("train_time_s")), fmt_num(r.get("ms_per_iter")),
                      fmt_num(r.get("samples_per_s"), 1), speed,
                      fmt_mb(r.get("peak_memory_mb")), r.get("epoch_times_s") or "-", fmt_num(r.get("psnr")), gate,
                      r["status"]])
    text = markdown_table(["Variant", "Train time", "ms/iter (mean)", "Samples/s", "Speedup (95% CI)", "Peak memory", "Epoch times (s)",
                           "PSNR", "Quality gate", "Status"], table)
    best = best_variant(rows)
    if best is not None:
        basis = "samples/s" if best.get("speedup_basis") == "samples/s" else "it/s"
        text += (f"\n\n**Best:** {best['variant']}, {best['speedup']:.2f}x the {basis} of the first variant"
                 f" ({rows[0]['variant']}), quality gate not failed.")
    return text
