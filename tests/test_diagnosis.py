"""The run's one primary diagnosis: each verdict fired by a real fit whose costs are injected on the virtual clock
(helpers.VirtualClock), so every share is a closed form, and a close case that stays below its threshold; the end
of fit's first console line; compare's first line from the real command."""

import copy
import json
import logging
import subprocess
import sys

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from torch.utils.data import DataLoader, Dataset

from helpers import TinyModel, find_summary, fit, use_virtual_clock
from lightning_perf import IterationTimer, PerfSuite, SectionProfiler, VRAMMonitor
from lightning_perf.summary import diagnosis as diag
from lightning_perf.summary.diagnosis import diagnose, diagnosis_line


class ClockedItems(Dataset):
    def __init__(self, clock, per_item_s):
        self.clock, self.per_item_s = clock, per_item_s

    def __len__(self):
        return 64

    def __getitem__(self, i):
        self.clock.advance(self.per_item_s)
        x = torch.full((16,), float(i) / 64)
        return x, x.sum(dim=0, keepdim=True)


class Costs(TinyModel):
    """Costs in ms on the virtual clock: ``fetch`` per batch (8 items), ``transfer`` per training-loop transfer,
    ``step`` per training_step, ``hook`` in on_after_backward (`other`), ``val`` per validation batch, and ``slow``
    (global step -> extra ms in that training_step)."""

    def __init__(self, clock, fetch=0.0, transfer=0.0, step=10.0, hook=0.0, val=0.0, slow=None):
        super().__init__()
        self.clock, self.costs, self.slow = clock, dict(fetch=fetch, transfer=transfer, step=step, hook=hook,
                                                        val=val), slow or {}

    def _spend(self, ms):
        self.clock.advance(ms / 1000.0)

    def train_dataloader(self):
        return DataLoader(ClockedItems(self.clock, self.costs["fetch"] / 8000.0), batch_size=8)

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        if self.trainer.training:
            self._spend(self.costs["transfer"])
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def training_step(self, batch, batch_idx):
        self._spend(self.costs["step"] + self.slow.get(self.global_step, 0.0))
        return super().training_step(batch, batch_idx)

    def on_after_backward(self):
        self._spend(self.costs["hook"])

    def validation_step(self, batch, batch_idx):
        self._spend(self.costs["val"])
        return super().validation_step(batch, batch_idx)


class ClockedIO(TorchCheckpointIO):
    """Each checkpoint write costs ``ms`` on the virtual clock; ``saves`` counts them."""

    def __init__(self, clock, ms):
        self.clock, self.ms, self.saves = clock, ms, 0

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.saves += 1
        self.clock.advance(self.ms / 1000.0)
        super().save_checkpoint(checkpoint, path, storage_options)


def run(tmp_path, monkeypatch, callbacks=None, max_epochs=2, **costs):
    """Two epochs of 8 batches (a validation of 4 batches after each), IterationTimer and SectionProfiler with a
    warm-up of 2: 14 measured iterations. Returns the summary."""
    clock = use_virtual_clock(monkeypatch)
    extra = callbacks(clock) if callbacks else {}
    fit(tmp_path, [IterationTimer(warmup_steps=2), SectionProfiler(warmup_steps=2, print_reports=False),
                   *extra.get("callbacks", [])],
        model=Costs(clock, **costs), max_epochs=max_epochs, enable_checkpointing=bool(extra.get("callbacks")),
        plugins=extra.get("plugins"))
    return find_summary(tmp_path)


# -- each verdict, fired and not ------------------------------------------------------------------------------------

def test_input_bound_fires_on_a_slow_fetch_and_names_the_workers(tmp_path, monkeypatch):
    s = run(tmp_path, monkeypatch, fetch=16.0, step=30.0)
    d = s["diagnosis"]
    assert d["verdict"] == "input-bound" and d["value"] == pytest.approx(100 * 16 / 46)
    assert d["threshold"] == diag.INPUT_BOUND_PCT and d["of"] == "iteration time"
    assert "num_workers" in d["advice"] and d["also"] == []


