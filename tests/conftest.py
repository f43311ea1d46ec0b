import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))


def pytest_configure(config):
    """In each worker of ``pytest -n N`` (``make test``): torch on one thread. The fits here are small; a worker a
    core with torch's default of a thread a core would run N threads on each core."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _ddp_port_of_this_worker(monkeypatch):
    """Under pytest-xdist, each worker's DDP fits meet on a port of their own, below the range the kernel hands out
    to other sockets. Without it Lightning takes a free port once a process (and keeps it in MASTER_PORT): free when
    found, bound seconds later by the fit's rank 0, so the other worker's sockets could take it meanwhile."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit():
        monkeypatch.setenv("MASTER_PORT", str(23450 + int(worker[2:])))


@pytest.fixture
def simulated_gpu(monkeypatch):
    """VRAMMonitor on a simulated CUDA device: the allocator is test_vram_monitor's FakeCuda (returned)."""
    import torch

    import lightning_perf.callbacks.vram_monitor.callback as vram_module
    from lightning_perf import VRAMMonitor
    from test_vram_monitor import FakeCuda

    cuda = FakeCuda()
    monkeypatch.setattr(vram_module, "cuda_backend", lambda: cuda)
    monkeypatch.setattr(VRAMMonitor, "_device", lambda self, trainer: torch.device("cuda", 0))
    return cuda


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; runs on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# -- every summary the suite writes is checked against the one typed definition (docs/perf_summary.schema.json) --

_CHECKED = set()


def _summaries_under(root):
    """perf_summary*.json files under ``root`` that claim to be summaries (a JSON object with schema_version):
    tests of the atomic writer store other objects under that name."""
    import glob
    import json

    for path in glob.glob(os.path.join(str(root), "**", "perf_summary*.json"), recursive=True):
        if path in _CHECKED or not os.path.isfile(path):  # a named pipe a test made there: opening it would block
            continue
        _CHECKED.add(path)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue  # half a file is what some tests make on purpose; the readers' tests cover refusing it
        if isinstance(data, dict) and "schema_version" in data:
            yield path, data


def _check_written_summaries(root):
    from lightning_perf.summary.model import parse
    from lightning_perf.summary.schema import SummaryError

    bad = []
    for path, data in _summaries_under(root):
        try:
            parse(data, path)
        except SummaryError as err:
            bad.append(str(err))
    assert not bad, "a summary written by the suite does not match the model:\n" + "\n".join(bad)


@pytest.fixture(autouse=True)
def _written_summaries_match_the_model(request):
    """After each test that has a tmp_path: every summary under it validates (a writer bug fails the test)."""
    root = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if root is not None:
        _check_written_summaries(root)


@pytest.fixture(scope="session", autouse=True)
def _session_summaries_match_the_model(tmp_path_factory):
    """At the end: the summaries of module-scoped fixtures (tmp_path_factory) too."""
    yield
    _check_written_summaries(tmp_path_factory.getbasetemp())
