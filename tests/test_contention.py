"""Contention: how long the training thread waited for a CPU (the kernel's scheduler statistics), the hypervisor's
steal, the GPU's clock throttling, and the verdict read from them. Real threads and fits kept from their cores by
spinning processes the tests start; only NVML and, for the quiet case, the scheduler's file are simulated."""

import copy
import functools
import multiprocessing
import os
import threading
import time
from types import SimpleNamespace

import pytest
from lightning.pytorch import Callback

import lightning_perf.callbacks.vram_monitor.activity as activity_module
from helpers import TinyModel, find_summary, fit
from lightning_perf import VRAMMonitor
from lightning_perf.measure.device.activity import HostActivityReader, NvmlActivityReader, ThreadWaitReader
from lightning_perf.summary.contention import CPU_WAIT_PCT, contention, contention_line
from lightning_perf.summary.diagnosis import diagnose, diagnosis_line
from test_device_activity import ActiveNvml, FakeClock, Times, fake_psutil

pytestmark = pytest.mark.skipif(not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"),
                                reason="the kernel keeps no scheduler statistics here (Linux only)")


def _spin():
    while True:
        pass


class Spinners:
    """One more spinning process than the machine has cores: every thread that wants a core waits for one part of
    the time, whatever else runs on the machine."""

    def __enter__(self):
        ctx = multiprocessing.get_context("spawn")
        self.procs = [ctx.Process(target=_spin, daemon=True) for _ in range((os.cpu_count() or 1) + 1)]
        for p in self.procs:
            p.start()
        time.sleep(0.5)  # their interpreters started and spinning
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join(10)


# -- the readers --------------------------------------------------------------------------------------------------
def test_thread_wait_in_closed_form_from_the_schedstat_file(tmp_path):
    stat, clock = tmp_path / "schedstat", FakeClock()
    stat.write_text("5000000000 1000000000 40\n")  # ns on a CPU, ns waiting on a run queue, slices
    reader = ThreadWaitReader(0, min_span_s=0.25, clock=clock, path=str(stat))
    clock.t += 0.1
    assert reader.read() == {}  # within the shortest span: nothing yet
    clock.t += 0.9
    stat.write_text("5700000000 1250000000 60\n")  # 0.25 s of 1 s spent waiting for a CPU
    assert reader.read() == {"cpu_wait_pct": pytest.approx(25.0)}
    stat.unlink()  # the thread ended: the reading stops, with the reason
    clock.t += 1.0
    assert reader.read() == {} and "schedstat" in reader.unavailable["cpu_wait_pct"]


def test_a_thread_kept_from_its_core_waits_as_its_own_clocks_say():
    """A spinning thread never sleeps: the wall time it does not run is time it waited for a CPU. The reader's
    figure against the thread's own clocks (wall less its thread CPU time, read inside it)."""
    out, ready, stop = {}, threading.Event(), threading.Event()

    def busy():
        out["tid"] = threading.get_native_id()
        wall0, cpu0 = time.perf_counter(), time.thread_time()
        ready.set()
        while not stop.is_set():
            sum(range(200))
        out["wait_pct"] = 100.0 * (1.0 - (time.thread_time() - cpu0) / (time.perf_counter() - wall0))

    with Spinners():
        thread = threading.Thread(target=busy)
        thread.start()
        ready.wait()
        reader = ThreadWaitReader(out["tid"], min_span_s=0.0)
        time.sleep(2.0)
        ours = reader.read()["cpu_wait_pct"]
        stop.set()
        thread.join()
    assert ours == pytest.approx(out["wait_pct"], abs=8)
    assert ours > CPU_WAIT_PCT  # more runnable threads than cores: it waited


def test_steal_in_closed_form():
    clock = FakeClock()
    own = [SimpleNamespace(user=1.0, system=0.0)]
    machine = [Times(user=100.0, system=0.0, idle=800.0, iowait=0.0, steal=100.0, guest=0.0, guest_nice=0.0)]
    reader = HostActivityReader(min_span_s=0.25, clock=clock, psutil_module=fake_psutil(own, machine, cores=4))
    clock.t += 1.0  # 4 s of CPU time: 1 busy, 2 idle, 1 stolen by the hypervisor
    own.append(SimpleNamespace(user=1.5, system=0.0))
    machine.append(Times(user=101.0, system=0.0, idle=802.0, iowait=0.0, steal=101.0, guest=0.0, guest_nice=0.0))
    values = reader.read()
    assert values["host_steal_pct"] == pytest.approx(25.0)
    assert "host_steal_pct" not in reader.unavailable