def test_input_bound_on_a_slow_transfer_advises_pinned_non_blocking_copies(tmp_path, monkeypatch):
    d = run(tmp_path, monkeypatch, fetch=4.0, transfer=12.0, step=30.0)["diagnosis"]
    assert d["verdict"] == "input-bound" and d["value"] == pytest.approx(100 * 16 / 46)
    assert "pin_memory=True" in d["advice"] and "non_blocking=True" in d["advice"]


def test_input_below_its_threshold_is_not_input_bound(tmp_path, monkeypatch):
    d = run(tmp_path, monkeypatch, fetch=10.0, step=36.0)["diagnosis"]  # 21.7% of the iteration
    assert d["verdict"] == "compute-bound" and "input-bound" not in d["also"]
    assert d["value"] == pytest.approx(100 * 36 / 46)


def test_evaluation_heavy_fires_from_iteration_timers_clocks(tmp_path, monkeypatch):
    s = run(tmp_path, monkeypatch, step=10.0, val=10.0)  # 2 x 4 batches of 10 ms against 16 steps of 10 ms
    d = s["diagnosis"]
    assert s["iteration_timer"]["eval_time_s"] == pytest.approx(0.08)
    assert d["verdict"] == "evaluation-heavy" and d["value"] == pytest.approx(100 * 80 / 240)
    assert "val_check_interval" in d["advice"]


def test_evaluation_below_its_threshold_is_not_evaluation_heavy(tmp_path, monkeypatch):
    d = run(tmp_path, monkeypatch, step=10.0, val=5.0)["diagnosis"]  # 40 of 200 ms: 20%
    assert d["verdict"] == "compute-bound" and "evaluation-heavy" not in d["also"]


def test_of_two_verdicts_the_one_with_more_of_the_runs_time_is_primary(tmp_path, monkeypatch):
    """Input: 34.8% of each iteration; evaluation: 480 ms of 736 + 480, 39.5% of the run. Input's part of the run
    is 34.8% of the 60.5% that is training: 21%, so evaluation is primary and input is also named."""
    d = run(tmp_path, monkeypatch, fetch=16.0, step=30.0, val=60.0)["diagnosis"]
    assert d["verdict"] == "evaluation-heavy" and d["value"] == pytest.approx(100 * 480 / (736 + 480))
    assert d["also"] == ["input-bound"]


def _checkpoints(ms):
    def make(clock):
        io = ClockedIO(clock, ms)
        return {"callbacks": [ModelCheckpoint(every_n_train_steps=2, save_top_k=-1)], "plugins": [io]}

    return make


def test_checkpoint_heavy_fires_on_slow_saves(tmp_path, monkeypatch):
    s = run(tmp_path, monkeypatch, callbacks=_checkpoints(6.0), step=10.0)
    d = s["diagnosis"]
    # saves after steps 2, 4, ..., 14 fall in 7 of the 14 measured iterations; the one after step 16 in none
    assert d["verdict"] == "checkpoint-heavy" and d["value"] == pytest.approx(100 * 42 / (140 + 42))
    assert "every_n_train_steps" in d["advice"]


def test_cheap_saves_are_not_checkpoint_heavy(tmp_path, monkeypatch):
    d = run(tmp_path, monkeypatch, callbacks=_checkpoints(1.6), step=10.0)["diagnosis"]  # 7.4%
    assert d["verdict"] == "compute-bound" and "checkpoint-heavy" not in d["also"]


def test_tail_heavy_fires_on_slow_iterations(tmp_path, monkeypatch):
    """Four steps take 50 ms against 10: 200 of the 300 measured ms are in the tail."""
    s = run(tmp_path, monkeypatch, step=10.0, slow={3: 40.0, 5: 40.0, 11: 40.0, 13: 40.0})
    d = s["diagnosis"]
    assert d["verdict"] == "tail-heavy" and d["value"] == pytest.approx(100 * 200 / 300, rel=0.02)
    assert d["value"] == s["iteration_timer"]["tail"]["share_pct"] and d["of"] == "training time"


