"""FLOP/s, MFU and items/s of IterationTimer, against figures known independently of the callback.

The FLOPs of a stack of Linear layers are known in closed form. torch's FlopCounterMode (under Lightning's
``measure_flops``) counts matrix products only, 2 FLOPs per multiply-add: per Linear(i, o) on a batch of b, the
forward is 2·b·i·o, the weight gradient 2·b·i·o, and the input gradient 2·b·i·o for every layer but the first (the
data needs no gradient); biases, activations and the loss are not counted. Timings come from a virtual clock that the
model advances by a known cost per step, so the rates are known exactly on a loaded machine too.
"""

import copy
import math

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers import ManualModel, TinyModel, find_summary, fit, read_scalars, trainer_kwargs, use_virtual_clock
from lightning_perf import IterationTimer

WIDTHS = (16, 64, 32, 1)
BATCH = 8
STEP_S = 0.010
#: The clock the models advance: a module global, so the copy the FLOPs are counted on advances it too.
CLOCK = {}


def closed_form_flops(widths=WIDTHS, batch=BATCH):
    pairs = list(zip(widths[:-1], widths[1:]))
    forward = sum(2 * batch * i * o for i, o in pairs)
    weight_grads = forward
    input_grads = sum(2 * batch * i * o for i, o in pairs[1:])
    return forward + weight_grads + input_grads


class LinearStack(TinyModel):
    """Linear layers with ReLU and dropout between them (dropout draws random numbers: a count that consumed them
    would change the training that follows); each step costs ``STEP_S`` on the virtual clock when one is set."""

    def __init__(self, widths=WIDTHS, dropout=0.1):
        super().__init__()
        layers = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(widths) - 2:
                layers += [nn.ReLU(), nn.Dropout(dropout)]
        self.net = nn.Sequential(*layers)
        self.steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        if "clock" in CLOCK:
            CLOCK["clock"].advance(STEP_S)
        loss = super().training_step(batch, batch_idx)
        self.log("train_loss", loss)
        return loss

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(128, WIDTHS[0], generator=g)
        return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=BATCH, shuffle=True)


@pytest.fixture
def clock(monkeypatch):
    c = use_virtual_clock(monkeypatch)
    CLOCK["clock"] = c
    yield c
    CLOCK.clear()


def timed_fit(tmp_path, timer, model=None, **kwargs):
    kwargs.setdefault("max_steps", 40)
    kwargs.setdefault("max_epochs", None)
    kwargs.setdefault("limit_val_batches", 0)
    kwargs.setdefault("num_sanity_val_steps", 0)
    model = model or LinearStack()
    fit(tmp_path, [timer], model=model, **kwargs)
    return find_summary(tmp_path)["iteration_timer"], model


def test_auto_counts_a_linear_stack_as_its_closed_form(tmp_path, clock):
    t, model = timed_fit(tmp_path, IterationTimer(warmup_steps=3, flops_per_batch="auto"))
    expected = closed_form_flops()
    assert t["flops_source"] == "auto"
    assert t["flops_per_batch"] == pytest.approx(expected, rel=0.01)
    assert t["flops_per_batch"] == expected  # FlopCounterMode counts exactly the products above
    # counted once, on a copy: the model's own attributes are untouched, the clock moved by one step's cost (the
    # copy ran training_step once), and that time is left out of every figure
    assert model.steps == t["batches"]
    assert t["flops_count_time_s"] == pytest.approx(STEP_S, rel=1e-6)
    assert t["histogram_ms"]["max"] == pytest.approx(STEP_S * 1000, rel=1e-6)
    assert t["train_time_s"] == pytest.approx(t["batches"] * STEP_S, rel=1e-6)


def test_tflops_and_mfu_are_the_summary_own_fields_recomputed(tmp_path, clock):
    peak = 2.5e9
    t, _ = timed_fit(tmp_path, IterationTimer(warmup_steps=2, flops_per_batch="auto", available_flops=peak))
    measured_s = t["histogram_ms"]["sum"] / 1000.0
    tflops = t["flops_per_batch"] * t["measured_iterations"] / measured_s / 1e12
    assert t["tflops_per_s"] == pytest.approx(tflops, rel=1e-9)
    # and against the clock: each step costs STEP_S, so FLOP/s = FLOPs per batch / STEP_S
    assert t["tflops_per_s"] == pytest.approx(closed_form_flops() / STEP_S / 1e12, rel=1e-6)
    assert t["available_flops"] == peak and t["available_flops_source"] == "argument"
    assert t["mfu_pct"] == pytest.approx(100.0 * closed_form_flops() / STEP_S / peak, rel=1e-6)
    assert "mfu_pct" not in t["unavailable"] and "tflops_per_s" not in t["unavailable"]


