"""Horovod + Keras (tf.keras, Keras 2 API): data-parallel image classification on SageMaker.

Run with `mpirun` (SageMaker's `distribution={"mpi": {"enabled": True, "processes_per_host": N}}`):
every rank fits a copy of the model on its shard of the training channel, Horovod's
DistributedOptimizer averages the gradients, and rank 0 writes checkpoints and the model.

The image sets TF_USE_LEGACY_KERAS=1, so `tf.keras` is tf-keras (Keras 2), which Horovod's
Keras API supports.

Every rank lists the channel's files and reads and decodes only its own shard, as it trains
(`tf.data` from file names), so a channel larger than a host's memory trains too.

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
import sys

import horovod.tensorflow as hvd_core  # broadcast_object, broadcast_variables, allreduce: Horovod's core TF API
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

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


def channel_dir(path, name):
    """The channel's directory; a missing or empty channel ends the job with a sentence naming it."""
    if not path or not os.path.isdir(path):
        sys.exit(f"channel '{name}' is missing (SM_CHANNEL_{name.upper()} is not set or not a directory): "
                 f"pass it to fit(), e.g. fit({{'{name}': 's3://<bucket>/<prefix>/{name}'}})")
    if not class_folders(path):
        sys.exit(f"channel '{name}' ({path}) holds no class folders: it must hold <class>/<image> files")
    return path


def class_folders(root):
    return sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))


def list_image_folder(root, classes):
    """The files under root/<class>/ and their int64 labels: names only, nothing decoded."""
    files, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(root, name))):
            files.append(os.path.join(root, name, file))
            labels.append(label)
    return np.array(files), np.array(labels)


def decoder(image_size):
    """A tf.data map function: (path, label) -> ((S, S, 1) float32 image in [0, 1], label), the
    image read, made grayscale and resized bilinearly when the pipeline reaches it."""
    def decode(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=1, dtype=tf.float32, expand_animations=False)
        return tf.image.resize(image, (image_size, image_size), antialias=True), label
    return decode


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

    classes = class_folders(channel_dir(args.train, "training"))
    train_files, train_labels = list_image_folder(args.train, classes)
    val_files, val_labels = list_image_folder(channel_dir(args.validation, "validation"), classes)
    steps = len(train_files) // hvd.size() // args.batch_size   # the same on every rank: the smallest shard's
    shard = slice(hvd.rank(), None, hvd.size())   # this rank's files
    train_files, train_labels, val_files, val_labels = (train_files[shard], train_labels[shard], val_files[shard],
                                                        val_labels[shard])

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

    decode = decoder(args.image_size)
    dataset = (tf.data.Dataset.from_tensor_slices((train_files, train_labels)).shuffle(len(train_files), seed=args.seed)
               .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
               .batch(args.batch_size, drop_remainder=True).repeat().prefetch(2))
    validation = tf.data.Dataset.from_tensor_slices((val_files, val_labels)).map(decode).batch(256)
    callbacks = [hvd.callbacks.MetricAverageCallback()]   # epoch metrics averaged over the ranks
    if hvd.rank() == 0:
        callbacks += [PrintMetrics(args.epochs), Checkpoint(args.checkpoint_dir)]
    model.fit(dataset, steps_per_epoch=steps, epochs=args.epochs, initial_epoch=initial_epoch,
              validation_data=validation, callbacks=callbacks, verbose=0)

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