def test_one_slow_iteration_is_not_tail_heavy(tmp_path, monkeypatch):
    d = run(tmp_path, monkeypatch, step=10.0, slow={4: 15.0})["diagnosis"]  # 25 of 155 ms: 16%
    assert d["verdict"] == "compute-bound" and "tail-heavy" not in d["also"]


def test_compute_bound_fires_when_the_step_is_the_iteration(tmp_path, monkeypatch):
    d = run(tmp_path, monkeypatch, fetch=2.0, step=20.0)["diagnosis"]
    assert d["verdict"] == "compute-bound" and d["value"] == pytest.approx(100 * 20 / 22)
    assert d["threshold"] == diag.COMPUTE_BOUND_STEP_PCT and "bf16-mixed" in d["advice"]
    assert "NVML" in d["unchecked"]["host-bound"]  # no GPU utilisation on CPU: host-bound was not checked


def test_a_step_under_half_the_iteration_with_nothing_above_threshold_is_mixed(tmp_path, monkeypatch):
    """forward 10, other (on_after_backward) 8, data loading 4 ms: no share crosses a threshold."""
    d = run(tmp_path, monkeypatch, fetch=4.0, step=10.0, hook=8.0)["diagnosis"]
    assert d["verdict"] == "mixed" and d["value"] == pytest.approx(100 * 10 / 22)
    assert "forward" in d["figure"] and d["threshold"] is None


def _with_gpu_utilisation(summary, mean_pct):
    """What VRAMMonitor's activity block says on a GPU (NVML is the hardware simulated here)."""
    out = copy.deepcopy(summary)
    out["vram"] = {"activity": {"source": "NVML + psutil", "phases": {"train": {"gpu_util_pct": {
        "mean": mean_pct, "p5": mean_pct / 2, "samples": 40}}}}}
    return out


def test_host_bound_fires_when_the_gpu_idles_while_the_step_fills_the_iteration(tmp_path, monkeypatch):
    s = run(tmp_path, monkeypatch, fetch=2.0, step=20.0)  # the step: 90.9% of the iteration
    d = diagnose(_with_gpu_utilisation(s, 30.0))
    assert d["verdict"] == "host-bound" and d["value"] == 30.0 and d["threshold"] == diag.HOST_BOUND_GPU_UTIL_PCT
    assert "torch.compile" in d["advice"] and "90.9%" in d["advice"]
    assert "below 50%" in diagnosis_line(d)
    busy = diagnose(_with_gpu_utilisation(s, 60.0))  # the GPU is busy enough: the step is compute
    assert busy["verdict"] == "compute-bound" and "host-bound" not in busy["unchecked"]


@pytest.fixture
def simulated_gpu(monkeypatch):
    """VRAMMonitor on a simulated board (tests/test_device_activity.py): only the hardware is simulated."""
    import lightning_perf.callbacks.vram_monitor.callback as vram_module
    from test_vram_monitor import FakeCuda

    monkeypatch.setattr(vram_module, "cuda_backend", lambda: FakeCuda())
    monkeypatch.setattr(VRAMMonitor, "_device", lambda self, trainer: torch.device("cuda", 0))


class Tick(Callback):
    """One activity sample per training batch, as VRAMMonitor's thread takes them on its own cadence."""

    def __init__(self, monitor):
        self.monitor = monitor

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.monitor._sampler.on_tick(self.monitor._sampler.phase)