def test_a_given_flops_per_batch_with_accumulation_counts_batches(tmp_path, clock):
    t, model = timed_fit(tmp_path, IterationTimer(warmup_steps=2, flops_per_batch=1e6), accumulate_grad_batches=2,
                         max_steps=10)
    assert t["flops_source"] == "argument" and model.steps == t["batches"]  # nothing counted
    # an iteration is 2 batches of STEP_S each: 1e6 FLOPs per STEP_S
    assert t["tflops_per_s"] == pytest.approx(1e6 / STEP_S / 1e12, rel=1e-6)
    assert t["tflops_per_s"] == pytest.approx(1e6 * t["batches_per_s"] / 1e12, rel=1e-9)


def test_mfu_is_unavailable_on_cpu_with_the_reason(tmp_path, clock):
    t, _ = timed_fit(tmp_path, IterationTimer(warmup_steps=2, flops_per_batch="auto"))
    assert t["tflops_per_s"] is not None
    assert t["mfu_pct"] is None and t["available_flops"] is None
    reason = t["unavailable"]["mfu_pct"]
    assert "cpu" in reason and "available_flops" in reason


def test_without_flops_the_fields_are_null_with_reasons(tmp_path, clock):
    t, _ = timed_fit(tmp_path, IterationTimer(warmup_steps=2), max_steps=6)
    assert t["flops_per_batch"] is None and t["tflops_per_s"] is None and t["mfu_pct"] is None
    assert "flops_per_batch" in t["unavailable"]["tflops_per_s"]
    assert t["items_per_s"] is None and "items_fn" in t["unavailable"]["items_per_s"]


def test_items_per_s_is_items_per_batch_times_it_per_s(tmp_path, clock):
    t, _ = timed_fit(tmp_path, IterationTimer(warmup_steps=2, items_fn=lambda batch: batch[0].numel()))
    items_per_batch = BATCH * WIDTHS[0]  # every batch is full: 128 rows in batches of 8
    assert t["items_per_s"] == pytest.approx(items_per_batch * t["it_per_s"], rel=1e-9)
    assert t["items_per_s"] == pytest.approx(items_per_batch / STEP_S, rel=1e-6)
    assert t["items"] == items_per_batch * t["batches"]


