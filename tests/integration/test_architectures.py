"""The built-in trainers on an RGB ImageFolder channel of real photographs (dtc_train.photos) with
torchvision and keras.applications architectures (#19 item 2): Horovod, DDP and FSDP2 reach an accuracy, their ranks end
with identical weights (batch normalization's statistics included), the saved model is rebuilt
from model.json and scores the channel read with Pillow; weights come from a channel; the DALI
pipeline gives the model its input."""

import json
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

from dtc_local import job_tree
from dtc_train import dali_data, digits, torch_model
from dtc_train.channel import list_images
from helpers import (
    METRIC,
    REPO,
    RESUMING,
    checkpoint_position,
    final_digests,
    run_train,
)
from photos_checks import CLASSES, PHOTOS_JOB, check_photos_job, eval_input

pytestmark = pytest.mark.e2e


def _photos_job(tmp_path, photos_channels, hyperparameters: dict, channels=("training", "validation")):
    root = tmp_path / "opt" / "ml"
    job_tree.write(str(root), hyperparameters=hyperparameters, channels=channels)
    for channel in ("training", "validation"):
        shutil.copytree(photos_channels / channel, root / "input" / "data" / channel, dirs_exist_ok=True)
    return root


@pytest.mark.parametrize("backend, model, hyperparameters", [
    # Horovod with ShuffleNet V2: the README's make train and make cluster commands, in the image
    # (tests/cluster/test_photos.py)
    ("ddp", "shufflenet_v2_x1_0", {"sagemaker_torch_distributed_enabled": True}),
    ("fsdp", "shufflenet_v2_x1_0", {"sagemaker_torch_distributed_enabled": True, "data-parallel": "fsdp"}),
])
def test_a_torchvision_architecture_trains_on_rgb_photographs(photos_channels, tmp_path, backend, model,
                                                              hyperparameters):
    root = _photos_job(tmp_path, photos_channels, {
        "sagemaker_program": "builtin:pytorch", "sagemaker_mpi_num_of_processes_per_host": 2, "model": model,
        **PHOTOS_JOB, **hyperparameters})
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    check_photos_job(root, result.stdout + result.stderr, model, optimizer_in_checkpoint=backend != "fsdp")


def test_a_keras_architecture_trains_on_rgb_photographs(photos_channels, tmp_path):
    """builtin:tensorflow (MirroredStrategy, one host) with keras.applications' RegNetX002 (2.7 M
    parameters; MobileNetV2's batch normalization, momentum 0.999, kept its validation at chance
    in 240 steps, 2026-11-25): the tf.data input decodes, crops and normalizes as DALI does,
    augments with the same recipe, and the SavedModel, loaded back, scores the validation photos
    read with Pillow as the trainer reported. 5 epochs at twice the photo jobs' learning rate: on
    2026-12-07's machine 0.3417, 0.85, 0.9333, 0.8583, 0.975 in 74 core-seconds, where their 8
    epochs at 0.02 ended at 0.775 in 109."""
    root = _photos_job(tmp_path, photos_channels, {"sagemaker_program": "builtin:tensorflow", "model": "RegNetX002",
                                                   **PHOTOS_JOB, "epochs": 5, "learning-rate": 0.04})
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    epochs = [(int(e), float(acc), int(n)) for e, _, acc, n in METRIC.findall(result.stdout)]
    assert [e for e, _, _ in epochs] == list(range(1, 6)) and {n for _, _, n in epochs} == {120}, epochs
    # 3 classes (chance 0.33). With 8 epochs at 0.02: 0.80 and more on the machines before
    # 2026-11-26, 0.775 on that day's new machine (CPUs with AVX512-FP16, where oneDNN computes in
    # another order), at 82f5b6b too
    assert epochs[-1][1] >= 0.75, epochs
    assert ("learning rate 0.04 per rank x 1 ranks = 0.04, warmup over 30 steps from 0.04, then cosine decay to 0 "
            "at step 150") in result.output
    described = json.loads((root / "model" / "model.json").read_text())
    assert (described["model"], described["classes"], described["input_shape"]) == ("RegNetX002", CLASSES, [32, 32, 3])
    subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", KERAS_SCORE, str(root)], check=True, timeout=300)