@pytest.mark.parametrize("util, verdict", [(30, "host-bound"), (60, "compute-bound")])
def test_host_bound_from_vram_monitors_own_reading_in_a_real_fit(tmp_path, monkeypatch, simulated_gpu, util,
                                                                  verdict):
    """The board reports ``util`` % busy while the step fills 90.9% of the iteration."""
    import lightning_perf.measure.memory.readers as memory_module
    from test_device_activity import ActiveNvml

    monkeypatch.setattr(memory_module, "load_pynvml", lambda: ActiveNvml(util=util))
    monitor = VRAMMonitor(nvml_interval_s=60)  # the thread never ticks within this fit: Tick does
    s = run(tmp_path, monkeypatch, callbacks=lambda clock: {"callbacks": [monitor, Tick(monitor)]}, fetch=2.0,
            step=20.0)
    assert s["vram"]["activity"]["phases"]["train"]["gpu_util_pct"]["mean"] == util
    d = s["diagnosis"]
    assert d["verdict"] == verdict and "host-bound" not in d["unchecked"]
    if verdict == "host-bound":
        assert d["value"] == util and d["figure"] == "mean GPU utilisation in training"


def test_low_utilisation_without_a_full_step_is_not_host_bound(tmp_path, monkeypatch):
    s = run(tmp_path, monkeypatch, fetch=4.0, step=30.0, hook=5.0)  # the step 77%: the host is not busy throughout
    d = diagnose(_with_gpu_utilisation(s, 30.0))
    assert d["verdict"] == "mixed"  # and not compute-bound either: the GPU idles


# -- not enough measured: fail closed --------------------------------------------------------------------------------

def test_without_section_profiler_there_is_no_verdict_even_when_evaluation_is_heavy(tmp_path, monkeypatch):
    clock = use_virtual_clock(monkeypatch)
    fit(tmp_path, [IterationTimer(warmup_steps=2)], model=Costs(clock, step=10.0, val=30.0), max_epochs=2,
        enable_checkpointing=False)
    d = find_summary(tmp_path)["diagnosis"]
    assert d["verdict"] == "not-enough-measured" and "no SectionProfiler section" in d["reason"]
    assert d["value"] is None and "SectionProfiler" in d["advice"]


def test_too_few_iterations_give_no_verdict(tmp_path, monkeypatch):
    clock = use_virtual_clock(monkeypatch)
    fit(tmp_path, [SectionProfiler(warmup_steps=2, print_reports=False)], model=Costs(clock, fetch=40.0),
        max_steps=5, enable_checkpointing=False)
    d = find_summary(tmp_path)["diagnosis"]
    assert d["verdict"] == "not-enough-measured" and "measured 3 iterations" in d["reason"]


def test_section_profiler_alone_weighs_evaluation_with_its_own_validation_clock(tmp_path, monkeypatch):
    clock = use_virtual_clock(monkeypatch)
    fit(tmp_path, [SectionProfiler(warmup_steps=2, print_reports=False)], model=Costs(clock, step=10.0, val=10.0),
        max_epochs=2, enable_checkpointing=False)
    d = find_summary(tmp_path)["diagnosis"]
    # 80 ms of validation against the 14 measured iterations of 10 ms
    assert d["verdict"] == "evaluation-heavy" and d["value"] == pytest.approx(100 * 80 / 220)
    assert "no tail block" in d["unchecked"]["tail-heavy"]


def test_a_step_verdict_needs_an_evaluation_figure(tmp_path, monkeypatch):
    s = run(tmp_path, monkeypatch, step=10.0)
    assert s["diagnosis"]["verdict"] == "compute-bound"
    del s["iteration_timer"], s["section_profiler"]["validation"]
    d = diagnose(s)
    assert d["verdict"] == "not-enough-measured" and "without evaluation time" in d["reason"]


def test_a_failing_diagnosis_is_a_reason_in_the_file_and_training_completes(tmp_path, monkeypatch):
    from lightning_perf.callbacks.core import summary_book as _summary_book

    def broken(data):
        raise ZeroDivisionError("no figures")

    monkeypatch.setattr(_summary_book, "diagnose", broken)
    with pytest.warns(UserWarning, match="the diagnosis failed"):
        s = run(tmp_path, monkeypatch, step=10.0)
    assert s["status"] == "completed" and s["diagnosis"]["verdict"] == "not-enough-measured"
    assert "ZeroDivisionError: no figures" in s["diagnosis"]["reason"]