class ReadsItsLoss(LinearStack):
    """Reads a value in its step (``.item()``): not countable on the meta device, so counted on a real copy."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.last_loss = loss.item()
        return loss


@pytest.mark.parametrize("model_class", [LinearStack, ReadsItsLoss], ids=["meta_copy", "real_copy"])
def test_the_count_leaves_the_training_as_it_was(tmp_path, model_class):
    """Two seeded fits, one counting FLOPs with "auto": same parameters and optimizer state at the end (dropout and
    the shuffling DataLoader draw random numbers; a count that drew any would change both)."""
    ends = []
    for name, flops in (("plain", None), ("auto", "auto")):
        torch.manual_seed(7)
        model = model_class(dropout=0.5) if model_class is LinearStack else model_class()
        trainer = Trainer(callbacks=[IterationTimer(warmup_steps=2, flops_per_batch=flops)],
                          **trainer_kwargs(tmp_path / name, max_steps=12, max_epochs=None, limit_val_batches=0,
                                           num_sanity_val_steps=0))
        trainer.fit(model)
        ends.append((copy.deepcopy(model.state_dict()), copy.deepcopy(trainer.optimizers[0].state_dict())))
        if flops == "auto":
            assert find_summary(tmp_path / name)["iteration_timer"]["flops_per_batch"] == closed_form_flops()
    (params_a, opt_a), (params_b, opt_b) = ends
    for key in params_a:
        assert torch.equal(params_a[key], params_b[key]), key
    assert opt_a == opt_b


def test_tensorboard_gets_tflops_mfu_and_items(tmp_path, clock):
    timed_fit(tmp_path, IterationTimer(warmup_steps=2, flops_per_batch="auto", available_flops=1e9,
                                       items_fn=lambda batch: batch[0].shape[0] * 3, log_every_n_steps=5))
    scalars = read_scalars(tmp_path)
    for key in ("perf/tflops_per_s", "perf/mfu_pct", "perf/items_per_s", "perf/final_tflops_per_s",
                "perf/final_mfu_pct"):
        assert key in scalars, key
    assert scalars["perf/items_per_s"][-1][1] == pytest.approx(BATCH * 3 / STEP_S, rel=1e-4)
    assert scalars["perf/mfu_pct"][-1][1] == pytest.approx(100 * closed_form_flops() / STEP_S / 1e9, rel=1e-4)


class KeepsGraphs(LinearStack):
    """Keeps every step's loss with its autograd graph, in a list and in a dict (a leak EvalNoGradGuard reports):
    ``copy.deepcopy`` refuses a tensor with a graph, and the count needs a copy of the module."""

    def __init__(self):
        super().__init__()
        self.kept = []
        self.by_name = {"losses": []}
        self.total = torch.zeros(())

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.kept.append(loss)
        self.by_name["losses"].append(loss * 2)
        self.total += loss  # in place: the copy's step must change the copy's total, not this one
        return loss


class KeepsGraphsReadsItsLoss(KeepsGraphs, ReadsItsLoss):
    """Also reads a value in its step (ReadsItsLoss's): counted on a real copy, not on the meta one."""


@pytest.mark.parametrize("model_class", [KeepsGraphs, KeepsGraphsReadsItsLoss], ids=["meta_copy", "real_copy"])
def test_auto_counts_a_model_that_keeps_its_graphs(tmp_path, clock, model_class):
    """The tensors with a graph that the module holds go to the copy detached: the count is the closed form, on the
    meta copy and on the real one, and the model's own lists keep their graphs."""
    t, model = timed_fit(tmp_path, IterationTimer(warmup_steps=3, flops_per_batch="auto"), model=model_class(),
                         max_steps=8)
    assert t["flops_source"] == "auto" and t["flops_per_batch"] == closed_form_flops()
    assert "tflops_per_s" not in t["unavailable"]
    assert len(model.kept) == len(model.by_name["losses"]) == model.steps == 8  # the copy appended to its own lists
    assert all(loss.grad_fn is not None for loss in model.kept + model.by_name["losses"])
    expected = torch.zeros(())
    for loss in model.kept:  # the model's own steps' losses, added in the order its steps added them
        expected = expected + loss
    assert torch.equal(model.total.detach(), expected.detach())  # nothing of the counted step in it


class LockedModel(LinearStack):
    """Holds a lock (as a model with a background writer would): it cannot be copied, so its FLOPs cannot be counted."""

    def __init__(self):
        super().__init__()
        import threading

        self.lock = threading.Lock()


def test_auto_that_cannot_count_warns_once_and_training_goes_on(tmp_path, clock):
    with pytest.warns(UserWarning, match="could not count") as record:
        t, model = timed_fit(tmp_path, IterationTimer(warmup_steps=0, flops_per_batch="auto"), model=LockedModel(),
                             max_steps=8)
    assert sum("could not count" in str(w.message) for w in record) == 1
    assert t["iterations"] == 8 and model.steps == 8  # trained on, nothing counted
    assert t["flops_per_batch"] is None and t["tflops_per_s"] is None
    reason = t["unavailable"]["tflops_per_s"]
    assert "could not count" in reason and "lock" in reason and "flops_per_batch=" in reason


def test_auto_under_manual_optimization_says_why(tmp_path):
    with pytest.warns(UserWarning, match="manual optimization"):
        fit(tmp_path, [IterationTimer(warmup_steps=1, flops_per_batch="auto")], model=ManualModel(), max_epochs=1)
    t = find_summary(tmp_path)["iteration_timer"]
    assert t["flops_per_batch"] is None and "manual optimization" in t["unavailable"]["tflops_per_s"]


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(flops_per_batch="many"), "flops_per_batch"),
        (dict(flops_per_batch=0), "flops_per_batch"),
        (dict(flops_per_batch=-5.0), "flops_per_batch"),
        (dict(flops_per_batch=True), "flops_per_batch"),
        (dict(flops_per_batch=math.nan), "flops_per_batch"),
        (dict(available_flops=0), "available_flops"),
        (dict(available_flops="312e12"), "available_flops"),
        (dict(available_flops=math.inf), "available_flops"),
        (dict(items_fn=3), "items_fn"),
    ],
)
def test_bad_constructor_values_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=rf"`IterationTimer\({name}="):
        IterationTimer(**kwargs)


def test_resume_keeps_the_count(tmp_path, clock):
    first = LinearStack()
    fit(tmp_path / "a", [IterationTimer(warmup_steps=1, flops_per_batch="auto"),
                         ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)],
        model=first, max_steps=6, max_epochs=None, limit_val_batches=0, num_sanity_val_steps=0)
    second = LinearStack()
    trainer = Trainer(callbacks=[IterationTimer(warmup_steps=1, flops_per_batch="auto")],
                      **trainer_kwargs(tmp_path / "b", max_steps=12, max_epochs=None, limit_val_batches=0,
                                       num_sanity_val_steps=0))
    trainer.fit(second, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"))
    t = find_summary(tmp_path / "b")["iteration_timer"]
    assert t["flops_per_batch"] == closed_form_flops() and t["resumed_at_iteration"] == 6
    assert second.steps == 6  # the resumed process trained 6 batches and counted nothing again
