"""The TensorFlow trainers' models (tf-keras, the Keras 2 API): the digits CNN or any
``keras.applications`` architecture (``KerasChoice``), optionally started from a Keras HDF5
weights file in a channel (``pretrained-weights``: ``load_pretrained``), and how trainers save
them.

Import after ``TF_USE_LEGACY_KERAS=1`` is set (``dtc_train.tf_env``)."""

import difflib
import inspect
import os
from dataclasses import dataclass

import h5py
import tensorflow as tf
import tf_keras as keras

from . import common, contract
from .dali_data import ImageSpec, input_spec

DIGITS = "digits"

IMAGE_SHAPE = (8, 8, 1)   # height, width, channels; float32 in [0, 1]
# precision (dtc_train.config.PRECISIONS) -> Keras' dtype policy; fp16 also scales the loss
# (loss_scaled), which the parameter-server trainer cannot (config refuses it there).
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
NUM_CLASSES = 10
# Keras' HDF5 weights files: model.save_weights("x.h5"), model.save("x.h5"), keras.applications' downloads
WEIGHT_SUFFIXES = (".h5", ".hdf5")


def build_model(num_classes: int = NUM_CLASSES) -> keras.Model:
    """[B, 8, 8, 1] -> [B, num_classes] logits: the same network as ``torch_model.DigitsNet``."""
    return keras.Sequential([
        keras.layers.Input(IMAGE_SHAPE),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(num_classes),
    ], name="digits_net")


def keras_architectures() -> list[str]:
    """The classification architectures ``keras.applications`` builds (``ResNet50``,
    ``MobileNetV2``, ``EfficientNetB0``, ...), sorted."""
    return sorted(name for name in dir(keras.applications)
                  if name[:1].isupper() and callable(getattr(keras.applications, name)))


@dataclass(frozen=True)
class KerasChoice:
    """The model hyperparameters of a TensorFlow trainer, parsed once.

    Attributes:
        name: ``digits`` or a ``keras.applications`` architecture.
        images: its input and the training augmentation (``dali_data.ImageSpec``; layout HWC).
        precision: ``fp32``, ``bf16`` or ``fp16`` (``POLICIES``).
        pretrained_weights: a weights file in an input channel to start from
            (``CHANNEL[/PATH]``: ``start_from_pretrained``), or ``None``.
    """

    name: str
    images: ImageSpec
    precision: str = "fp32"
    pretrained_weights: str | None = None

    @classmethod
    def from_args(cls, model: str, image_size: int | None, augment: str, precision: str = "fp32",
                  pretrained_weights: str | None = None) -> "KerasChoice":
        """Checks and combines ``model``, ``image-size``, ``augment`` (``dali_data.input_spec``),
        ``precision`` (``POLICIES``) and ``pretrained-weights``.

        Raises:
            ValueError: an unknown architecture (the closest names given), an image size below 1,
                the digits CNN at another size than 8, or a precision without a policy.
        """
        if precision not in POLICIES:
            raise ValueError(f"precision={precision!r}: the TensorFlow trainers compute in {' or '.join(POLICIES)}")
        if model != DIGITS and model not in keras_architectures():
            close = difflib.get_close_matches(model, keras_architectures(), n=3) or keras_architectures()[:5]
            raise ValueError(f"model={model!r} is neither {DIGITS!r} nor a keras.applications architecture "
                             f"(closest: {', '.join(close)})")
        return cls(model, input_spec(model == DIGITS, image_size, augment,
                                     "a keras.applications architecture (model=ResNet50, ...)"), precision,
                   pretrained_weights or None)

    def describe(self, classes: tuple[str, ...], **extra) -> dict:
        """``model.json``: the SavedModel's input, normalization and classes, and ``extra``
        (``val_accuracy``, ``epochs``, ``world_size``, ``strategy``), as ``torch_model.ModelChoice.describe``."""
        return {"framework": "tensorflow", "format": "SavedModel", "path": "1", "model": self.name,
                "input_shape": list(self.images.shape("HWC")), "precision": self.precision,
                "input_normalization": {"mean": list(self.images.mean), "std": list(self.images.std),
                                        "formula": "(pixel - mean) / std, pixel in 0..255"},
                "eval_resize": self.images.eval_resize, "classes": list(classes), **extra}

    def build(self, num_classes: int) -> keras.Model:
        """The untrained model: images float32 [B, S, S, C] -> logits float32 [B, num_classes]
        (the caller seeds TensorFlow, so every rank builds the same weights).

        Its layers compute in ``precision`` (Keras' dtype policy ``POLICIES[precision]``, set
        while they are built and restored after): under bf16 (fp16) they compute in bfloat16
        (float16) and keep float32 variables, so gradients and the optimizer stay float32, and a
        final float32 ``Activation`` returns the logits in float32 for the loss (Keras'
        mixed-precision guide). fp16 also needs its optimizer ``loss_scaled``.
        """
        previous = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(POLICIES[self.precision])
        try:
            model = self._build(num_classes)
        finally:
            keras.mixed_precision.set_global_policy(previous)
        if model.output.dtype == tf.float32:
            return model
        logits = keras.layers.Activation("linear", dtype="float32", name="logits_float32")(model.output)
        return keras.Model(model.inputs, logits, name=model.name)

    def _build(self, num_classes: int) -> keras.Model:
        if self.name == DIGITS:
            return build_model(num_classes)
        build = getattr(keras.applications, self.name)
        options = {"weights": None, "input_shape": self.images.shape("HWC"), "classes": num_classes,
                   "classifier_activation": None}
        if "include_preprocessing" in inspect.signature(build).parameters:
            options["include_preprocessing"] = False   # the input pipeline normalizes (EfficientNet, RegNet, ...)
        return build(**options)


