"""Early stopping and the non-finite loss rule (dtc_train.plateau): Keras' EarlyStopping on
val_loss with min_delta 0, its state through a checkpoint, and the failure's first line."""

import math

import pytest

from dtc_train import plateau


def test_training_stops_after_patience_epochs_without_a_lower_validation_loss():
    rule = plateau.Plateau(patience=2)
    stops = [rule.update(epoch, loss) for epoch, loss in enumerate([0.9, 0.5, 0.5, 0.6], start=1)]
    # epoch 3 ties the best (not lower: no improvement), epoch 4 is the second without one
    assert stops == [False, False, False, True]
    assert (rule.best_loss, rule.best_epoch, rule.stopped_after) == (0.5, 2, 4)
    assert rule.describe(12) == ("early stopping after epoch 4 of 12: the validation loss has not improved on 0.5000 "
                                 "(epoch 2) for 2 epochs (early-stopping-patience=2)")


def test_patience_zero_never_stops():
    rule = plateau.Plateau(patience=0)
    assert not any(rule.update(epoch, 1.0) for epoch in range(1, 50))


def test_the_state_survives_a_checkpoint_and_counts_on():
    rule = plateau.Plateau(patience=3)
    rule.update(1, 0.8)
    rule.update(2, 0.9)
    resumed = plateau.Plateau.from_state(3, rule.state())
    assert resumed == rule
    assert not resumed.update(3, 0.85) and resumed.update(4, 0.81)   # epochs 2, 3 and 4 without a lower loss
    assert plateau.Plateau.from_state(3, None) == plateau.Plateau(3, math.inf, 0, 0)


@pytest.mark.parametrize("loss", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_fails_naming_the_step_unless_told_to_continue(loss):
    with pytest.raises(FloatingPointError) as error:
        plateau.check_loss(loss, epoch=2, step=5, global_step=28, rank=1, policy="fail")
    assert str(error.value) == (
        f"the training loss is {loss} at step 5 of epoch 2 (global step 28) on rank 1: the model diverged; lower "
        "learning-rate (or warm it up: warmup-epochs), check the training data, or set nonfinite-loss=continue to "
        "train on")
    plateau.check_loss(loss, epoch=2, step=5, global_step=28, rank=1, policy="continue")
    plateau.check_loss(1.5, epoch=2, step=5, global_step=28, rank=1, policy="fail")
