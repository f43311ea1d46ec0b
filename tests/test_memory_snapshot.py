"""MemorySnapshot: the allocator's history dumped on an OOM and over a steps window (the CUDA allocator simulated)."""

import os
import pickle

import pytest
import torch

from helpers import TinyModel, find_summary, fit
from lightning_perf import MemorySnapshot
from lightning_perf.measure.memory import snapshot as snapshots

MB = 1024 * 1024
LIBRARY_FRAME = {"filename": os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "linear.py"), "line": 125,
                 "name": "forward"}
USER_FRAME = {"filename": os.path.abspath(__file__), "line": 42, "name": "training_step"}
OOM_FRAME = {"filename": os.path.abspath(__file__), "line": 57, "name": "training_step"}


def recorded_snapshot():
    """What torch.cuda.memory._snapshot() returns with the history on: two segments, live and free blocks, and
    the trace with an `oom` entry (the request that failed)."""
    return {
        "segments": [
            {"address": 0, "total_size": 1024 * MB, "allocated_size": 512 * MB, "active_size": 512 * MB,
             "stream": 0, "segment_type": "large", "device": 0,
             "blocks": [{"address": 0, "size": 512 * MB, "requested_size": 500 * MB, "state": "active_allocated",
                         "frames": [LIBRARY_FRAME, USER_FRAME]},
                        {"address": 512 * MB, "size": 512 * MB, "requested_size": 512 * MB, "state": "inactive",
                         "frames": []}]},
            {"address": 2048 * MB, "total_size": 64 * MB, "allocated_size": 64 * MB, "active_size": 64 * MB,
             "stream": 0, "segment_type": "large", "device": 0,
             "blocks": [{"address": 2048 * MB, "size": 64 * MB, "requested_size": 64 * MB,
                         "state": "active_allocated", "frames": [LIBRARY_FRAME]}]},
        ],
        "device_traces": [[
            {"action": "alloc", "addr": 0, "size": 512 * MB, "stream": 0, "frames": [LIBRARY_FRAME, USER_FRAME]},
            {"action": "oom", "size": 2048 * MB, "device_free": 100 * MB, "stream": 0,
             "frames": [LIBRARY_FRAME, OOM_FRAME]},
        ]],
    }


class SimulatedAllocator:
    """torch.cuda.memory's history switch and snapshot, logging each call beside the model's steps."""

    def __init__(self, log):
        self.log, self.recording = log, False

    def _record_memory_history(self, enabled="all", stacks="all", max_entries=None, **kwargs):
        self.recording = enabled is not None
        self.log.append(("record", enabled, stacks, max_entries))

    def _snapshot(self):
        assert self.recording, "a snapshot without the history on would hold no frames"
        self.log.append(("snapshot",))
        return recorded_snapshot()


class LoggedSteps(TinyModel):
    def __init__(self, log, oom_at=None, error=None):
        super().__init__()
        self.events, self.oom_at, self.error = log, oom_at, error

    def training_step(self, batch, batch_idx):
        step = self.trainer.global_step + 1
        self.events.append(("step", step))
        if step == self.oom_at:
            raise self.error or torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return super().training_step(batch, batch_idx)


@pytest.fixture
def simulated_cuda(monkeypatch):
    log = []
    monkeypatch.setattr(snapshots, "memory_backend", lambda: SimulatedAllocator(log))
    monkeypatch.setattr(MemorySnapshot, "_device", lambda self, trainer: torch.device("cuda", 0))
    return log


def frame(f):
    return f"{f['filename']}:{f['line']} in {f['name']}"