# Loads the SavedModel and scores the validation channel read with Pillow (dtc_train.image_folder,
# the spec rebuilt from model.json); the accuracy must be the one the trainer reported last.
KERAS_SCORE = """
import json, sys
from pathlib import Path
from dtc_train import tf_env
import numpy as np, tensorflow as tf
from dtc_train import channel, image_folder, tf_model
root = Path(sys.argv[1])
described = json.loads((root / "model" / "model.json").read_text())
spec = tf_model.KerasChoice.from_args(described["model"], described["input_shape"][0], "off").images
images, labels = image_folder.read(channel.list_images(str(root / "input" / "data" / "validation")), spec)
model = tf.saved_model.load(str(root / "model" / "1"))
serve = model.signatures["serving_default"]
logits = serve(**{next(iter(serve.structured_input_signature[1])): tf.constant(images)})
predicted = np.argmax(next(iter(logits.values())).numpy(), 1)
accuracy = float((predicted == labels).mean())
assert abs(accuracy - described["val_accuracy"]) < 1e-9, (accuracy, described["val_accuracy"])
"""


def test_training_starts_from_weights_in_a_channel(photos_channels, tmp_path):
    root = _photos_job(tmp_path, photos_channels, {
        "sagemaker_program": "builtin:pytorch", "model": "resnet18", "pretrained-weights": "weights",
        "image-size": 32, "epochs": 1, "learning-rate": 1e-12}, channels=("training", "validation", "weights"))
    torch.manual_seed(5)
    imagenet_shaped = torch_model.ModelChoice.from_args("resnet18", 32, "auto", None).build(1000).state_dict()
    torch.save(imagenet_shaped, root / "input" / "data" / "weights" / "resnet18-imagenet.pth")
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    assert ("resnet18-imagenet.pth: 120 tensors loaded; left at their initial values: fc.weight [3, 512] "
            "(file: [1000, 512]); fc.bias [3] (file: [1000])") in result.output
    trained = torch.load(root / "model" / "model.pth", weights_only=True)
    # a learning rate of 1e-12 leaves the loaded parameters where they were; the running
    # statistics of batch normalization moved with the photos' batches
    parameters = {name for name, _ in torch_model.ModelChoice.from_args("resnet18", 32, "auto", None).build(3)
                  .named_parameters()} - {"fc.weight", "fc.bias"}
    assert all(torch.allclose(trained[k], imagenet_shaped[k], atol=1e-6) for k in parameters)
    assert not torch.equal(trained["bn1.running_mean"], imagenet_shaped["bn1.running_mean"])
    assert trained["fc.weight"].shape == (3, 512)


# Writes Keras weights of the model argv[2] (input size argv[3], "" for digits) with a 1000-class head
# (ImageNet's) to argv[1]
KERAS_WEIGHTS = """
import sys
from dtc_train import tf_env
import tensorflow as tf
from dtc_train import tf_model
tf.keras.utils.set_random_seed(5)
model, size = sys.argv[2], int(sys.argv[3]) if sys.argv[3] else None
tf_model.KerasChoice.from_args(model, size, "auto").build(1000).save_weights(sys.argv[1])
"""
# Compares the SavedModel argv[1] with the weights file argv[2], their variables paired in name
# order (the parameter server saves the chief's copy, whose layers are numbered after the trained
# model's: conv2d_2 for conv2d): only the head's shapes differ (argv[3], JSON), and every other
# variable is where the file had it (learning rate 1e-12) but batch normalization's moving
# statistics, of which the means moved
KERAS_COMPARE = """
import json, sys
from dtc_train import tf_env
import h5py, numpy as np, tensorflow as tf
trained = sorted(tf.saved_model.load(sys.argv[1]).variables, key=lambda v: v.name)
with h5py.File(sys.argv[2]) as handle:
    weights = {}
    handle.visititems(lambda name, item: weights.__setitem__(name.split("/", 1)[1], item[()])
                      if isinstance(item, h5py.Dataset) else None)
assert len(trained) == len(weights), (len(trained), len(weights))
pairs = [(v.name, v.numpy(), name, weights[name]) for v, name in zip(trained, sorted(weights))]
assert [list(a.shape) for _, a, _, w in pairs if a.shape != w.shape] == json.loads(sys.argv[3])
kept = [(n, a, w) for n, a, _, w in pairs if a.shape == w.shape and "moving_" not in n]
moved = [n for n, a, w in kept if not np.allclose(a, w, atol=1e-6)]
assert not moved, moved[:5]
means = [(a, w) for n, a, _, w in pairs if "moving_mean" in n]
assert not means or any(not np.array_equal(a, w) for a, w in means)
print(len(kept))
"""