def test_no_steal_counter_says_why_and_the_rest_goes_on():
    clock = FakeClock()
    own = [SimpleNamespace(user=1.0, system=0.0)]
    machine = [Times(user=100.0, system=0.0, idle=900.0)]
    reader = HostActivityReader(min_span_s=0.25, clock=clock, psutil_module=fake_psutil(own, machine, cores=4))
    clock.t += 1.0
    own.append(SimpleNamespace(user=1.5, system=0.0))
    machine.append(Times(user=102.0, system=0.0, idle=902.0))
    values = reader.read()
    assert "host_steal_pct" not in values and values["host_cpu_pct"] == pytest.approx(50.0)
    assert "steal" in reader.unavailable["host_steal_pct"]


@pytest.mark.parametrize("reasons, throttled", [(0x0, 0.0), (0x1, 0.0), (0x4, 100.0), (0x40, 100.0),
                                                (0x1 | 0x20, 100.0), (0x2 | 0x10 | 0x100, 0.0)])
def test_gpu_throttling_counts_power_and_heat_only(reasons, throttled):
    reader = NvmlActivityReader(ActiveNvml(reasons=reasons), "handle")
    assert reader.read()["gpu_throttled_pct"] == throttled


def test_gpu_throttling_reads_the_old_query_name_too():
    """nvidia-ml-py before NVML 12.5 has only the deprecated name (the other queries are absent from this one)."""
    old = SimpleNamespace(nvmlDeviceGetCurrentClocksThrottleReasons=lambda handle: 0x8)  # hardware slowdown
    reader = NvmlActivityReader(old, "handle")
    assert reader.read() == {"gpu_throttled_pct": 100.0}
    assert "gpu_throttled_pct" not in reader.unavailable
    assert "throttle" in NvmlActivityReader(SimpleNamespace(), "handle").unavailable["gpu_throttled_pct"]


# -- the verdict ----------------------------------------------------------------------------------------------------
def _summary(**train):
    phases = {"train": {name: {"mean": value, "p5": value, "samples": 10} for name, value in train.items()}}
    return {"vram": {"activity": {"host_logical_cores": 2, "phases": phases}}}


def test_the_verdict_fires_at_its_thresholds_and_names_each_cause():
    quiet = contention(_summary(cpu_wait_pct=CPU_WAIT_PCT - 0.1, host_steal_pct=0.0, gpu_throttled_pct=0.0))
    assert quiet["contended"] is False and quiet["causes"] == [] and contention_line(quiet) is None
    busy = contention(_summary(cpu_wait_pct=52.0, process_cpu_cores=0.48, host_cpu_pct=100.0))
    assert busy["contended"] is True
    assert contention_line(busy) == ("the machine was busy: the training thread waited for a CPU 52% of the time"
                                     " (the process got 0.48 of 2 cores while the machine ran at 100%)")
    both = contention(_summary(cpu_wait_pct=0.0, host_steal_pct=12.0, gpu_throttled_pct=40.0))
    assert [c.split(" ")[1] for c in both["causes"]] == ["hypervisor", "GPU"]


def test_no_reading_is_not_a_verdict():
    assert contention({})["contended"] is None and "no VRAMMonitor activity" in contention({})["reason"]
    result = contention(_summary(process_cpu_cores=1.0))
    assert result["contended"] is None and "CPU wait" in result["reason"]


