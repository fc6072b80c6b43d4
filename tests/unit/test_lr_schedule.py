"""The learning rate per step (dtc_train.lr_schedule): linear scaling, gradual warmup, cosine decay."""

import math

import pytest

from dtc_train.lr_schedule import LearningRate


def test_constant_is_the_linear_scaling_rule():
    rates = LearningRate.for_job(0.01, 4, 0, epochs=3, steps_per_epoch=10, decay="constant")
    assert {rates.rate(s) for s in range(30)} == {0.04}


def test_warmup_rises_linearly_from_the_one_rank_rate_to_the_scaled_one():
    rates = LearningRate.for_job(0.01, 4, warmup_epochs=0.5, epochs=3, steps_per_epoch=10, decay="constant")
    assert rates.warmup_steps == 5
    assert [rates.rate(s) for s in range(7)] == pytest.approx([0.01, 0.016, 0.022, 0.028, 0.034, 0.04, 0.04])


def test_cosine_decays_from_the_end_of_warmup_towards_zero():
    rates = LearningRate.for_job(0.1, 2, warmup_epochs=1, epochs=5, steps_per_epoch=4, decay="cosine")
    assert rates.rate(4) == pytest.approx(0.2)                   # the peak, right after warmup
    assert rates.rate(4 + 8) == pytest.approx(0.1)               # halfway through the 16 decaying steps
    assert rates.rate(19) == pytest.approx(0.2 * (1 + math.cos(math.pi * 15 / 16)) / 2)   # the last step
    assert all(rates.rate(s) > rates.rate(s + 1) for s in range(4, 19))
    assert rates.describe() == ("learning rate 0.1 per rank x 2 ranks = 0.2, warmup over 4 steps from 0.1, then "
                                "cosine decay to 0 at step 20")


def test_an_unknown_decay_is_named():
    with pytest.raises(ValueError, match="lr-schedule must be one of constant, cosine, got 'step'"):
        LearningRate(0.1, 1, decay="step")
