"""The digits classifier for TensorFlow (tf-keras, the Keras 2 API) and how trainers save it.

Import after ``TF_USE_LEGACY_KERAS=1`` is set (``dtc_train.tf_env``)."""

import os

import tensorflow as tf
import tf_keras as keras

from . import common

IMAGE_SHAPE = (8, 8, 1)   # height, width, channels; float32 in [0, 1]
NUM_CLASSES = 10


def build_model() -> keras.Model:
    """[B, 8, 8, 1] -> [B, 10] logits: the same network as ``torch_model.DigitsNet``."""
    return keras.Sequential([
        keras.layers.Input(IMAGE_SHAPE),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(NUM_CLASSES),
    ], name="digits_net")


def save(model: keras.Model, model_dir: str, *, val_accuracy: float | None, epochs: int, world_size: int,
         strategy: str) -> None:
    """Writes the SavedModel to ``<model_dir>/1`` (the TensorFlow Serving layout) atomically,
    with ``model.json`` describing it."""
    saved_model = os.path.join(model_dir, "1")
    common.atomic_write_tree(saved_model, lambda tmp: model.save(tmp, save_format="tf", include_optimizer=False))
    common.write_json(os.path.join(model_dir, "model.json"), {
        "framework": "tensorflow", "format": "SavedModel", "path": "1",
        "input_shape": list(IMAGE_SHAPE), "input_scale": "pixel / 255",
        "classes": [str(c) for c in range(NUM_CLASSES)], "val_accuracy": val_accuracy,
        "epochs": epochs, "world_size": world_size, "strategy": strategy})
    common.log.info("saved %s", saved_model)


def sparse_metrics(logits, labels) -> tuple[float, float]:
    """(summed cross-entropy, correct predictions) of logits [N, 10] against int labels [N]."""
    loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1, output_type=tf.int32) == tf.cast(labels, tf.int32),
                                    tf.float64))
    return float(tf.reduce_sum(loss)), float(correct)

