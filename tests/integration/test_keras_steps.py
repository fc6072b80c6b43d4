"""The TensorFlow backends' Keras step (dtc_train.tf_checkpoint.KerasSteps), in process: each
step is the compiled model's own train function, its sums are exact, and the loop's learning
rate reaches the optimizer."""

import numpy as np
import pytest

pytestmark = pytest.mark.e2e

import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

from dtc_train import (  # noqa: E402
    tf_checkpoint,
    tf_env,  # noqa: F401  (Keras 2 before TensorFlow)
    tf_model,
)


def _model_and_batches(batch=8, steps=3):
    tf.keras.utils.set_random_seed(0)
    model = tf_model.build_model()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    rng = np.random.default_rng(0)
    images = rng.random((batch * steps, *tf_model.IMAGE_SHAPE), dtype=np.float32)
    labels = rng.integers(0, 10, batch * steps).astype(np.int32)
    return model, images, labels


def test_a_steps_sums_are_its_batchs_loss_sum_correct_count_and_samples():
    model, images, labels = _model_and_batches()
    before = [w.copy() for w in model.get_weights()]
    steps = tf_checkpoint.KerasSteps(
        model, lambda epoch, first: iter(tf.data.Dataset.from_tensor_slices((images, labels)).batch(8).skip(first)), 8)
    steps.begin_epoch(1, 0)
    expected_loss, expected_correct = tf_model.sparse_metrics(model(images[:8], training=True), labels[:8])
    sums = steps.train_step(1)
    assert sums[2] == 8 and sums[1] == expected_correct and sums[0] == pytest.approx(expected_loss, rel=1e-5)
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
    second = steps.train_step(2)
    assert second[2] == 8 and float(second[1]).is_integer()


def test_the_loops_rate_reaches_the_optimizer():
    model, images, labels = _model_and_batches()
    steps = tf_checkpoint.KerasSteps(
        model, lambda epoch, first: iter(tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)), 8)
    steps.begin_epoch(1, 0)
    steps.set_learning_rate(0.0)
    assert float(model.optimizer.learning_rate.numpy()) == 0.0
    before = [w.copy() for w in model.get_weights()]
    steps.train_step(1)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))   # rate 0: no move
    steps.set_learning_rate(0.05)
    steps.train_step(2)
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.05)
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))