def _saved_layers(path: str) -> dict[str, list[tuple[int, ...]]]:
    """Layer name -> its weights' shapes, in a Keras HDF5 weights file (tf-keras' layout:
    ``layer_names`` and each layer's ``weight_names`` as attributes, at the top or, in a whole
    model saved to ``.h5``, under ``model_weights``).

    Raises:
        ValueError: the file is not HDF5 or holds no Keras weights.
    """
    def names(attribute) -> list[str]:
        return [n.decode() if isinstance(n, bytes) else str(n) for n in attribute]

    try:
        with h5py.File(path, "r") as handle:
            whole_model = "layer_names" not in handle.attrs and "model_weights" in handle
            group = handle["model_weights"] if whole_model else handle
            if "layer_names" not in group.attrs:
                raise ValueError("no layer_names attribute")
            return {layer: [group[layer][weight].shape for weight in names(group[layer].attrs["weight_names"])]
                    for layer in names(group.attrs["layer_names"])}
    except (OSError, KeyError, ValueError) as error:
        raise ValueError(f"pretrained-weights file {path} is not a Keras HDF5 weights file ({error}): give the file "
                         "model.save_weights('<name>.h5') writes (or keras.applications' .h5 weights)") from error


def load_pretrained(model: keras.Model, path: str) -> tuple[list[str], list[str]]:
    """Copies the weights of the Keras HDF5 file at ``path`` into ``model``'s layers of the same
    name whose weights have the same shapes (tf-keras' ``load_weights(by_name=True,
    skip_mismatch=True)``); a classification head sized for another number of classes
    (``predictions``, ``dense_1``, ...) keeps its initial values. Call where the model's
    variables were created (under the strategy's scope).

    Returns:
        (names of the layers loaded, names of ``model``'s layers with weights left at their
        initial values, each with its weight shapes in the model and in the file).

    Raises:
        ValueError: the file is not a Keras HDF5 weights file, or none of its layers fits ``model``.
    """
    saved = _saved_layers(path)
    loaded, left = [], []
    for layer in model.layers:
        if not layer.weights:
            continue
        own = [tuple(w.shape) for w in layer.weights]
        if saved.get(layer.name) == own:
            loaded.append(layer.name)
        else:
            left.append(f"{layer.name} {own} " + (f"(file: {saved[layer.name]})" if layer.name in saved
                                                   else "(not in the file)"))
    if not loaded:
        own_names = ", ".join(layer.name for layer in model.layers[:3])
        raise ValueError(f"pretrained-weights file {path}: none of its {len(saved)} layers fits this model (layers "
                         f"{', '.join(list(saved)[:3])} ...; the model's {own_names} ...): give the weights of the "
                         "architecture the hyperparameter model names")
    model.load_weights(path, by_name=True, skip_mismatch=True)
    return loaded, left