# -- in a real fit ------------------------------------------------------------------------------------------------
class TrainingThreadClock(Callback):
    """The independent measure: the training thread's wall time less its CPU time over the train phase (the loop
    neither sleeps nor reads files: what it did not run, it waited for a CPU, or for the GIL)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def on_train_start(self, trainer, pl_module):
        self.wall0, self.cpu0 = time.perf_counter(), time.thread_time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if time.perf_counter() - self.wall0 > self.seconds:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module):
        wall, cpu = time.perf_counter() - self.wall0, time.thread_time() - self.cpu0
        self.wait_pct = 100.0 * (1.0 - cpu / wall)


def _fit(tmp_path, clock):
    fit(tmp_path, [VRAMMonitor(), clock], model=TinyModel(), max_epochs=1000, limit_val_batches=0,
        num_sanity_val_steps=0, enable_progress_bar=False, logger=False, enable_checkpointing=False)
    return find_summary(tmp_path)


def test_a_fit_kept_from_its_cores_is_contended_and_the_wait_matches_its_clock(tmp_path):
    clock = TrainingThreadClock(seconds=3.0)
    with Spinners():
        s = _fit(tmp_path, clock)
    activity = s["vram"]["activity"]
    assert "schedstat" in activity["source"] and "cpu_wait_pct" not in activity["unavailable"]
    wait = activity["phases"]["train"]["cpu_wait_pct"]
    assert wait["samples"] >= 4
    # the spans start and end up to 0.25 s from the phase's edges; the loop's own threads take the GIL now and then
    assert wait["mean"] == pytest.approx(clock.wait_pct, abs=12)
    result = contention(s)
    assert result["contended"] is True, result
    assert contention_line(result).startswith("the machine was busy: the training thread waited for a CPU")


def test_a_fit_whose_thread_never_waited_is_not_contended(tmp_path, monkeypatch):
    """The scheduler's file simulated for a thread that never waits (a real quiet machine cannot be promised to a
    test: other work may share it)."""
    stat = tmp_path / "schedstat"
    stat.write_text("1000 0 1\n")
    monkeypatch.setattr(activity_module, "ThreadWaitReader", functools.partial(ThreadWaitReader, path=str(stat)))
    s = _fit(tmp_path / "run", TrainingThreadClock(seconds=1.5))
    assert s["vram"]["activity"]["phases"]["train"]["cpu_wait_pct"]["mean"] == 0.0
    assert contention(s)["contended"] is False


def test_without_scheduler_statistics_the_reading_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(activity_module, "ThreadWaitReader",
                        functools.partial(ThreadWaitReader, path=str(tmp_path / "absent")))
    s = _fit(tmp_path / "run", TrainingThreadClock(seconds=0.5))
    activity = s["vram"]["activity"]
    assert "no scheduler statistics of the training thread" in activity["unavailable"]["cpu_wait_pct"]
    assert "schedstat" not in activity["source"]
    assert contention(s)["figures"]["cpu_wait_pct"] is None


# -- the diagnosis --------------------------------------------------------------------------------------------------
def _with_activity(summary, **train):
    busy = copy.deepcopy(summary)
    busy["vram"] = _summary(**train)["vram"]
    busy.pop("diagnosis", None)
    return busy


def test_the_diagnosis_names_contention_where_nothing_in_the_run_explains_the_tail(tmp_path, monkeypatch):
    """Slow iterations that no cause of the run explains, in a run whose training thread waited for a CPU 40% of
    the time: the tail is the machine's, and the diagnosis says so; the same run on a quiet machine stays
    "unexplained"."""
    from test_diagnosis import run

    s = run(tmp_path, monkeypatch, step=10.0, slow={3: 40.0, 5: 40.0, 11: 40.0, 13: 40.0})
    quiet = diagnose(_with_activity(s, cpu_wait_pct=1.0))
    assert quiet["verdict"] == "tail-heavy" and "mostly unexplained" in quiet["figure"]
    assert quiet["contention"] is None and "busy" not in diagnosis_line(quiet)
    busy = diagnose(_with_activity(s, cpu_wait_pct=40.0, process_cpu_cores=0.6, host_cpu_pct=100.0))
    assert busy["verdict"] == "tail-heavy" and "mostly contention" in busy["figure"]
    assert busy["advice"].startswith("the machine was busy: the training thread waited for a CPU 40% of the time")
    assert diagnosis_line(busy).count("the machine was busy") == 1


def test_every_verdict_of_a_contended_run_carries_the_caveat(tmp_path, monkeypatch):
    from test_diagnosis import run

    s = run(tmp_path, monkeypatch, step=10.0)
    d = diagnose(_with_activity(s, cpu_wait_pct=25.0))
    assert d["verdict"] == "compute-bound" and d["contention"].startswith("the machine was busy")
    assert diagnosis_line(d).endswith("[the machine was busy: the training thread waited for a CPU 25% of the time:"
                                      " the figures may be the machine's, not the run's]")