def test_an_oom_in_training_step_dumps_the_snapshot_with_the_request_and_the_largest_allocation(tmp_path,
                                                                                                simulated_cuda):
    log = simulated_cuda
    with pytest.raises(torch.cuda.OutOfMemoryError):
        fit(tmp_path, [MemorySnapshot(max_entries=5000)], model=LoggedSteps(log, oom_at=3), max_epochs=1)
    summary = find_summary(tmp_path)
    assert summary["status"] == "failed" and summary["error"]["type"] == "OutOfMemoryError"
    section = summary["memory_snapshot"]
    assert section["recorded"] is True
    (dump,) = section["snapshots"]
    assert dump["trigger"] == "oom" and (dump["phase"], dump["step"]) == ("train", 3)
    # recorded from set-up (before the first step), with Python stacks and the bound; stopped after the dump
    assert log[0] == ("record", "all", "python", 5000) and log.index(("snapshot",)) > log.index(("step", 3))
    assert log[-1][:2] == ("record", None)
    with open(dump["path"], "rb") as fh:
        assert pickle.load(fh) == recorded_snapshot()
    for view in ("trace_plot", "segment_plot"):  # torch's own renderers, on the simulated snapshot
        with open(dump["html"][view]) as fh:
            assert "snapshot.pickle" in fh.read()
    top = dump["top_allocations"]
    assert [round(a["size_mb"]) for a in top] == [500, 64]  # live blocks only, largest first; the free GB is not
    assert top[0]["frame"] == frame(USER_FRAME) and top[1]["frame"] is None  # only torch frames: no user line
    assert top[0]["frames"] == [frame(LIBRARY_FRAME), frame(USER_FRAME)]
    failed = dump["failed_request"]
    assert failed["size_mb"] == 2048 and failed["device_free_mb"] == 100 and failed["frame"] == frame(OOM_FRAME)
    assert (dump["allocated_mb"], dump["reserved_mb"], dump["history_full"]) == (576, 1088, False)
    evidence = summary["diagnosis"]["evidence"]
    assert evidence[0].startswith(f"see memory snapshot {dump['path']} (out of memory in training step 3: it asked"
                                  f" for 2048.0 MiB at {frame(OOM_FRAME)}")


class OomInValidation(TinyModel):
    def validation_step(self, batch, batch_idx):
        if not self.trainer.sanity_checking:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        return super().validation_step(batch, batch_idx)


def test_an_oom_in_validation_is_dumped_as_validation(tmp_path, simulated_cuda):
    with pytest.raises(torch.cuda.OutOfMemoryError):
        fit(tmp_path, [MemorySnapshot()], model=OomInValidation(), max_epochs=1)
    summary = find_summary(tmp_path)
    (dump,) = summary["memory_snapshot"]["snapshots"]
    assert (dump["trigger"], dump["phase"], dump["step"]) == ("oom", "validate", 8)  # 64 items / 8 a batch
    assert "out of memory in validate after step 8" in summary["diagnosis"]["evidence"][0]


def test_another_error_dumps_nothing_and_stops_recording(tmp_path, simulated_cuda):
    log = simulated_cuda
    with pytest.raises(ValueError, match="not memory"):
        fit(tmp_path, [MemorySnapshot()], model=LoggedSteps(log, oom_at=2, error=ValueError("not memory")),
            max_epochs=1)
    section = find_summary(tmp_path)["memory_snapshot"]
    assert section["snapshots"] == [] and ("snapshot",) not in log and log[-1][:2] == ("record", None)


def test_a_steps_window_records_those_steps_and_dumps_at_its_end(tmp_path, simulated_cuda):
    log = simulated_cuda
    fit(tmp_path, [MemorySnapshot(on_oom=False, steps=[3, 4])], model=LoggedSteps(log), max_epochs=1)
    (dump,) = find_summary(tmp_path)["memory_snapshot"]["snapshots"]
    assert dump["trigger"] == "steps" and dump["step"] == 4
    assert os.path.basename(dump["path"]) == "steps_3-4.pickle"
    events = [e[:2] for e in log]
    start, snap = events.index(("record", "all")), events.index(("snapshot",))
    assert events.index(("step", 2)) < start < events.index(("step", 3))
    assert events.index(("step", 4)) < snap < events.index(("step", 5))
    assert events[snap + 1] == ("record", None)  # on_oom=False: recording ends with the window


def test_off_cuda_it_warns_and_records_nothing(tmp_path):
    with pytest.warns(UserWarning, match="no CUDA allocator on cpu"):
        fit(tmp_path, [MemorySnapshot()], max_epochs=1)
    section = find_summary(tmp_path)["memory_snapshot"]
    assert section["recorded"] is False and section["snapshots"] == []
    assert "cpu" in section["unavailable"]["recording"]


@pytest.mark.parametrize("kwargs, shown", [
    ({"steps": [3]}, "steps=.3."), ({"steps": [5, 4]}, "steps=.5, 4."), ({"max_entries": 0}, "max_entries=0"),
    ({"stacks": "cpp"}, "stacks='cpp'"), ({"on_oom": 1}, "on_oom=1"),
])
def test_bad_arguments_are_refused_at_construction(kwargs, shown):
    with pytest.raises(ValueError, match=f"MemorySnapshot\\({shown}\\)"):
        MemorySnapshot(**kwargs)