def start_from_pretrained(model: keras.Model, choice: KerasChoice, rank: int) -> None:
    """Loads ``choice.pretrained_weights`` into ``model`` (``load_pretrained``; nothing without
    one); rank 0 logs what was loaded and what was left at its initial values.

    Raises:
        FileNotFoundError: the channel or file is missing (``contract.pretrained_weights_file``).
        ValueError: the file does not fit (``load_pretrained``).
    """
    if not choice.pretrained_weights:
        return
    path = contract.pretrained_weights_file(choice.pretrained_weights, WEIGHT_SUFFIXES)
    loaded, left = load_pretrained(model, path)
    if rank == 0:
        common.log.info("pretrained weights %s: %d layers loaded; left at their initial values: %s", path,
                        len(loaded), "; ".join(left) or "none")


def save(model: keras.Model, model_dir: str, described: dict) -> None:
    """Writes the SavedModel to ``<model_dir>/1`` (the TensorFlow Serving layout) atomically,
    with ``model.json`` (``described``: ``KerasChoice.describe``) beside it."""
    saved_model = os.path.join(model_dir, "1")
    common.atomic_write_tree(saved_model, lambda tmp: model.save(tmp, save_format="tf", include_optimizer=False))
    common.write_json(os.path.join(model_dir, "model.json"), described)
    common.log.info("saved %s", saved_model)


def training_loss(label_smoothing: float = 0.0, reduction: str = keras.losses.Reduction.AUTO) -> keras.losses.Loss:
    """The training loss of the TensorFlow trainers: cross-entropy of logits [N, K] (float) against
    integer labels [N] or [N, 1], per sample ([N], float) before ``reduction``.

    ``label_smoothing`` = e in [0, 1): the targets are 1 - e + e/K on the label and e/K elsewhere
    (Szegedy et al. 2016), Keras' ``categorical_crossentropy(label_smoothing=e)`` on the one-hot
    labels, which is ``torch.nn.functional.cross_entropy(label_smoothing=e)``'s formula, so
    ``label-smoothing`` means the same on every built-in trainer. 0: Keras' sparse cross-entropy.
    """
    if not label_smoothing:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    return SmoothedCrossentropy(label_smoothing, reduction=reduction)


class SmoothedCrossentropy(keras.losses.Loss):
    """Label-smoothed cross-entropy of logits against integer labels (``training_loss``)."""

    def __init__(self, label_smoothing: float, reduction: str = keras.losses.Reduction.AUTO,
                 name: str = "smoothed_crossentropy"):
        super().__init__(reduction=reduction, name=name)
        self.label_smoothing = label_smoothing

    def call(self, labels, logits):
        one_hot = tf.one_hot(tf.reshape(tf.cast(labels, tf.int32), [-1]), tf.shape(logits)[-1], dtype=logits.dtype)
        return keras.losses.categorical_crossentropy(one_hot, logits, from_logits=True,
                                                     label_smoothing=self.label_smoothing)

    def get_config(self) -> dict:
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


def sparse_metrics(logits, labels) -> tuple[float, float]:
    """(summed cross-entropy, correct predictions) of logits [N, K] against int labels [N]."""
    loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1, output_type=tf.int32) == tf.cast(labels, tf.int32),
                                    tf.float64))
    return float(tf.reduce_sum(loss)), float(correct)


def loss_scaled(optimizer, precision: str):
    """``optimizer`` for ``precision``: under fp16 wrapped in Keras' ``LossScaleOptimizer``
    (dynamic loss scaling, tf-keras' mixed-precision guide: the loss is multiplied by a scale
    that starts at 2**15, the gradients divided by it; a step whose gradients are not finite is
    skipped and halves the scale, 2000 finite steps in a row double it), else ``optimizer``.

    Give it the distributed optimizer (Horovod's ``DistributedOptimizer``), or build it under
    the mirrored strategy: the finiteness check then sees the all-reduced gradients, so an
    overflow on one rank makes every rank skip that step and halve its scale, and the ranks
    keep one scale and the same weights (tf-keras' ``LossScaleOptimizerV3.apply_gradients``
    aggregates before it checks; Horovod's ``DistributedOptimizer`` cannot wrap it instead).
    """
    return keras.mixed_precision.LossScaleOptimizer(optimizer) if precision == "fp16" else optimizer


def scaled_loss(optimizer, loss):
    """``loss`` times ``optimizer``'s loss scale when it is ``loss_scaled`` (for a custom step
    that takes its own gradients; Keras' ``train_step`` scales by itself), else ``loss``."""
    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        return optimizer.get_scaled_loss(loss)
    return loss


def unscaled_gradients(optimizer, gradients: list) -> list:
    """``gradients`` of a ``scaled_loss`` divided by the loss scale again (the same optimizer)."""
    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        return optimizer.get_unscaled_gradients(gradients)
    return gradients
