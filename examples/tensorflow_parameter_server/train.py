"""TensorFlow 2 ParameterServerStrategy with a ClusterCoordinator on SageMaker.

Run with SageMaker's `distribution={"parameter_server": {"enabled": True}}`: the image writes a
TF2 TF_CONFIG (the first host is the `chief`, every other host a `worker`, every host a `ps`),
starts TensorFlow servers for the workers and parameter servers, and runs this script on the
chief only. The chief is the coordinator: it holds no data of its own, creates the variables on
the parameter servers, and schedules training steps on the workers, which run them
asynchronously.

What it reads (SageMaker's training environment):
  TF_CONFIG                                  set by the image (task type `chief` here)
  SM_CHANNEL_TRAINING, SM_CHANNEL_VALIDATION  image folders: <channel>/<class>/<image>.png; the
                                             chief lists the training files, and each worker reads
                                             and decodes them from its own host's copy of the
                                             channel (FullyReplicated: the same paths on every
                                             host); the chief reads the validation images
  SM_MODEL_DIR                               the SavedModel goes to <model dir>/1
  /opt/ml/checkpoints                        synced with checkpoint_s3_uri: a restarted job resumes
Hyperparameters arrive as `--name value` arguments; SageMaker's TensorFlow estimator also passes
`--model_dir`, which this script accepts and ignores.

The variables live on the parameter servers, and TensorFlow's own savers would have each
parameter server write its part on its own host. So the chief reads their values and writes the
checkpoint (one .npz: weights, optimizer state, epoch) and the model (a local copy) itself.
"""

import argparse
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf
from PIL import Image

CHECKPOINT_DIR = "/opt/ml/checkpoints"


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32, help="per step (one worker's batch)")
    parser.add_argument("--lr", type=float, default=0.02)
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


def channel_dir(path, name):
    """The channel's directory; a missing or empty channel ends the job with a sentence naming it."""
    if not path or not os.path.isdir(path):
        sys.exit(f"channel '{name}' is missing (SM_CHANNEL_{name.upper()} is not set or not a directory): "
                 f"pass it to fit(), e.g. fit({{'{name}': 's3://<bucket>/<prefix>/{name}'}})")
    if not any(os.path.isdir(os.path.join(path, d)) for d in os.listdir(path)):
        sys.exit(f"channel '{name}' ({path}) holds no class folders: it must hold <class>/<image> files")
    return path


def list_image_folder(root, classes):
    """The files under root/<class>/ and their int64 labels: names only, nothing decoded."""
    files, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted(os.listdir(os.path.join(root, name))):
            files.append(os.path.join(root, name, file))
            labels.append(label)
    return files, np.array(labels)


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
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    tf.keras.utils.set_random_seed(args.seed)

    root = channel_dir(args.train, "training")
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
    files, labels = list_image_folder(root, classes)
    x_val, y_val, _ = load_image_folder(channel_dir(args.validation, "validation"), args.image_size, classes)
    steps = len(files) // args.batch_size
    size = args.image_size

    def dataset_fn():   # runs on each worker: its own shuffled stream of batches, decoded there
        def decode(path, label):   # grayscale in [0, 1], resized bilinearly
            image = tf.io.decode_image(tf.io.read_file(path), channels=1, dtype=tf.float32, expand_animations=False)
            return tf.image.resize(image, (size, size), antialias=True), label
        return (tf.data.Dataset.from_tensor_slices((files, labels)).shuffle(len(files)).repeat()
                .map(decode, num_parallel_calls=tf.data.AUTOTUNE)
                .batch(args.batch_size, drop_remainder=True).prefetch(2))

    with strategy.scope():   # the variables live on the parameter servers
        model = build_model(len(classes), args.image_size)
        optimizer = tf.keras.optimizers.SGD(args.lr, momentum=0.9)
        optimizer.build(model.trainable_variables)   # its variables exist before a checkpoint is restored
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    checkpoint = os.path.join(args.checkpoint_dir, "checkpoint.npz")
    epoch = 0   # epochs done
    if os.path.exists(checkpoint):
        with np.load(checkpoint) as saved:
            epoch = int(saved["epoch"])
            model.set_weights([saved[f"model_{i}"] for i in range(len(model.weights))])
            for i, variable in enumerate(optimizer.variables):
                variable.assign(saved[f"optimizer_{i}"])
        print(f"resuming from {checkpoint}: epoch {epoch} done", flush=True)

    @tf.function
    def train_step(iterator):
        def step(images, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(labels, model(images, training=True)))   # this worker's batch
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
            return loss
        return strategy.run(step, args=next(iterator))

    local = build_model(len(classes), args.image_size)   # the chief's own copy: validation and saving
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    while epoch < args.epochs:
        losses = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(steps)]
        coordinator.join()   # every step scheduled for this epoch is done
        epoch += 1
        local.set_weights(model.get_weights())
        accuracy = np.mean(np.argmax(local.predict(x_val, verbose=0), axis=1) == y_val)
        print(f"epoch={epoch}/{args.epochs} loss={float(losses[-1].fetch()):.4f} val_accuracy={accuracy:.4f}",
              flush=True)
        arrays = {"epoch": np.asarray(epoch), **{f"model_{i}": w for i, w in enumerate(model.get_weights())},
                  **{f"optimizer_{i}": v.numpy() for i, v in enumerate(optimizer.variables)}}
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=args.checkpoint_dir, suffix=".npz", delete=False) as handle:
            np.savez(handle, **arrays)
        os.replace(handle.name, checkpoint)   # a job stopped mid-write keeps the last checkpoint

    local.set_weights(model.get_weights())
    local.save(os.path.join(args.model_dir, "1"), save_format="tf")


if __name__ == "__main__":
    main()