def _keras_weights(path, model: str, size: int | None) -> None:
    subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", KERAS_WEIGHTS, str(path), model, str(size or "")],
                   check=True, timeout=300)


def _kept_variables(saved_model, weights, head_shapes: list) -> int:
    """KERAS_COMPARE's checks; returns how many variables stayed where the file had them."""
    done = subprocess.run([str(REPO / ".venv" / "bin" / "python"), "-c", KERAS_COMPARE, str(saved_model),
                           str(weights), json.dumps(head_shapes)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stdout.split()[-1])


def test_keras_training_starts_from_weights_in_a_channel(photos_channels, tmp_path):
    """A keras.applications architecture under MirroredStrategy (one host) from weights with an
    ImageNet-sized head."""
    root = _photos_job(tmp_path, photos_channels, {
        "sagemaker_program": "builtin:tensorflow", "model": "RegNetX002", "pretrained-weights": "weights",
        "image-size": 32, "epochs": 1, "learning-rate": 1e-12}, channels=("training", "validation", "weights"))
    weights = root / "input" / "data" / "weights" / "regnetx002-imagenet.h5"
    _keras_weights(weights, "RegNetX002", 32)
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    # keras.applications' RegNets name their layers after a per-process counter ("1head_dense"): the
    # weights were written by a process that built one RegNet, as the trainer does
    loaded = re.search(r"regnetx002-imagenet\.h5: 88 layers loaded; left at their initial values: 1head_dense "
                       r"\[\(368, 3\), \(3,\)\] \(file: \[\(368, 1000\), \(1000,\)\]\)$", result.output, re.M)
    assert loaded, result.output[-3000:]
    assert _kept_variables(root / "model" / "1", weights, [[3], [368, 3]]) > 100


@pytest.mark.parametrize("strategy", [
    # the coordinator assigns the variables on the parameter servers
    {"sagemaker_parameter_server_enabled": True},
    # every rank loads; rank 0's weights are broadcast
    {"sagemaker_mpi_enabled": True, "sagemaker_mpi_num_of_processes_per_host": 2},
])
def test_the_other_tensorflow_backends_start_from_weights_in_a_channel(tmp_path, strategy):
    """The digits CNN from weights with a 1000-class head: after one epoch at learning rate 1e-12
    the SavedModel holds the file's weights but the head's, which has 10 outputs."""
    root = tmp_path / "opt" / "ml"
    job_tree.write(str(root), hyperparameters={
        "sagemaker_program": "builtin:tensorflow", "pretrained-weights": "weights", "epochs": 1,
        "learning-rate": 1e-12, **strategy}, channels=("training", "validation", "weights"))
    digits.export(str(root / "input" / "data"))
    weights = root / "input" / "data" / "weights" / "digits.h5"
    _keras_weights(weights, "digits", None)
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    assert ("digits.h5: 3 layers loaded; left at their initial values: dense_1 [(128, 10), (10,)] (file: "
            "[(128, 1000), (1000,)])") in result.output
    assert _kept_variables(root / "model" / "1", weights, [[10], [128, 10]]) == 6


def test_keras_weights_of_another_architecture_are_refused(photos_channels, tmp_path):
    root = _photos_job(tmp_path, photos_channels, {
        "sagemaker_program": "builtin:tensorflow", "pretrained-weights": "weights", "epochs": 1},
        channels=("training", "validation", "weights"))
    _keras_weights(root / "input" / "data" / "weights" / "regnet.h5", "RegNetX002", 32)
    result = run_train(root)
    assert result.returncode != 0
    first_line = result.failure.splitlines()[0]
    assert re.fullmatch(r"ValueError: pretrained-weights file \S+/regnet\.h5: none of its 144 layers fits this model .*"
                        r"give the weights of the architecture the hyperparameter model names", first_line), \
        result.failure


def test_a_validation_class_the_training_channel_lacks_is_named(photos_channels, tmp_path):
    root = _photos_job(tmp_path, photos_channels, {"sagemaker_program": "builtin:pytorch", "model": "resnet18"})
    (root / "input" / "data" / "validation" / "zebra").mkdir()
    shutil.copy(photos_channels / "validation" / "china" / "0000.jpg", root / "input" / "data" / "validation" / "zebra")
    result = run_train(root)
    assert result.returncode != 0
    assert result.failure.splitlines()[0].endswith(
        "channel 'validation' has class folders ['zebra'] that channel 'training' lacks: labels follow the training "
        "channel's class folders (3: china, flower, grace_hopper); give both channels the same class folders"), \
        result.failure


def test_the_pipeline_gives_the_model_its_input(photos_channels):
    """DALI's evaluation path equals Pillow's resize, centre crop and normalisation within
    resampling differences; the training path (random resized crop, flip) has the same shape and
    changes from epoch to epoch."""
    spec = torch_model.ModelChoice.from_args("resnet18", 32, "auto", None).images
    listing = list_images(str(photos_channels / "validation"))
    decoding = dali_data.Decoding(None, "CHW", spec)
    evaluation = dali_data.evaluation_pipeline(listing, 8, decoding)
    images, labels = (np.array(out.as_tensor()) for out in evaluation.run())
    assert images.shape == (8, 3, 32, 32) and images.dtype == np.float32
    assert labels.ravel().tolist() == list(listing.labels[:8])
    reference = np.stack([eval_input(photos_channels / "validation" / f, spec) for f in listing.files[:8]])
    assert np.abs(images - reference).mean() < 0.01, np.abs(images - reference).mean()   # 0.01 std: 0.6 pixel levels
    order = dali_data.ReadOrder(len(listing), 8, 0, 1, 1, seed=1)
    training = dali_data.training_pipeline(listing, 8, decoding, order, seed=1)
    first = np.array(training.run()[0].as_tensor())
    assert first.shape == (8, 3, 32, 32)
    assert not np.allclose(first, images)


def test_per_rank_batch_normalization_statistics_resume_mid_epoch_exactly(photos_channels, tmp_path):
    """Horovod leaves batch normalization's running statistics per rank within an epoch: a job
    whose rank died mid-epoch resumes from the checkpoint before it (each rank's own statistics and
    data position restored) and ends with the weights of an uninterrupted job."""
    hyperparameters = {"sagemaker_program": "builtin:pytorch", "sagemaker_mpi_enabled": True,
                       "sagemaker_mpi_num_of_processes_per_host": 2, "sagemaker_mpi_custom_mpi_options": "",
                       "model": "shufflenet_v2_x1_0", **PHOTOS_JOB, "epochs": 2, "checkpoint-every": "5steps"}
    uninterrupted = run_train(_photos_job(tmp_path / "whole", photos_channels, hyperparameters))
    assert uninterrupted.returncode == 0, uninterrupted.output[-4000:]
    root = _photos_job(tmp_path / "resumed", photos_channels, hyperparameters)
    died = run_train(root, env={"DTC_FAULT": "rank=1 step=8 exit=3"})
    assert died.returncode != 0
    assert checkpoint_position(root) == (0, 5)
    resumed = run_train(root)
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert [int(v) for v in RESUMING.search(resumed.output).groups()] == [0, 5]
    assert final_digests(resumed.stdout, 2) == final_digests(uninterrupted.stdout, 2)
    assert len(set(final_digests(resumed.stdout, 2).values())) == 1
