"""Watching a job (#19 item 5): early stopping on a validation plateau, kept across a restart,
and a diverged (non-finite) training loss failing the job on every host, naming the step
(dtc_train.loop and dtc_train.plateau: the same rules for PyTorch and TensorFlow); a profiler
trace of chosen steps (torch_common.StepProfiler)."""

import json
import re

import numpy as np
import pytest

from helpers import METRIC, digits_job, mpi_digits_job, run_train, torch_load

pytestmark = pytest.mark.e2e


def test_early_stopping_ends_a_plateau_saves_the_model_and_a_restart_trains_no_further(digits_channels, tmp_path):
    """learning-rate 1e-30: each update is below float32's resolution of the weights, which never
    change, so the validation loss of every epoch after the first ties it (not lower) and
    patience 2 stops after epoch 3 of 12."""
    root = digits_job(tmp_path, digits_channels, {
        "sagemaker_program": "builtin:pytorch", "sagemaker_torch_distributed_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": 2, "epochs": 12, "learning-rate": 1e-30,
        "early-stopping-patience": 2})
    result = run_train(root)
    assert result.returncode == 0 and result.succeeded, result.output[-4000:]
    assert [int(epoch) for epoch, *_ in METRIC.findall(result.stdout)] == [1, 2, 3]
    assert re.search(r"early stopping after epoch 3 of 12: the validation loss has not improved on [0-9.]+ \(epoch 1\) "
                     r"for 2 epochs \(early-stopping-patience=2\)", result.output), result.output[-3000:]
    assert (root / "model" / "model.pth").exists()
    checkpoint = torch_load(root / "checkpoints" / "checkpoint.pt")
    assert checkpoint["epoch"] == 3 and checkpoint["plateau"]["stopped_after"] == 3

    again = run_train(root)       # a restart (a retried job) finds it done
    assert again.returncode == 0, again.output[-3000:]
    assert "the checkpoint has stopped early after epoch 3 (early-stopping-patience): nothing left to train" in \
        again.output
    assert not METRIC.findall(again.stdout)


def test_a_diverging_loss_fails_the_job_naming_the_step(digits_channels, tmp_path):
    """A learning rate of 1e9 sends the loss to NaN or infinity within a few steps: both MPI ranks
    end, the failure's first line names the step and what to change."""
    root = mpi_digits_job(tmp_path, digits_channels, "pytorch", epochs=2, **{"learning-rate": 1e9})
    result = run_train(root, timeout_s=300)
    assert result.returncode != 0 and not result.succeeded, result.output[-3000:]
    first = result.failure.splitlines()[0]
    assert re.fullmatch(r"FloatingPointError: the training loss is (nan|inf|-inf) at step \d+ of epoch 1 \(global "
                        r"step \d+\) on rank [01]: the model diverged; lower learning-rate \(or warm it up: "
                        r"warmup-epochs\), check the training data, or set nonfinite-loss=continue to train on",
                        first), result.failure[:2000]
    assert not METRIC.findall(result.stdout)


def test_tensorflow_stops_early_on_the_same_rule_and_keeps_its_state_in_the_checkpoint(digits_channels, tmp_path):
    """The loop's rule on a TensorFlow backend (MirroredStrategy, one host, no distribution)."""
    root = digits_job(tmp_path, digits_channels, {"sagemaker_program": "builtin:tensorflow", "epochs": 12,
                                                  "learning-rate": 1e-30, "early-stopping-patience": 2})
    result = run_train(root, timeout_s=600)
    assert result.returncode == 0 and result.succeeded, result.output[-4000:]
    assert [int(epoch) for epoch, *_ in METRIC.findall(result.stdout)] == [1, 2, 3]
    assert "early stopping after epoch 3 of 12" in result.output, result.output[-3000:]
    with np.load(root / "checkpoints" / "checkpoint.npz") as checkpoint:
        assert int(checkpoint["epoch"]) == 3 and checkpoint["extra_plateau"].tolist()[1:] == [1, 3]
    assert (root / "model" / "1" / "saved_model.pb").exists()


def test_tensorflow_horovod_fails_a_diverging_loss_naming_the_step(digits_channels, tmp_path):
    # 1e9 (and 1e30) diverged to a finite loss of 1e32 (1e30) on 2026-11-26's AVX512-FP16 CPUs;
    # 1e38 per rank puts the weights near float32's largest value after one step, so the next
    # step's activations overflow on any CPU (there: inf at step 2)
    root = mpi_digits_job(tmp_path, digits_channels, "tensorflow", epochs=2, **{"learning-rate": 1e38})
    result = run_train(root, timeout_s=600)
    assert result.returncode != 0 and not result.succeeded, result.output[-3000:]
    assert re.fullmatch(r"FloatingPointError: the training loss is (nan|inf|-inf) at step \d+ of epoch 1 \(global "
                        r"step \d+\) on rank [01]: the model diverged; .*", result.failure.splitlines()[0]), \
        result.failure[:2000]


def test_nonfinite_loss_continue_trains_on(digits_channels, tmp_path):
    root = mpi_digits_job(tmp_path, digits_channels, "pytorch", epochs=1,
                          **{"learning-rate": 1e9, "nonfinite-loss": "continue"})
    result = run_train(root, timeout_s=300)
    assert result.returncode == 0, result.output[-3000:]
    assert [int(epoch) for epoch, *_ in METRIC.findall(result.stdout)] == [1]
    assert re.search(r"train_loss=(nan|inf)", result.stdout), result.stdout[-2000:]
    assert json.loads((root / "model" / "model.json").read_text())["epochs"] == 1


def test_profile_steps_writes_a_trace_of_those_steps(digits_channels, tmp_path):
    root = mpi_digits_job(tmp_path, digits_channels, "pytorch", epochs=2, **{"profile-steps": "20:22"})
    result = run_train(root)
    assert result.returncode == 0, result.output[-3000:]
    assert "profile of steps 20 to 22 written to " in result.output
    traces = list((root / "output" / "tensorboard").glob("*_rank0.*.pt.trace.json"))
    assert len(traces) == 1, sorted(p.name for p in (root / "output" / "tensorboard").iterdir())
    events = json.loads(traces[0].read_text())["traceEvents"]
    names = {event.get("name", "") for event in events}
    assert {n for n in names if n.startswith("ProfilerStep#")} == {"ProfilerStep#20", "ProfilerStep#21",
                                                                    "ProfilerStep#22"}
    assert {"aten::conv2d", "aten::cross_entropy_loss"} <= names      # the model's forward and loss, recorded
    assert any(n.startswith("Optimizer.step#SGD") for n in names), sorted(names)[:50]


def test_profile_steps_past_the_jobs_end_are_refused(digits_channels, tmp_path):
    root = mpi_digits_job(tmp_path, digits_channels, "pytorch", epochs=1, **{"profile-steps": "5:500"})
    result = run_train(root, timeout_s=300)
    assert result.returncode != 0
    assert re.fullmatch(r"ValueError: profile-steps=5:500 ends past the job's last step, \d+ \(epochs x optimizer "
                        r"steps per epoch\): choose steps within it", result.failure.splitlines()[0]), result.failure
