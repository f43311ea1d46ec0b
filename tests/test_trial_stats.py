"""The A/B trial's schedule and paired statistics on a virtual clock: a known extra cost, drift, periodic work."""

import math
import random

import pytest

from lightning_perf.measure.trials.blocks import OFF, ON, BlockSchedule, TrialBlocks, paired_ratio


def simulate(schedule, extra=0.05, seed=0, noise=0.03, drift=0.2, every=None, spike=5.0, step_s=0.01):
    """Runs a trial's iterations on a virtual clock: a step of ``step_s`` that drifts slowly by up to ``drift``
    (another process's load), with Gaussian noise, ``extra`` more with the change on, and work of ``spike`` steps
    every ``every`` iterations (a checkpoint). Returns the trial's (ratio, low, high)."""
    rng = random.Random(seed)
    phase = rng.random() * 2 * math.pi
    blocks = TrialBlocks(schedule)
    for i in range(schedule.total):
        arm = schedule.arm(i)
        cost = step_s * (1 + drift * math.sin(phase + 2 * math.pi * i / 900)) * (1 + noise * rng.gauss(0, 1))
        if arm == ON:
            cost *= 1 + extra
        if every and i % every == every - 1:
            cost += spike * step_s
        block, counted = schedule.where(i)
        if counted:
            blocks.add(block, cost, 8)
    return paired_ratio(blocks.pair_means())


def truth(extra=0.05, every=None, spike=5.0):
    """The ratio of the arms' mean times: periodic work costs both arms the same, so it dilutes the change."""
    periodic = spike / every if every else 0.0
    return (1 + extra + periodic) / (1 + periodic)


def test_schedule_pairs_one_block_each_arm_and_settles_after_switches():
    schedule = BlockSchedule(warmup=6, block=5, blocks=8, order="random", settle=1, seed=3)
    assert schedule.total == 6 + 40
    assert [schedule.arm(i) for i in range(6)] == [OFF] * 3 + [ON] * 3
    for k in range(4):
        assert {schedule.arm_of_block(2 * k), schedule.arm_of_block(2 * k + 1)} == {OFF, ON}
    assert schedule.where(6) == (0, False) and schedule.where(7) == (0, True) and schedule.where(11) == (1, False)
    assert schedule.arm(46) is None and schedule.where(46) == (None, False)
    abba = BlockSchedule(warmup=0, block=2, blocks=8, order="abba")
    assert [abba.arm_of_block(i) for i in range(8)] == [OFF, ON, ON, OFF, OFF, ON, ON, OFF]


@pytest.mark.parametrize("kwargs, match", [(dict(order="abab"), "order"), (dict(blocks=5), "blocks"),
                                           (dict(blocks=2), "blocks"), (dict(settle=10), "settle"),
                                           (dict(warmup=-1), "warmup")])
def test_schedule_refuses_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BlockSchedule(**kwargs)


def test_a_known_extra_cost_is_measured_within_one_percent():
    for seed in range(5):
        ratio, low, high = simulate(BlockSchedule(warmup=20, block=10, blocks=24, seed=seed), extra=0.05, seed=seed)
        assert abs(ratio / 1.05 - 1) < 0.01, (seed, ratio)
        assert low < 1.05 < high


@pytest.mark.parametrize("order", ["random", "abba"])
def test_periodic_work_does_not_bias_the_arms(order):
    """A checkpoint every two blocks: strict alternation (A B A B) would put each one on the same arm."""
    logs = []
    for seed in range(300):
        schedule = BlockSchedule(warmup=20, block=10, blocks=24, order=order, seed=seed)
        logs.append(math.log(simulate(schedule, extra=0.05, seed=seed, every=20, noise=0.01)[0]))
    mean = sum(logs) / len(logs)
    se = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1) / len(logs))
    assert abs(mean - math.log(truth(every=20))) < max(3 * se, 0.001), (math.exp(mean), se)


def test_strict_alternation_would_be_biased_by_the_same_periodic_work():
    """The check above can fail: an A B A B order with the same checkpoints is off by far more than 0.5%."""

    class Alternating(BlockSchedule):
        def arm_of_block(self, index):
            return ON if index % 2 else OFF

    ratio = simulate(Alternating(warmup=20, block=10, blocks=24), extra=0.05, seed=0, every=20, noise=0.01)[0]
    assert abs(ratio / truth(every=20) - 1) > 0.05


def test_the_paired_interval_covers_the_truth_at_its_nominal_rate():
    repeats = 400
    covered = sum(low < truth(every=37) < high for _, low, high in
                  (simulate(BlockSchedule(warmup=0, block=10, blocks=24, seed=s), extra=0.05, seed=s, every=37)
                   for s in range(repeats)))
    assert 0.92 <= covered / repeats <= 0.985, covered


def test_a_no_op_is_within_noise_at_most_five_percent_of_the_time():
    repeats = 400
    flagged = sum(not low < 1.0 < high for _, low, high in
                  (simulate(BlockSchedule(warmup=0, block=10, blocks=24, seed=s), extra=0.0, seed=1000 + s, every=37)
                   for s in range(repeats)))
    assert flagged / repeats <= 0.065, flagged  # nominal 5%; 400 repeats see it within about 1.1%


def test_paired_ratio_needs_two_pairs():
    assert paired_ratio([(1.0, 1.1)]) is None
    ratio, low, high = paired_ratio([(1.0, 1.1), (2.0, 2.2), (1.5, 1.65)])
    assert ratio == pytest.approx(1.1) and low == pytest.approx(1.1) and high == pytest.approx(1.1)
    ratio, low, high = paired_ratio([(1.0, 1.0), (1.0, 2.0), (2.0, 2.0)])
    assert ratio == pytest.approx(5 / 4) and low < 1.0 < 5 / 4 < high
