"""The TensorFlow backends' Keras step (dtc_train.tf_checkpoint.KerasSteps), in process: each
step is the compiled model's own train function, its sums are exact, and the loop's learning
rate reaches the optimizer."""

# tf_env first: it selects Keras 2 before TensorFlow is imported; the import order below is kept.
# isort: off
from dtc_train import tf_env  # noqa: F401

import numpy as np
import pytest
import tensorflow as tf
import tf_keras as keras

from dtc_train import image_folder, tf_checkpoint, tf_model
# isort: on

pytestmark = pytest.mark.e2e


def _model_and_batches(batch=8, steps=3, label_smoothing=0.0):
    tf.keras.utils.set_random_seed(0)
    model = tf_model.build_model()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss=tf_model.training_loss(label_smoothing),
                  metrics=["accuracy"])
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


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_label_smoothing_trains_on_the_smoothed_cross_entropy(smoothing):
    """label-smoothing on the TensorFlow trainers: the step's reported loss is the cross-entropy
    against targets of 1 - e + e/K on the label and e/K elsewhere (the PyTorch trainers' formula,
    test_speed_features.py), summed over the batch."""
    model, images, labels = _model_and_batches(label_smoothing=smoothing)
    steps = tf_checkpoint.KerasSteps(
        model, lambda epoch, first: iter(tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)), 8)
    steps.begin_epoch(1, 0)
    log_p = tf.nn.log_softmax(model(images[:8], training=True)).numpy().astype(np.float64)
    expected = ((1 - smoothing) * -log_p[np.arange(8), labels[:8]] + smoothing * -log_p.mean(axis=1)).sum()
    assert steps.train_step(1)[0] == pytest.approx(expected, rel=1e-5)


def test_bf16_computes_the_layers_in_bfloat16_with_float32_variables_logits_and_loss():
    """precision=bf16 on the TensorFlow trainers: Keras' mixed_bfloat16 policy for the model's
    layers only (the global policy is restored), float32 variables and logits, and a step's loss
    within bfloat16's rounding of the same step in float32."""
    images = np.random.default_rng(0).random((8, *tf_model.IMAGE_SHAPE), dtype=np.float32)
    labels = np.arange(8, dtype=np.int32)
    tf.keras.utils.set_random_seed(0)
    model = tf_model.KerasChoice.from_args("digits", None, "off", "bf16").build(10)
    assert keras.mixed_precision.global_policy().name == "float32"
    conv = next(layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D))
    assert conv.compute_dtype == "bfloat16" and conv(images).dtype == tf.bfloat16
    assert {v.dtype for v in model.trainable_variables} == {tf.float32} and model.output.dtype == tf.float32
    reference = tf_model.KerasChoice.from_args("digits", None, "off").build(10)
    reference.set_weights(model.get_weights())
    losses = []
    for each in (model, reference):
        each.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss=tf_model.training_loss(),
                     metrics=["accuracy"])
        steps = tf_checkpoint.KerasSteps(
            each, lambda epoch, first: iter(tf.data.Dataset.from_tensor_slices((images, labels)).batch(8)), 8)
        steps.begin_epoch(1, 0)
        losses.append(steps.train_step(1)[0])
    assert losses[0] != losses[1] and losses[0] == pytest.approx(losses[1], rel=0.02), losses   # 8-bit mantissa
    assert {v.dtype for v in model.trainable_variables} == {tf.float32}


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


def test_a_keras_architecture_is_chosen_by_name_and_a_wrong_one_named():
    choice = tf_model.KerasChoice.from_args("RegNetX002", 32, "auto")
    assert choice.images.shape("HWC") == (32, 32, 3) and choice.images.augment and choice.images.eval_resize == 37
    assert choice.build(3).output_shape == (None, 3)
    with pytest.raises(ValueError, match=r"model='ResNet5' is neither 'digits' nor a keras.applications architecture "
                                         r"\(closest: ResNet50"):
        tf_model.KerasChoice.from_args("ResNet5", None, "auto")
    with pytest.raises(ValueError, match="model=digits takes 8x8 images; leave image-size unset, or choose a "
                                         "keras.applications architecture"):
        tf_model.KerasChoice.from_args("digits", 32, "auto")


def test_the_tf_data_augmentation_is_a_crop_of_the_size_fixed_by_its_seed():
    image = tf.constant(np.random.default_rng(0).random((37, 37, 3), dtype=np.float32))
    seed = tf.constant([3, 7], tf.int64)
    first, again = (image_folder.augment(image, seed, 32).numpy() for _ in range(2))
    assert first.shape == (32, 32, 3) and np.array_equal(first, again)
    assert not np.array_equal(first, image_folder.augment(image, seed + 1, 32).numpy())


def test_fp16_computes_in_float16_scales_the_loss_and_skips_a_non_finite_step_keeping_the_scale(tmp_path):
    """precision=fp16 on the TensorFlow trainers: Keras' mixed_float16 policy for the layers,
    float32 variables and logits, and the optimizer loss_scaled: a finite step keeps the initial
    scale 2**15 and moves the weights; a step whose activations overflow float16 (an input of
    1e5) is skipped, the weights unchanged, and halves the scale; the checkpoint keeps the scale,
    so a resumed job scales as the uninterrupted one."""
    images = np.random.default_rng(0).random((8, *tf_model.IMAGE_SHAPE), dtype=np.float32)
    labels = np.arange(8, dtype=np.int32)
    tf.keras.utils.set_random_seed(0)
    choice = tf_model.KerasChoice.from_args("digits", None, "off", "fp16")
    model = choice.build(10)
    assert keras.mixed_precision.global_policy().name == "float32"
    conv = next(layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D))
    assert conv.compute_dtype == "float16" and conv(images).dtype == tf.float16
    assert {v.dtype for v in model.trainable_variables} == {tf.float32} and model.output.dtype == tf.float32
    model.compile(optimizer=tf_model.loss_scaled(keras.optimizers.SGD(learning_rate=0.1), "fp16"),
                  loss=tf_model.training_loss(), metrics=["accuracy"])
    overflowing = images.copy()
    overflowing[0] = 1e5
    batches = np.concatenate([images, overflowing])
    steps = tf_checkpoint.KerasSteps(model, lambda epoch, first: iter(
        tf.data.Dataset.from_tensor_slices((batches, np.concatenate([labels, labels]))).batch(8)), 8)
    steps.begin_epoch(1, 0)
    before = [w.copy() for w in model.get_weights()]
    assert np.isfinite(steps.train_step(1)[0])
    assert float(model.optimizer.loss_scale) == 2.0 ** 15
    after_first = [w.copy() for w in model.get_weights()]
    assert any(not np.array_equal(a, b) for a, b in zip(before, after_first, strict=True))
    steps.train_step(2)
    assert float(model.optimizer.loss_scale) == 2.0 ** 14
    assert all(np.array_equal(a, b) for a, b in zip(after_first, model.get_weights(), strict=True))   # skipped

    tf_checkpoint.save_checkpoint(str(tmp_path), model, model.optimizer, 0, 2)
    restored = choice.build(10)
    restored.compile(optimizer=tf_model.loss_scaled(keras.optimizers.SGD(learning_rate=0.1), "fp16"),
                     loss=tf_model.training_loss())
    restored.optimizer.build(restored.trainable_variables)
    assert float(restored.optimizer.loss_scale) == 2.0 ** 15
    tf_checkpoint.restore_checkpoint(str(tmp_path), restored, restored.optimizer)
    assert float(restored.optimizer.loss_scale) == 2.0 ** 14 and int(restored.optimizer.dynamic_counter) == 0
