"""What was built since the last GPU run, on a real GPU: ABTrial's CUDA changes with the default 24 blocks against the
same step timed with CUDA events; StepTrace's top op by device time against the same matmul timed alone; energy per
phase and per sample against ``nvidia-smi``'s instant power integrated at 100 ms; ``gpu_throttled_pct`` against
``nvidia-smi``'s clock event reasons over the same seconds, and the contention line that follows from it.

Each test records (ours, independent, bound) for the table of docs/gpu.md. Skipped without CUDA.
"""

import contextlib
import shutil
import statistics
import subprocess

import pytest
import torch
from lightning.pytorch import Callback, LightningModule
from torch import nn
from torch.utils.data import DataLoader

from helpers import find_summary
from lightning_perf import ABTrial, IterationTimer, StepTrace, VRAMMonitor
from lightning_perf.measure.device.activity import THROTTLE_REASONS_MASK
from lightning_perf.summary.contention import THROTTLED_PCT

from test_gpu_truth import Same, gpu_fit

pytestmark = pytest.mark.gpu


class Matmuls(LightningModule):
    """``reps`` matmuls of a (batch, n) input by one (n, n) weight, a tanh after each: a GPU-bound step."""

    def __init__(self, n=4096, reps=6, batch=2048, batches=300, dtype=torch.float32, val_batches=0):
        super().__init__()
        self.w = nn.Parameter((torch.randn(n, n) / n**0.5).to(dtype))
        self.reps, self.shape, self.batches, self.val_batches = reps, (batch, n), batches, val_batches
        self.data_dtype = dtype  # (a LightningModule's `dtype` is its own)

    def loss_of(self, x):
        y = x
        for _ in range(self.reps):
            y = torch.tanh(y @ self.w)
        return y.float().pow(2).mean()

    def training_step(self, batch, batch_idx):
        return self.loss_of(batch)

    def validation_step(self, batch, batch_idx):
        self.loss_of(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)

    def _loader(self, n):
        return DataLoader(Same(torch.randn(*self.shape, device="cuda", dtype=self.data_dtype), n), batch_size=None)

    def train_dataloader(self):
        return self._loader(self.batches)

    def val_dataloader(self):
        return self._loader(self.val_batches)


class Convs(LightningModule):
    """Four 3x3 convolutions on 56x56 maps: the work cudnn.benchmark chooses algorithms for."""

    def __init__(self, batches=300):
        super().__init__()
        self.net = nn.Sequential(*[nn.Conv2d(64, 64, 3, padding=1) for _ in range(4)])
        self.batches = batches

    def loss_of(self, x):
        return self.net(x).pow(2).mean()

    def training_step(self, batch, batch_idx):
        return self.loss_of(batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)

    def train_dataloader(self):
        return DataLoader(Same(torch.randn(32, 64, 56, 56, device="cuda"), self.batches), batch_size=None)


