"""What the step path costs, counted rather than timed: which calls a training step makes (a closed-form count per
step), and that a saving keeps what the step's hooks do when one of them fails."""

import pytest
from lightning.pytorch import Callback

from helpers import find_summary, fit
from lightning_perf import EvalNoGradGuard, IterationTimer, PerfCheckFailed, PerfSuite, SectionProfiler, VRAMMonitor

#: 64 items in batches of 8, one epoch (tests.helpers.fit's loader)
BATCHES = 8
#: The hooks Lightning calls at every training step
STEP_HOOKS = ("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
              "on_before_optimizer_step", "on_before_zero_grad")


def children():
    return [IterationTimer(warmup_steps=1), SectionProfiler(warmup_steps=1, print_reports=False),
            VRAMMonitor(nvml_interval_s=0.01), EvalNoGradGuard()]


class CountBatches(Callback):
    """Counts the training batches Lightning runs."""

    batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.batches += 1


def test_the_suites_step_hooks_reach_their_callbacks_without_the_generic_forwarder(tmp_path, monkeypatch):
    """The six step hooks loop over their callbacks themselves: per training step, no call of ``_forward`` for any
    of them (the phase hooks still go through it), and each callback's step hook runs once a batch."""
    forwarded = []
    generic = PerfSuite._forward

    def counting(self, name, *args):
        forwarded.append(name)
        return generic(self, name, *args)

    monkeypatch.setattr(PerfSuite, "_forward", counting)
    suite = PerfSuite(children())
    ran = dict.fromkeys(STEP_HOOKS, 0)
    for name in STEP_HOOKS:
        for fn, cb in suite._by_hook.get(name, ()):
            def counted(*args, _fn=fn, _name=name):
                ran[_name] += 1
                return _fn(*args)

            setattr(cb, name, counted)
    suite._build_dispatch()  # (the instance attributes above are what it binds)
    counter = CountBatches()
    fit(tmp_path, [suite, counter], max_epochs=1)
    assert counter.batches == BATCHES
    assert not set(forwarded) & set(STEP_HOOKS), sorted(set(forwarded) & set(STEP_HOOKS))
    assert "on_train_start" in forwarded and "on_fit_start" in forwarded  # (the other hooks: as before)
    for name in STEP_HOOKS:
        callbacks = len(suite._by_hook.get(name, ()))
        assert ran[name] == callbacks * BATCHES, (name, ran[name], callbacks)


def test_a_step_hook_that_fails_in_the_suite_is_recorded_and_the_callbacks_after_it_still_run():
    """Where one callback's step hook raises, the suite records it on that callback (a failed check: raised once
    every callback has run the hook), and the callbacks after it still run the hook: as ``_forward`` does."""
    # (SectionProfilers: a suite forwards a hook to callbacks whose class defines it)
    first, second, third = (SectionProfiler(print_reports=False, summary_path=f"{n}.json") for n in "abc")
    seen = []

    def broken(trainer, pl_module, loss):
        seen.append("second")
        raise RuntimeError("bookkeeping broke")

    def check_fails(trainer, pl_module, loss):
        seen.append("first")
        raise PerfCheckFailed("asked to fail")

    first.on_before_backward = check_fails
    second.on_before_backward = broken
    third.on_before_backward = lambda trainer, pl_module, loss: seen.append("third")
    suite = PerfSuite([first, second, third])
    assert [cb for _, cb in suite._by_hook["on_before_backward"]] == [first, second, third]
    with pytest.raises(PerfCheckFailed, match="asked to fail"):
        suite.on_before_backward(None, None, None)
    assert seen == ["first", "second", "third"]
    assert "bookkeeping broke" in second._failures["on_before_backward"]
    assert "on_before_backward" not in first._failures

    seen.clear()
    second.on_before_backward = lambda trainer, pl_module, loss: seen.append("second")
    first.on_before_backward = broken
    suite._build_dispatch()
    suite.on_before_backward(None, None, None)  # recorded, not raised
    assert seen == ["second", "second", "third"] and "bookkeeping broke" in first._failures["on_before_backward"]


def count_calls(run, names):
    """Python calls, by function name, of the functions called ``names`` made while ``run()`` runs (this thread)."""
    import sys

    counts = dict.fromkeys(names, 0)

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name in counts and "lightning_perf" in frame.f_code.co_filename:
            counts[frame.f_code.co_name] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(previous)
    return counts


def test_a_plain_step_makes_no_call_whose_test_its_caller_can_make(tmp_path):
    """A step with nothing due (no report, no device, the batch shaped as the first) calls no helper whose first test
    would send it back: IterationTimer follows the batch size's path in its hook (``_batch_size`` and ``follow``
    only at the first batch, which finds it), SectionProfiler's close and between-batches work (``_closed``,
    ``_own_work_between_batches``) only where due, the ledger's held switch (``_hold``) only at a batch end and a
    close: closed-form counts over the fit's batches."""
    suite = PerfSuite([IterationTimer(warmup_steps=1),
                       SectionProfiler(warmup_steps=1, print_reports=False, report_every_n_steps=1000)])
    names = ("_batch_size", "follow", "_closed", "_own_work_between_batches", "_hold", "between_batches")
    counts = count_calls(lambda: fit(tmp_path, [suite], max_epochs=1, limit_val_batches=0), names)
    assert counts["_batch_size"] == 1 and counts["follow"] == 1, counts
    assert counts["_closed"] == 1 and counts["_own_work_between_batches"] == 0, counts  # (1: the train end's close)
    assert counts["_hold"] == 2 * BATCHES, counts  # each batch's end, each iteration's close
    assert counts["between_batches"] <= 2, counts  # (an epoch's end, the train's end: not a step's)
    assert find_summary(tmp_path)["section_profiler"]["sections"]["forward"]["count"] == BATCHES - 1