# -- where it is shown ------------------------------------------------------------------------------------------------

def test_the_diagnosis_is_the_first_line_at_the_end_of_fit_and_the_files(tmp_path, monkeypatch, caplog):
    clock = use_virtual_clock(monkeypatch)
    with caplog.at_level(logging.INFO):
        fit(tmp_path, [PerfSuite([IterationTimer(warmup_steps=2), SectionProfiler(warmup_steps=2),
                                  VRAMMonitor()])], model=Costs(clock, fetch=16.0, step=30.0), max_epochs=2,
            enable_checkpointing=False)
    s = find_summary(tmp_path)
    assert list(s)[:4] == ["schema_version", "status", "error", "diagnosis"]
    messages = [r.getMessage() for r in caplog.records]
    end = [i for i, m in enumerate(messages) if m.startswith(("Diagnosis", "IterationTimer:", "=== SectionProfiler:",
                                                               "VRAMMonitor", "lightning_perf: summary written"))]
    assert messages[end[0]] == diagnosis_line(s["diagnosis"])
    assert messages[end[0]].startswith("Diagnosis: input-bound: data loading + transfer 34.8% of iteration time")
    assert len(end) >= 5 and sum(m.startswith("Diagnosis") for m in messages) == 1  # each callback printed after it


def test_a_validate_run_has_no_diagnosis(tmp_path):
    from helpers import trainer_kwargs
    from lightning.pytorch import Trainer

    trainer = Trainer(callbacks=[VRAMMonitor()], **trainer_kwargs(tmp_path))  # it keeps a record of a validate run
    trainer.validate(TinyModel())
    with open(next(tmp_path.rglob("perf_summary_validate.json"))) as fh:
        assert "diagnosis" not in json.load(fh)


