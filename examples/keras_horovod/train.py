"""Horovod + Keras (tf.keras, Keras 2 API): data-parallel image classification on SageMaker.

Run with `mpirun` (SageMaker's `distribution={"mpi": {"enabled": True, "processes_per_host": N}}`):
every rank fits a copy of the model on its shard of the training channel, Horovod's
DistributedOptimizer averages the gradients, and rank 0 writes checkpoints and the model.

The image sets TF_USE_LEGACY_KERAS=1, so `tf.keras` is tf-keras (Keras 2), which Horovod's
Keras API supports.

What it reads (SageMaker's training environment):
  SM_CHANNEL_TRAINING, SM_CHANNEL_VALIDATION  image folders: <channel>/<class>/<image>.png
  SM_MODEL_DIR                               the SavedModel goes to <model dir>/1 (TF Serving layout)
  /opt/ml/checkpoints                        synced with checkpoint_s3_uri: a restarted job resumes
Hyperparameters arrive as `--name value` arguments; SageMaker's TensorFlow estimator also passes
`--model_dir` (an S3 path), which this script accepts and ignores.

A resumed job restores the weights of the last finished epoch; the optimizer's momentum starts
again from zero on every rank (so the ranks stay identical).
"""

import argparse
import hashlib
import json
import os

import horovod.tensorflow as hvd_core  # broadcast_object, broadcast_variables, allreduce: Horovod's core TF API
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from PIL import Image

CHECKPOINT_DIR = "/opt/ml/checkpoints"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.01, help="for one rank; scaled by the world size")
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train", default=os.environ.get("SM_CHANNEL_TRAINING"))
    parser.add_argument("--validation", default=os.environ.get("SM_CHANNEL_VALIDATION"))
    parser.add_argument("--model-dir", default=os.environ.get("SM_MODEL_DIR", "/opt/ml/model"))
    parser.add_argument("--model_dir", dest="estimator_model_dir", help="passed by the TensorFlow estimator")
    parser.add_argument("--checkpoint-dir", default=CHECKPOINT_DIR)
    return parser.parse_args()


def load_image_folder(root, image_size, classes=None):
    """All images under root/<class>/ as (N, S, S, 1) float32 in [0, 1] and (N,) int64 labels."""
    classes = classes or sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    images, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(root, name))):
            with Image.open(os.path.join(root, name, file)) as image:
                pixels = image.convert("L").resize((image_size, image_size), Image.BILINEAR)
            images.append(np.asarray(pixels, dtype=np.float32) / 255.0)
            labels.append(label)
    return np.stack(images)[..., None], np.array(labels), classes


def build_model(classes, image_size):
    return tf.keras.Sequential([
        tf.keras.layers.Conv2D(16, 3, padding="same", activation="relu", input_shape=(image_size, image_size, 1)),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(classes),
    ])


class PrintMetrics(tf.keras.callbacks.Callback):
    """Rank 0 prints one line as each epoch ends (for an estimator's metric_definitions): after
    MetricAverageCallback, so the figures are every rank's average."""

    def __init__(self, epochs):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        print(f"epoch={epoch + 1}/{self.epochs} loss={logs.get('loss', float('nan')):.4f} "
              f"val_accuracy={logs.get('val_accuracy', float('nan')):.4f}", flush=True)


class Checkpoint(tf.keras.callbacks.Callback):
    """Rank 0 writes the weights and the epoch after every epoch (temporary file, then rename)."""

    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def on_epoch_end(self, epoch, logs=None):
        os.makedirs(self.directory, exist_ok=True)
        self.model.save_weights(os.path.join(self.directory, "checkpoint.tmp.h5"))   # HDF5 (the .h5 suffix)
        os.replace(os.path.join(self.directory, "checkpoint.tmp.h5"), os.path.join(self.directory, "checkpoint.h5"))
        with open(os.path.join(self.directory, "checkpoint.json.tmp"), "w") as f:
            json.dump({"epoch": epoch + 1}, f)
        os.replace(os.path.join(self.directory, "checkpoint.json.tmp"), os.path.join(self.directory, "checkpoint.json"))


def main():
    args = parse_args()
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:   # one GPU per rank
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    tf.keras.utils.set_random_seed(args.seed)

    x_train, y_train, classes = load_image_folder(args.train, args.image_size)
    x_val, y_val, _ = load_image_folder(args.validation, args.image_size, classes)
    steps = len(x_train) // hvd.size() // args.batch_size   # the same on every rank: the smallest shard's
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]   # this rank's shard
    x_val, y_val = x_val[hvd.rank()::hvd.size()], y_val[hvd.rank()::hvd.size()]

    model = build_model(len(classes), args.image_size)
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9))
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    state = os.path.join(args.checkpoint_dir, "checkpoint.json")
    initial_epoch = 0
    if hvd.rank() == 0 and os.path.exists(state):
        with open(state) as f:
            initial_epoch = json.load(f)["epoch"]
        model.load_weights(os.path.join(args.checkpoint_dir, "checkpoint.h5"))
        print(f"resuming from {args.checkpoint_dir}: epoch {initial_epoch} done", flush=True)
    initial_epoch = hvd_core.broadcast_object(initial_epoch, root_rank=0)
    hvd_core.broadcast_variables(model.variables, root_rank=0)   # rank 0's weights, before the first step

    dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
               .shuffle(len(x_train), seed=args.seed).batch(args.batch_size, drop_remainder=True).repeat())
    callbacks = [hvd.callbacks.MetricAverageCallback()]   # epoch metrics averaged over the ranks
    if hvd.rank() == 0:
        callbacks += [PrintMetrics(args.epochs), Checkpoint(args.checkpoint_dir)]
    model.fit(dataset, steps_per_epoch=steps, epochs=args.epochs, initial_epoch=initial_epoch,
              validation_data=(x_val, y_val), callbacks=callbacks, verbose=0)

    weights = b"".join(w.tobytes() for w in model.get_weights())
    print(f"rank={hvd.rank()} world_size={hvd.size()} weights_sha256={hashlib.sha256(weights).hexdigest()}", flush=True)
    if hvd.rank() == 0:
        model.save(os.path.join(args.model_dir, "1"), save_format="tf")   # SavedModel for TF Serving
    # every rank waits until rank 0 has saved (some launchers stop all hosts when one exits): an
    # all-reduce returns once every rank has called it. Not hvd.join(): a GPU build of Horovod
    # registers its TensorFlow join op for GPUs only, and it fails where the process has none.
    with tf.device("/CPU:0"):
        hvd_core.allreduce(tf.constant(0.0), name="saved")


if __name__ == "__main__":
    main()