def event_ms(fn, repeats=20):
    """Mean device time of ``fn`` over ``repeats`` calls, between two CUDA events, after one call of warm-up."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def flags_off():
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False


def switched(change, on):
    """The flags or context of ``change`` on or off, as the independent step runs under it."""
    flags_off()
    if change == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    if change == "cudnn_benchmark":
        torch.backends.cudnn.benchmark = on
    if change == "autocast_bf16" and on:
        return lambda: torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext


def step_speedup(model, batch, change):
    """Time off / time on of the same training step (forward under the change, backward, SGD step, zero_grad) timed
    with CUDA events outside the fit: medians of 3 interleaved rounds of each arm."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def arm(on):
        context = switched(change, on)

        def one():
            with context():
                loss = model.loss_of(batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return event_ms(one)

    off, on = [], []
    for _ in range(3):
        off.append(arm(False))
        on.append(arm(True))
    flags_off()
    return statistics.median(off) / statistics.median(on)


@pytest.mark.parametrize("change", ["tf32", "autocast_bf16", "cudnn_benchmark"])
def test_a_trial_of_a_cuda_change_with_the_default_blocks_agrees_with_event_timed_steps(tmp_path, record, change):
    if change in ("tf32", "autocast_bf16") and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("TF32 and fast bf16 need Ampere or later")
    flags_off()
    model = Convs() if change == "cudnn_benchmark" else Matmuls()
    trial = ABTrial(change, quality_batches=0)  # the defaults: 20 warm-up iterations, 24 blocks of 10
    assert trial.schedule.blocks == 24
    gpu_fit(tmp_path, [trial], model, max_steps=trial.schedule.total, enable_checkpointing=False)
    result = find_summary(tmp_path)["trial"]
    assert result["status"] == "done", result
    assert torch.backends.cuda.matmul.allow_tf32 is False and torch.backends.cudnn.benchmark is False
    batch = model.train_dataloader().dataset.batch
    independent = step_speedup(model.cuda(), batch, change)  # (the fit's end moved the module back to the CPU)
    ours = result["speedup"]
    record(f"ABTrial {change} speed-up (24 blocks of 10) vs the same step timed with CUDA events", ours, independent,
           "x", "within 25%" + ("" if change == "cudnn_benchmark" else "; decided faster"))
    record(f"ABTrial {change}: its 95% interval ({result['verdict']})", result["speedup_low"],
           result["speedup_high"], "x", "low .. high")
    if change != "cudnn_benchmark":  # TF32 and bf16 are several times faster on these matmuls
        assert result["verdict"] == "faster", result
    # cudnn.benchmark's first 'on' step of a shape tries every algorithm: one slow step of 120 in the 'on' arm
    assert ours == pytest.approx(independent, rel=0.25)


class OneMatmul(LightningModule):
    """A step whose device time is two equal matmuls: ``x @ w`` forward and ``x.T @ grad`` for w's gradient."""

    def __init__(self, n=4096, batch=4096):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n, n) / n**0.5)
        self.x = torch.randn(batch, n, device="cuda")

    def training_step(self, batch, batch_idx):
        return (self.x @ self.w).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-4)

    def train_dataloader(self):
        return DataLoader(Same(torch.zeros(1, device="cuda"), 12), batch_size=None)


def test_a_trace_ranks_the_matmul_first_by_device_time_at_its_event_timed_cost(tmp_path, record):
    flags_off()
    model = OneMatmul()
    gpu_fit(tmp_path, [StepTrace(steps=[5, 6])], model, enable_checkpointing=False)
    (capture,) = find_summary(tmp_path)["step_trace"]["captures"]
    ops = {op["name"]: op for op in capture["top_ops"]}
    mm = ops.get("aten::mm")
    assert mm is not None and mm["self_device_ms"], capture["top_ops"]
    # the top op that is an aten op (a record_function range may hold the device time of the ops it wraps)
    first_aten = next(op for op in capture["top_ops"] if op["name"].startswith("aten::"))
    assert first_aten["name"] == "aten::mm", capture["top_ops"]
    ours = mm["self_device_ms"] / mm["calls"]
    x, w = model.x, model.w.detach().cuda()  # (the fit's end moved the module back to the CPU)
    forward = event_ms(lambda: x @ w)
    gradient = event_ms(lambda: x.T @ x)  # the (n, batch) @ (batch, n) product of w's gradient
    independent = (forward + gradient) / 2
    record("StepTrace top op by device time (aten::mm, 4 calls in 2 steps): device ms a call vs CUDA events",
           ours, independent, "ms", "within 15%")
    assert mm["calls"] == 4
    assert ours == pytest.approx(independent, rel=0.15)


def _smi_field(candidates):
    """The first ``nvidia-smi --query-gpu`` field of ``candidates`` this driver answers."""
    for field in candidates:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", "0"],
                              capture_output=True, text=True)
        value = done.stdout.strip()
        if done.returncode == 0 and value and not value.startswith("[") and "not a valid field" not in value.lower():
            return field  # ("[N/A]", "[Not Supported]": a field this board does not fill)
    return None


