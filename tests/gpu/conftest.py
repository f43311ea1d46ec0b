"""GPU checks: each compares one of our figures with an independent measure and records both for docs/gpu.md.

Run on a machine with a CUDA GPU: `make gpu-check` (or `.venv/bin/python -m pytest -m gpu tests/gpu`). Without one
they skip (tests/conftest.py). The table of every check (ours, the independent measure, the bound) is printed at
the end of the session and written to runs/gpu_check/checks.md.
"""

import json
import os

import pytest

_ROWS = []


@pytest.fixture(autouse=True)
def clean_device():
    """Each check starts on an empty device: a finished fit (Lightning's trainer and module refer to each other)
    waits for the garbage collector, and an earlier test's tensors freed by a collection in the middle of a later
    test moved that test's peaks (the first H100 run of the eval-spike check: validation 67 MB under training)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    yield


@pytest.fixture
def record():
    """record(check, ours, independent, unit, bound): one row of the GPU table."""

    def add(check, ours, independent, unit, bound):
        _ROWS.append((check, ours, independent, unit, bound))

    return add


def pytest_terminal_summary(terminalreporter):
    if not _ROWS:
        return
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    lines = [f"GPU checks on {device} (torch {torch.__version__}, CUDA {torch.version.cuda})", "",
             "| check | lightning_perf | independent measure | unit | bound |", "|---|---|---|---|---|"]
    for check, ours, independent, unit, bound in _ROWS:
        fmt = (lambda v: f"{v:.3f}" if isinstance(v, float) else "-" if v is None else str(v))
        lines.append(f"| {check} | {fmt(ours)} | {fmt(independent)} | {unit} | {bound} |")
    text = "\n".join(lines)
    terminalreporter.write_line("")
    terminalreporter.write_line(text)
    folder = os.path.join(os.path.dirname(__file__), "..", "..", "runs", "gpu_check")
    # the rows as data, for tests/gpu/agree.py (make gpu-check: the VRAM checks in a fresh process, then after the
    # rest), and as a table beside them (`make gpu-check` runs three sessions: each writes its own pair)
    rows_path = os.environ.get("LIGHTNING_PERF_GPU_ROWS") or os.path.join(folder, "checks.json")
    os.makedirs(os.path.dirname(os.path.abspath(rows_path)), exist_ok=True)
    with open(os.path.splitext(rows_path)[0] + ".md", "w") as fh:
        fh.write(text + "\n")
    with open(rows_path, "w") as fh:
        json.dump([{"check": c, "ours": o, "independent": i, "unit": u, "bound": b} for c, o, i, u, b in _ROWS], fh,
                  indent=1)