def cli(*args):
    proc = subprocess.run([sys.executable, "-m", "lightning_perf.cli", *args], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """An input-bound run and two compute-bound ones, named by ``run_name``."""
    root = tmp_path_factory.mktemp("diag_runs")
    paths = {}
    with pytest.MonkeyPatch.context() as mp:
        for name, costs in (("loader", dict(fetch=16.0, step=30.0)), ("fast", dict(fetch=2.0, step=38.0)),
                            ("faster", dict(fetch=2.0, step=20.0))):
            clock = use_virtual_clock(mp)
            path = root / name / "perf_summary.json"
            fit(root / name, [IterationTimer(warmup_steps=2, run_name=name, summary_path=str(path)),
                              SectionProfiler(warmup_steps=2, print_reports=False)], model=Costs(clock, **costs),
                max_epochs=2, enable_checkpointing=False)
            paths[name] = str(path)
    return paths


def test_compare_starts_with_the_candidates_diagnosis_and_the_baselines_where_it_differs(three_runs):
    text = cli("compare", three_runs["loader"], three_runs["fast"])
    head = text.split("TRAINING TIME COMPARISON")[0].splitlines()  # each run's diagnosis from a line of its own
    first = head[0]
    assert first.startswith("Diagnosis of fast: compute-bound: forward + backward + optimizer step 95.0%")
    assert [line for line in head if line.startswith("Diagnosis of")][1].startswith(
        "Diagnosis of loader: input-bound: data loading + transfer 34.8%")
    result = json.loads(cli("compare", three_runs["loader"], three_runs["fast"], "--format", "json"))
    lines = result["diagnosis"]["lines"]
    markdown = cli("compare", three_runs["loader"], three_runs["fast"], "--format", "markdown")
    assert markdown.split("\n\n")[:2] == [f"**{lines[0]}**", f"**{lines[1]}**"]
    assert list(result)[0] == "diagnosis" and result["diagnosis"]["differs"] is True
    assert result["diagnosis"]["candidate"]["verdict"] == "compute-bound"
    assert result["diagnosis"]["base"]["verdict"] == "input-bound" and lines[0].startswith(first)
    assert result["diagnosis"]["line"] == " | ".join(lines)


def test_compare_of_one_verdict_says_so_and_reads_files_from_before_diagnoses(three_runs, tmp_path):
    head = cli("compare", three_runs["fast"], three_runs["faster"]).split("TRAINING TIME COMPARISON")[0]
    assert head.startswith("Diagnosis of faster: compute-bound") and head.endswith("\nfast: the same verdict\n")
    with open(three_runs["loader"]) as fh:
        old = json.load(fh)
    del old["diagnosis"]  # a file written before the diagnosis existed: computed from its figures
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    result = json.loads(cli("compare", three_runs["fast"], str(path), "--format", "json"))
    assert result["diagnosis"]["candidate"]["verdict"] == "input-bound"
    assert result["diagnosis"]["candidate"]["value"] == pytest.approx(100 * 16 / 46)


# -- the loop's own work between batches is not input; the workers' own time picks the advice -----------------------

class BatchEndWork(Callback):
    """A later callback's batch-end hook (a progress bar, a logger) that costs ``ms`` on the virtual clock."""

    def __init__(self, clock, ms):
        self.clock, self.ms = clock, ms

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.clock.advance(self.ms / 1000.0)


def test_batch_end_work_of_other_callbacks_is_the_loops_host_work_not_input(tmp_path, monkeypatch):
    """fetch 4 ms, step 10 ms, 12 ms of a later callback's batch-end hook: data loading is the 4 ms fetch (15.4%),
    the hook is `between_batches` (46.2%), and the run is not input-bound (counting the gap as data loading made it
    61.5%, "raise num_workers"): no cost dominates, and the advice names the loop's work."""
    s = run(tmp_path, monkeypatch, fetch=4.0, step=10.0,
            callbacks=lambda clock: {"callbacks": [BatchEndWork(clock, 12.0)]})
    table = s["section_profiler"]["sections"]
    assert table["data_loading"]["mean_ms"] == pytest.approx(4.0)
    assert table["between_batches"]["mean_ms"] == pytest.approx(12.0)
    d = s["diagnosis"]
    assert d["verdict"] == "mixed" and "input-bound" not in d["also"], d
    assert "between_batches" in d["figure"] and d["value"] == pytest.approx(100 * 12 / 26)
    assert d["advice"] == diag.LOOP_ADVICE and "progress bar" in d["advice"]


@pytest.mark.parametrize("workers, advice", [
    ({"num_workers": 0, "cpu_count": 8}, "`num_workers=0`"),
    ({"num_workers": 2, "busy_pct": 97.0, "busy_ms_per_batch": 30.0, "cpu_count": 8}, "add workers"),
    ({"num_workers": 8, "busy_pct": 97.0, "busy_ms_per_batch": 30.0, "cpu_count": 8}, "make loading and the transform"
                                                                                        " cheaper"),
    ({"num_workers": 4, "busy_pct": 20.0, "busy_ms_per_batch": 3.0, "cpu_count": 8}, "more workers will not help"),
])
def test_an_input_bound_run_is_advised_by_what_its_workers_spend(tmp_path, monkeypatch, workers, advice):
    """The same input-bound run (a 16 ms fetch beside a 30 ms step) with each kind of worker figures: no workers
    (load in workers), saturated workers with cores to spare (add workers), saturated on every core (a cheaper
    transform), workers mostly idle while the loop waits (more will not help)."""
    s = run(tmp_path, monkeypatch, fetch=16.0, step=30.0)
    s["section_profiler"]["workers"] = dict({"batches": 100, "busy_pct": None, "busy_ms_per_batch": None}, **workers)
    d = diagnose(s)
    assert d["verdict"] == "input-bound" and advice in d["advice"], d["advice"]
    if workers.get("busy_pct"):
        assert f"{workers['busy_pct']:.0f}% of the time" in d["advice"]
