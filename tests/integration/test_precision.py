"""``precision`` (#19 item 3). The PyTorch trainers: ``bf16`` and ``fp16`` run each step's
forward pass and loss under ``torch.autocast`` (fp16 with dynamic loss scaling), the weights,
gradients and optimizer state staying fp32; end to end under DDP (torchrun) and Horovod (mpirun).
The TensorFlow trainers: Keras' mixed-precision policies, fp16 with Keras' ``LossScaleOptimizer``
judging the all-reduced gradients, so an overflow on one rank skips the step on every rank; end
to end under Horovod and MirroredStrategy (in-process checks: test_keras_steps.py)."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from dtc_train import torch_common, torch_model
from helpers import (
    BIN,
    METRIC,
    PROGRAMS,
    digits_job,
    json_objects,
    mpi_digits_job,
    run_train,
    torch_load,
)

pytestmark = pytest.mark.e2e
# The fp16 jobs' hyperparameters: float16 is slow on a CPU (each test's docstring has its numbers),
# so they train 2 epochs of twice the steps at 5 times the rate of the defaults (batch 32, 0.01).
FP16_HYPERPARAMETERS = {"batch-size": 16, "learning-rate": 0.05}


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(16, *torch_model.INPUT_SHAPE, generator=generator)
    return images, torch.randint(0, 10, (16,), generator=generator)


def _one_step(precision_name: str, images: torch.Tensor, labels: torch.Tensor):
    """One train_step of a fresh DigitsNet (seed 0) in ``precision_name``. Returns (the first
    convolution's output dtype inside the step, the model, its gradients, the Precision)."""
    torch.manual_seed(0)
    model = torch_model.DigitsNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    precision = torch_common.Precision.build(precision_name, torch.device("cpu"))
    seen = []
    model.features[0].register_forward_hook(lambda _module, _inputs, output: seen.append(output.dtype))
    torch_common.train_step(model, optimizer, iter([(images, labels)]), precision)
    return seen[0], model, [p.grad.clone() for p in model.parameters()], precision


@pytest.mark.parametrize("name, inside", [("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_the_step_computes_in_the_chosen_precision_and_keeps_fp32_state(name, inside):
    dtype, model, grads, precision = _one_step(name, *_batch())
    assert dtype == inside
    assert all(p.dtype == torch.float32 for p in model.parameters()) and all(g.dtype == torch.float32 for g in grads)
    _, _, reference, _ = _one_step("fp32", *_batch())
    # the gradients are fp32's up to the low precision's rounding: fp16's loss scale is undone
    # (unscaled they would be 65536 times larger), bf16's 8-bit mantissa gives about 1 % error
    largest = max(float(g.abs().max()) for g in reference)
    difference = max(float((g - r).abs().max()) for g, r in zip(grads, reference, strict=True))
    assert difference <= {"fp32": 0.0, "bf16": 0.05, "fp16": 0.01}[name] * largest, (difference, largest)
    if name == "fp16":
        assert precision.scaler.get_scale() == 65536.0      # GradScaler's initial scale, kept after a finite step


def test_fp16_skips_a_step_whose_gradients_overflow_and_halves_the_scale():
    images, labels = _batch()
    images[0, 0, 0, 0] = float("inf")
    torch.manual_seed(0)
    before = [p.detach().clone() for p in torch_model.DigitsNet().parameters()]
    _, model, _, precision = _one_step("fp16", images, labels)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))   # not applied
    assert precision.scaler.get_scale() == 32768.0


def test_ddp_trains_in_bf16(digits_channels, tmp_path):
    root = digits_job(tmp_path, digits_channels, {
        "sagemaker_program": "builtin:pytorch", "sagemaker_torch_distributed_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": 2, "precision": "bf16", "epochs": 12})
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    assert "precision bf16: forward pass and loss under torch.autocast(cpu, torch.bfloat16)" in result.output
    accuracy = [float(acc) for _, _, acc, _ in METRIC.findall(result.stdout)]
    assert len(accuracy) == 12 and accuracy[-1] >= 0.90, accuracy
    assert json.loads((root / "model" / "model.json").read_text())["precision"] == "bf16"


def test_horovod_trains_in_fp16_with_loss_scaling_kept_in_the_checkpoint(digits_channels, tmp_path):
    """2 MPI ranks in fp16. On a CPU torch's float16 convolution backward takes a slow path,
    about 200 times bf16's (a 32-to-64-channel 3x3 convolution on 8x8 images: 206 ms against 1.1,
    torch 2.13, 2026-12-07; pytorch/pytorch#146508), so the job is 2 epochs of batch 16 at
    learning rate 0.05: 0.8194 and 0.9528, 38 core-seconds alone, against 0.9278 after the default
    5 epochs of batch 32 at 0.01, 84 core-seconds (the same machine and day)."""
    root = mpi_digits_job(tmp_path, digits_channels, "pytorch", epochs=2, precision="fp16",
                          **FP16_HYPERPARAMETERS)
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    assert ("precision fp16: forward pass and loss under torch.autocast(cpu, torch.float16), loss scaling "
            "(GradScaler)") in result.output
    accuracy = [float(acc) for _, _, acc, _ in METRIC.findall(result.stdout)]
    assert len(accuracy) == 2 and accuracy[-1] >= 0.90, accuracy
    assert torch_load(root / "checkpoints" / "checkpoint.pt")["grad_scaler"]["scale"] >= 1.0


@pytest.mark.parametrize("mode", ["horovod", "mirrored"])
def test_tensorflow_fp16_skips_a_step_on_every_rank_when_one_rank_overflows(mode, tmp_path):
    """tests/programs/tf_loss_scale.py: in the second step the last rank's (replica's) batch
    overflows float16 and no other's does. Every rank must skip that step, halve its loss scale
    to 2**14 and keep weights identical to the others' (a rank that judged its own gradients
    would apply a step the other skipped, or wait in an allreduce the other never joins).
    mirrored: 2 logical CPU replicas with gradient-accumulation-steps=2."""
    argv = [sys.executable, str(PROGRAMS / "tf_loss_scale.py"), mode]
    if mode == "horovod":
        argv = [str(BIN / "mpirun"), "-np", "2", "--host", "localhost:2", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    results = json_objects(done.stdout)
    assert sorted(r["rank"] for r in results) == list(range(len(results))) and results[0]["world_size"] == 2
    assert len(results) == (2 if mode == "horovod" else 1)
    for result in results:
        assert result["scales"] == [2.0 ** 15, 2.0 ** 14] and result["moved"] == [True, False], result
    assert len({r["digest"] for r in results}) == 1


def test_tensorflow_horovod_trains_in_fp16_with_the_loss_scale_in_the_checkpoint(digits_channels, tmp_path):
    """The Horovod trainer on 2 MPI ranks in fp16 (float16 is emulated on this CPU: about 4 times
    slower than fp32), with the PyTorch test's 2 epochs of batch 16 at learning rate 0.05: 0.9417
    and 0.9611, 60 core-seconds alone, against 0.9167 after 5 epochs of the defaults, 132
    core-seconds (2026-12-07)."""
    root = mpi_digits_job(tmp_path, digits_channels, "tensorflow", epochs=2, precision="fp16",
                          **FP16_HYPERPARAMETERS)
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    accuracy = [float(acc) for _, _, acc, _ in METRIC.findall(result.stdout)]
    assert len(accuracy) == 2 and accuracy[-1] >= 0.90, accuracy
    assert json.loads((root / "model" / "model.json").read_text())["precision"] == "fp16"
    with np.load(root / "checkpoints" / "checkpoint.npz") as saved:
        optimizer = [saved[f"optimizer_{i}"] for i in range(sum(k.startswith("optimizer_") for k in saved.files))]
    # tf_checkpoint.optimizer_variables: the scale (a power of two >= 1) and its finite-step count last
    scale, good_steps = float(optimizer[-2]), int(optimizer[-1])
    assert scale >= 1.0 and np.log2(scale).is_integer() and 0 <= good_steps < 2000, (scale, good_steps)