class PhaseSmi(Callback):
    """``nvidia-smi`` every 100 ms in a process of its own during each phase: instant power (W) and the clock event
    reasons (a bit mask), from train start to validation start and from validation start to its end."""

    def __init__(self, power_field, reasons_field):
        self.fields, self.rows, self.proc = f"{power_field},{reasons_field}", {}, None

    def _start(self, phase):
        self._stop()
        self.phase = phase
        self.proc = subprocess.Popen(["nvidia-smi", f"--query-gpu={self.fields}", "--format=csv,noheader,nounits",
                                      "-i", str(torch.cuda.current_device()), "-lms", "100"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def _stop(self):
        if self.proc is None:
            return
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        self.proc, rows = None, []
        for line in out.splitlines():
            try:
                power, reasons = (v.strip() for v in line.split(","))
                rows.append((float(power), int(reasons, 16)))
            except ValueError:  # "[N/A]", a cut last line
                continue
        self.rows[self.phase] = rows

    def on_train_start(self, trainer, pl_module):
        self._start("train")

    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self._start("validation")

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self._stop()


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="nvidia-smi is not on the PATH")
def test_energy_per_phase_and_sample_and_throttling_match_nvidia_smi_over_the_same_seconds(tmp_path, record):
    power_field = _smi_field(["power.draw.instant", "power.draw"])
    reasons_field = _smi_field(["clocks_event_reasons.active", "clocks_throttle_reasons.active"])
    assert power_field and reasons_field, "nvidia-smi answers no power or clock reasons field"
    smi = PhaseSmi(power_field, reasons_field)
    # bf16 matmuls at full tilt for ~7 s, then ~3 s of forward-only validation: the board near its power limit
    model = Matmuls(n=8192, reps=4, batch=2048, dtype=torch.bfloat16, batches=1500, val_batches=1800)
    gpu_fit(tmp_path, [smi, VRAMMonitor(nvml_interval_s=0.05), IterationTimer()], model, enable_checkpointing=False,
            limit_val_batches=None)
    summary = find_summary(tmp_path)
    activity = summary["vram"]["activity"]
    energy = activity["energy"]
    assert energy is not None, activity["unavailable"]
    for phase, bound in (("train", 0.12), ("validation", 0.15)):
        ours = energy["phases"][phase]
        watts = [p for p, _ in smi.rows[phase]]
        assert ours["energy_j"] is not None and len(watts) >= 15, (ours, len(watts))
        smi_j = statistics.fmean(watts) * ours["seconds"]
        record(f"VRAMMonitor {phase} energy ({energy['source']}) vs nvidia-smi {power_field} x the same seconds",
               ours["energy_j"], smi_j, "J", f"within {bound:.0%}")
        assert ours["energy_j"] == pytest.approx(smi_j, rel=bound)
    train = energy["phases"]["train"]
    assert train["samples"] == 1500 * 2048
    smi_per_sample = statistics.fmean(p for p, _ in smi.rows["train"]) * train["seconds"] / train["samples"]
    record("VRAMMonitor train J/sample vs nvidia-smi energy / IterationTimer's samples", train["j_per_sample"] * 1e3,
           smi_per_sample * 1e3, "mJ", "within 12%")
    assert train["j_per_sample"] == pytest.approx(smi_per_sample, rel=0.12)

    throttled = activity["phases"]["train"].get("gpu_throttled_pct")
    assert throttled is not None, activity["unavailable"]
    reasons = [r for _, r in smi.rows["train"]]
    smi_pct = 100.0 * sum(1 for r in reasons if r & THROTTLE_REASONS_MASK) / len(reasons)
    record("VRAMMonitor gpu_throttled_pct (train) vs nvidia-smi clock event reasons at 100 ms", throttled["mean"],
           smi_pct, "% of samples", "within 15 points")
    assert throttled["mean"] == pytest.approx(smi_pct, abs=15)
    named = "slowed its clocks" in (summary["diagnosis"].get("contention") or "")
    record("contention line names the GPU's slowing (ours >= 10%)", int(named), int(throttled["mean"] >= THROTTLED_PCT),
           "yes/no", "equal")
    assert named == (throttled["mean"] >= THROTTLED_PCT)
