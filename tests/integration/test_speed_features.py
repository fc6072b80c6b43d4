"""Speed and regularisation features of the PyTorch trainers, and gradient accumulation of the
TensorFlow Horovod, mirrored and parameter-server trainers (#19 item 3), each shown to change what it claims: gradient
accumulation takes a k times larger batch's step with one reduction per step, Horovod's fp16
allreduce compression averages float16 values, label smoothing computes the smoothed
cross-entropy. (precision: test_precision.py; the learning-rate schedule:
tests/unit/test_lr_schedule.py and the rate of the last step in test_architectures.py.)"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from dtc_train import torch_common, torch_model
from helpers import BIN, PROGRAMS, STRATEGIES, digits_job, json_objects, read_json, run_train

RANKS = 2


@pytest.mark.parametrize("backend", ["ddp", "fsdp", "horovod"])
def test_gradient_accumulation_takes_the_larger_batchs_step_with_one_reduction_per_step(backend, tmp_path):
    """gradient-accumulation-steps=4 on batches of 8 against batches of 32 holding the same
    samples (tests/programs/gradient_accumulation.py): equal weights after 3 steps, the gradients
    reduced over the ranks once per step and not before a step's last batch."""
    if backend == "horovod":
        launcher = [str(BIN / "mpirun"), "-np", str(RANKS), "--host", f"localhost:{RANKS}", sys.executable]
    else:
        launcher = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(RANKS)]
    done = subprocess.run([*launcher, str(PROGRAMS / "gradient_accumulation.py"), backend], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["world_size"] == RANKS
    assert result["max_weight_change"] > 1e-3, result                 # the weights moved: 0 below means something
    assert result["max_weight_difference"] <= 1e-6, result            # float32 rounding of two summation orders
    assert result["local_until_last"], result
    per_step = result["reductions_per_step"]
    if backend != "fsdp":   # (FSDP2's reduce-scatters are not counted: local_until_last covers them)
        assert per_step["4"] == per_step["1"] >= 1, result            # not 4 times as many


def test_tensorflow_horovod_gradient_accumulation_takes_the_larger_batchs_step_with_one_allreduce_per_step(
        tmp_path):
    """builtin:tensorflow under mpi: gradient-accumulation-steps=4 on batches of 8 (Horovod's
    backward_passes_per_step through the trainer's KerasSteps) against batches of 32 holding the
    same samples (tests/programs/tf_gradient_accumulation.py): equal weights after 3 steps, and
    Horovod's timeline shows one allreduce per gradient tensor per step in both runs (4 per step
    in the accumulating run would be per micro-batch)."""
    timeline = tmp_path / "timeline.json"
    argv = [str(BIN / "mpirun"), "-np", str(RANKS), "--host", f"localhost:{RANKS}", "-x", "HOROVOD_TIMELINE",
            sys.executable, str(PROGRAMS / "tf_gradient_accumulation.py"), "horovod"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL,
                          env={**os.environ, "HOROVOD_TIMELINE": str(timeline)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    results = json_objects(done.stdout)
    assert sorted(r["rank"] for r in results) == list(range(RANKS)), done.stdout
    for result in results:
        assert result["max_weight_change"] > 1e-3, result
        assert result["max_weight_difference"] <= 1e-6, result
        assert result["samples"] == [96.0, 96.0], result    # 3 steps of 32 samples each way
    # the digits network's 8 gradient tensors (4 layers' kernels and biases), 3 steps, 2 runs
    assert timeline.read_text().count('"name": "ALLREDUCE"') == 8 * 3 * 2


def test_mirrored_gradient_accumulation_takes_the_larger_batchs_step_applying_once_per_step(tmp_path):
    """builtin:tensorflow under a mirrored strategy (tensorflow_mwms.accumulating_train_functions),
    2 logical CPU replicas: 3 steps of 4 global batches of 8 end with the weights of 3 steps of
    global batches of 32 holding the same samples, every sample counted, and the weights move
    only on a step's last batch (the strategy all-reduces the gradients in apply_gradients, which
    only that batch's function calls)."""
    done = subprocess.run([sys.executable, str(PROGRAMS / "tf_gradient_accumulation.py"), "mirrored"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    [result] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert result["world_size"] == 2
    assert result["max_weight_change"] > 1e-3, result
    assert result["max_weight_difference"] <= 1e-6, result
    assert result["samples"] == [96.0, 96.0], result
    assert result["moved_only_on_last_batch"] is True, result


# The largest difference between the variables of two SavedModels (argv[1], argv[2]) paired in
# name order, and the largest variable, as JSON
SAVED_MODELS_COMPARE = """
import json, sys
from dtc_train import tf_env
import numpy as np, tensorflow as tf
a, b = (sorted(tf.saved_model.load(path).variables, key=lambda v: v.name) for path in sys.argv[1:3])
assert [v.name for v in a] == [v.name for v in b] and a
print(json.dumps({"max_difference": max(float(np.abs(x.numpy() - y.numpy()).max()) for x, y in zip(a, b)),
                  "max_weight": max(float(np.abs(x.numpy()).max()) for x in a)}))
"""


def test_parameter_server_gradient_accumulation_takes_the_larger_batchs_step(digits_channels, tmp_path):
    """builtin:tensorflow with the parameter server and one worker (which runs the scheduled steps
    in order): an epoch of steps of 2 batches of 16 (gradient-accumulation-steps=2, both on the
    step's worker, applied once) ends with the weights of an epoch of batches of 32 holding the
    same samples (one seeded stream, batched in order), with the same step count and samples."""
    saved, logs = [], []
    for name, batch_size, micro_batches in (("whole", 32, 1), ("accumulated", 16, 2)):
        root = digits_job(tmp_path / name, digits_channels, {
            **STRATEGIES["parameter-server"].hyperparameters(), "epochs": 1, "batch-size": batch_size,
            "gradient-accumulation-steps": micro_batches})
        result = run_train(root)
        assert result.returncode == 0, result.output[-3000:]
        saved.append(str(root / "model" / "1"))
        logs.append(result.output)
    assert "gradient accumulation: 2 micro-batches of 16 per optimizer step, all on the worker the step is " \
           "scheduled on (32 samples per step), 45 steps per epoch" in logs[1], logs[1][-3000:]
    for log in logs:
        assert "1437 training images (45 steps/epoch)" in log, log[-3000:]
    done = subprocess.run([sys.executable, "-c", SAVED_MODELS_COMPARE, *saved], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    compared = json.loads(done.stdout.strip().splitlines()[-1])
    assert compared["max_weight"] > 0.01 and compared["max_difference"] <= 1e-5, compared


def _compressed_step(compression: str, out_dir) -> list[dict]:
    argv = [str(BIN / "mpirun"), "-np", str(RANKS), "--host", f"localhost:{RANKS}", sys.executable,
            str(PROGRAMS / "horovod_compression.py"), compression, str(out_dir)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return [read_json(out_dir / f"compression-{rank}.json") for rank in range(RANKS)]


def test_fp16_allreduce_compression_averages_float16_values(tmp_path):
    (tmp_path / "none").mkdir()
    (tmp_path / "fp16").mkdir()
    plain, compressed = _compressed_step("none", tmp_path / "none"), _compressed_step("fp16", tmp_path / "fp16")
    assert plain[0]["grads"] == plain[1]["grads"] and compressed[0]["grads"] == compressed[1]["grads"]
    assert [rank["float16_values"] for rank in compressed] == [True, True]
    assert [rank["float16_values"] for rank in plain] == [False, False]   # float32 averages are not float16 values
    for exact, rounded in zip(plain[0]["grads"], compressed[0]["grads"], strict=True):
        assert torch.allclose(torch.tensor(rounded), torch.tensor(exact), rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_label_smoothing_trains_on_the_smoothed_cross_entropy(smoothing):
    torch.manual_seed(0)
    model = torch_model.DigitsNet()
    images, labels = torch.rand(8, 1, 8, 8), torch.arange(8) % 10
    with torch.no_grad():
        log_p = F.log_softmax(model(images), dim=1)
    # targets 1 - e + e/K on the label and e/K elsewhere (Szegedy et al. 2016, section 7)
    expected = ((1 - smoothing) * -log_p[torch.arange(8), labels] + smoothing * -log_p.mean(dim=1)).sum()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sums = torch_common.train_step(model, optimizer, iter([(images, labels)]), label_smoothing=smoothing)
    assert float(sums[0]) == pytest.approx(float(expected), rel=1e-5)


def test_compile_on_trains_the_same_model_through_torch_compile(digits_channels, tmp_path):
    """builtin:pytorch with no distribution and compile=on (nn.Module.compile: TorchInductor, here
    its CPU code): the job runs through the compiled model, learns as the eager run does (both
    >= 0.90 after the 12 epochs of `make train`; their float rounding differs, so not bit-equal), and
    writes model.pth with the same keys (no ``_orig_mod.`` prefix), so checkpoints and weights
    are interchangeable with compile=off."""
    runs = {}
    for mode in ("off", "on"):
        root = digits_job(tmp_path / mode, digits_channels, {"sagemaker_program": "builtin:pytorch", "epochs": 12,
                                                             "compile": mode})
        result = run_train(root, timeout_s=600)
        assert result.returncode == 0, result.output[-4000:]
        accuracies = [float(a) for a in re.findall(r"val_accuracy=([0-9.]+)", result.output)]
        runs[mode] = (result.output, accuracies, torch.load(root / "model" / "model.pth", weights_only=True))
    assert "torch.compile on" in runs["on"][0] and "torch.compile on" not in runs["off"][0]
    assert list(runs["on"][2]) == list(runs["off"][2])
    assert min(runs["on"][1][-1], runs["off"][1][-1]) >= 0.90, (runs["on"][1], runs["off"][1])
