"""TensorFlow MultiWorkerMirroredStrategy with a custom training loop (`strategy.run`) on SageMaker.

Run with SageMaker's `distribution={"multi_worker_mirrored_strategy": {"enabled": True}}`: the
image starts this script once per host with TF_CONFIG naming every host as a worker (the first
one is the chief). Every worker holds a replica of the model; each step, each replica takes its
part of the global batch and the gradients are all-reduced (collective ops over gRPC).

Every worker lists the channel's files, takes its shard of them (`distribute_datasets_from_function`:
one input pipeline per worker) and reads and decodes only those as it trains (`tf.data` from
file names), so a channel larger than a host's memory trains too.

What it reads (SageMaker's training environment):
  TF_CONFIG                                  set by the image: the workers and this one's index
  SM_CHANNEL_TRAINING, SM_CHANNEL_VALIDATION  image folders: <channel>/<class>/<image>.png
  SM_MODEL_DIR                               the chief's SavedModel goes to <model dir>/1
  /opt/ml/checkpoints                        synced with checkpoint_s3_uri: a restarted job resumes
Hyperparameters arrive as `--name value` arguments; SageMaker's TensorFlow estimator also passes
`--model_dir`, which this script accepts and ignores.

Checkpoints (tf.train.Checkpoint: weights, optimizer state and the epoch) are written by every
worker, as MultiWorkerMirroredStrategy requires; only the chief's copy is kept.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import tensorflow as tf

CHECKPOINT_DIR = "/opt/ml/checkpoints"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--lr", type=float, default=0.01, help="for one replica; scaled by their number")
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


def main():
    args = parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "worker", "index": 0})
    is_chief = task["index"] == 0
    tf.keras.utils.set_random_seed(args.seed)

    classes = class_folders(channel_dir(args.train, "training"))
    train_files, train_labels = list_image_folder(args.train, classes)
    val_files, val_labels = list_image_folder(channel_dir(args.validation, "validation"), classes)
    decode = decoder(args.image_size)
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    steps = len(train_files) // global_batch

    def dataset_fn(context):   # this worker's pipeline: its shard of the files, decoded as it trains
        return (tf.data.Dataset.from_tensor_slices((train_files, train_labels))
                .shard(context.num_input_pipelines, context.input_pipeline_id)
                .shuffle(len(train_files), seed=args.seed, reshuffle_each_iteration=True).repeat()
                .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
                .batch(context.get_per_replica_batch_size(global_batch), drop_remainder=True).prefetch(2))

    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    validation = tf.data.Dataset.from_tensor_slices((val_files, val_labels)).map(decode).batch(256)

    with strategy.scope():
        model = build_model(len(classes), args.image_size)
        optimizer = tf.keras.optimizers.SGD(args.lr * strategy.num_replicas_in_sync, momentum=0.9)
        epoch = tf.Variable(0, dtype=tf.int64, trainable=False)   # epochs done
        loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
    # the chief writes to the checkpoint directory, the other workers to a directory of their own
    # outside it (SageMaker uploads what appears in /opt/ml/checkpoints), which they delete
    write_dir = args.checkpoint_dir if is_chief else tempfile.mkdtemp(prefix=f"checkpoint-worker-{task['index']}-")
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=1)
    latest = tf.train.latest_checkpoint(args.checkpoint_dir)
    if latest:
        checkpoint.restore(latest)
        print(f"resuming from {latest}: epoch {int(epoch.numpy())} done", flush=True)

    @tf.function
    def train_step(iterator):
        def step(images, labels):
            with tf.GradientTape() as tape:
                per_example = loss_fn(labels, model(images, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step, args=next(iterator)), axis=None)

    # skip the batches of the epochs already done, so a resumed job sees the data it would have seen
    for _ in range(int(epoch.numpy()) * steps):
        next(iterator)
    while int(epoch.numpy()) < args.epochs:
        for _ in range(steps):
            loss = train_step(iterator)
        epoch.assign_add(1)
        accuracy = np.mean(np.concatenate([np.argmax(model(images, training=False), axis=1) == labels
                                           for images, labels in validation.as_numpy_iterator()]))
        if is_chief:
            print(f"epoch={int(epoch.numpy())}/{args.epochs} loss={float(loss):.4f} val_accuracy={accuracy:.4f}",
                  flush=True)
        manager.save()   # every worker saves (a collective); only the chief's directory is kept
        if not is_chief:
            shutil.rmtree(write_dir, ignore_errors=True)

    weights = b"".join(w.tobytes() for w in model.get_weights())
    print(f"rank={task['index']} world_size={strategy.num_replicas_in_sync} "
          f"weights_sha256={hashlib.sha256(weights).hexdigest()}", flush=True)
    # every worker saves (a collective as well); the chief's copy goes to the model directory
    saved = os.path.join(args.model_dir, "1") if is_chief else tempfile.mkdtemp(prefix=f"model-worker-{task['index']}-")
    model.save(saved, save_format="tf")
    if not is_chief:
        shutil.rmtree(saved, ignore_errors=True)


if __name__ == "__main__":
    main()
