"""The step hooks guard themselves inline (see ``lightning_perf.callbacks.core.base.guarded``): each one, broken, is
recorded under its own name, warns, and the fit goes on to write its summary; and no other hook goes unguarded."""

import warnings

import pytest
import torch
from lightning.pytorch import Callback

import lightning_perf
from lightning_perf import EvalNoGradGuard, IterationTimer, PerfSuite, SectionProfiler, VRAMMonitor
from tests.helpers import find_summary, fit

#: callback -> (the attribute broken after its on_train_start, the step hooks that guard themselves inline)
INLINE = {
    # (its hooks inside the step append to the held switches, ``_held``, where nothing can fail; with none held they
    # switch the ledger at once, guarded)
    SectionProfiler: (("_ledger", "_held"), ["on_train_batch_start", "on_before_zero_grad", "on_before_backward",
                                "on_after_backward", "on_before_optimizer_step", "on_train_batch_end"]),
    VRAMMonitor: ("_steps", ["on_train_batch_end"]),
    EvalNoGradGuard: ("_watch", ["on_train_batch_start", "on_after_backward", "on_train_batch_end"]),
}
#: the step hooks broken below: the inline ones, and IterationTimer's batch end under ``@guarded`` (a frame: ~0.4 µs
#: a call, under the 2 µs a step that keeps a speed trick; benchmarks/overhead.py --per-hook IterationTimer)
BROKEN = {**INLINE, IterationTimer: ("batches", ["on_train_batch_end"])}
#: hooks with neither guard: nothing in them can fail
UNGUARDED = {(IterationTimer, "on_before_optimizer_step")}  # one assignment


class Breaker(Callback):
    def __init__(self, target, attribute):
        self.target, self.attribute = target, attribute

    def on_train_start(self, trainer, pl_module):
        names = self.attribute if isinstance(self.attribute, tuple) else (self.attribute,)
        self.saved = {name: getattr(self.target, name) for name in names}
        for name in names:
            setattr(self.target, name, None)  # the next use raises (None.append, None + 1, None.arm)

    def on_train_end(self, trainer, pl_module):
        # given back before teardown: EvalNoGradGuard's watch, left armed, must leave torch's global hooks
        for name, value in self.saved.items():
            setattr(self.target, name, value)


@pytest.mark.parametrize("in_suite", [False, True], ids=["apart", "in_suite"])
@pytest.mark.parametrize("cls", list(BROKEN), ids=lambda c: c.__name__)
def test_a_broken_step_hook_is_recorded_under_its_name_and_the_fit_goes_on(tmp_path, cls, in_suite):
    """Apart, Lightning calls the hook itself; in a suite, the suite's forwarder does, or Lightning itself where the
    callback alone defines it (its method on the suite)."""
    attribute, hooks = BROKEN[cls]
    cb = cls(print_reports=False) if cls is SectionProfiler else cls()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        trainer = fit(tmp_path, [PerfSuite([cb]) if in_suite else cb, Breaker(cb, attribute)], max_epochs=1)
    assert trainer.global_step == 8
    assert not torch.nn.modules.module._global_forward_pre_hooks  # nothing left behind for the next test
    section = find_summary(tmp_path)[cb.section_name]
    failures = section["measurement_failures"]
    if cls is SectionProfiler:  # its two marks outside Lightning's hooks: the transfer, the checkpoint write
        assert {"batch_to_device", "checkpoint write"} <= set(failures)
    for hook in hooks:
        assert hook in failures, f"{cls.__name__}.{hook} was not recorded: {sorted(failures)}"
        assert any(f"measurement failed in `{hook}`" in str(w.message) for w in seen)


def test_a_section_or_checkpoint_write_that_fails_is_recorded_not_raised_into_the_users_code(tmp_path, monkeypatch):
    """SectionProfiler's sinks for ``profile_section`` and for the strategy's checkpoint writes run in the user's code
    (a write's ``finally``): a failure there is recorded where it came from and the fit goes on."""
    from lightning_perf.measure.sections.ledger import SectionLedger

    def broken(self, *args):
        raise RuntimeError("injected")

    monkeypatch.setattr(SectionLedger, "user_section", broken)
    monkeypatch.setattr(SectionLedger, "checkpoint", broken)
    sp = SectionProfiler(print_reports=False)

    class User(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            with lightning_perf.profile_section("ema"):
                pass

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = fit(tmp_path, [sp, User()], max_epochs=1)
    assert trainer.global_step == 8
    failures = find_summary(tmp_path)["section_profiler"]["measurement_failures"]
    assert failures == {"profile_section": "RuntimeError: injected", "checkpoint write": "RuntimeError: injected"}


def test_every_other_hook_keeps_its_guard():
    """A hook added later without ``@guarded`` (and not guarding itself, listed above) fails here."""
    base = vars(Callback)
    for name in lightning_perf.CALLBACKS:
        cls = getattr(lightning_perf, name)
        inline = set(INLINE.get(cls, (None, []))[1])
        for hook, fn in vars(cls).items():
            if hook not in base or not (hook.startswith("on_") or hook == "setup") or hook == "on_load_checkpoint":
                continue  # (teardown writes the summary and on_load_checkpoint reads state, each in a try of its own)
            if hook in inline or (cls, hook) in UNGUARDED:
                assert not hasattr(fn, "__guarded__"), f"{name}.{hook}: guarded twice"
            else:
                assert hasattr(fn, "__guarded__"), f"{name}.{hook} has no guard"
