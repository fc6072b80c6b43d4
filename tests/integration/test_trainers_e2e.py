"""End to end: `train` runs each built-in trainer on 2 MPI ranks over the digits channels."""

import getpass
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from helpers import (
    DIGEST,
    METRIC,
    PROGRAMS,
    PROGRESS,
    VALIDATION_IMAGES,
    check_observability,
    digits_job,
    free_port,
    mpi_digits_job,
    read_json,
    run_train,
    torch_load,
)

pytestmark = pytest.mark.e2e
EPOCHS = 12


@pytest.mark.parametrize("framework, model_files", [
    ("pytorch", {"model.pth", "model.json"}),
    ("tensorflow", {"1", "model.json"}),
])
def test_builtin_trainer_on_two_ranks(framework, model_files, digits_channels, tmp_path):
    root = mpi_digits_job(tmp_path, digits_channels, framework, epochs=EPOCHS)
    # which frameworks each rank imported (the image holds both; rank 0's TensorBoard writer
    # imported TensorFlow into every PyTorch job until 2026-12-02: dtc_train.observe)
    (root / "code").mkdir(exist_ok=True)
    shutil.copy(PROGRAMS / "record_imports.py", root / "code" / "sitecustomize.py")
    imports = tmp_path / "imports"
    imports.mkdir()
    scratch = tmp_path / "tmp"   # the ranks' TMPDIR
    scratch.mkdir()
    result = run_train(root, env={"RECORD_IMPORTS_DIR": str(imports), "TMPDIR": str(scratch)})
    assert result.returncode == 0, result.output[-4000:]
    assert result.succeeded and result.failure is None
    records = list(map(read_json, imports.glob("*.json")))
    loaded = {record["rank"]: record["frameworks"] for record in records}
    module = {"pytorch": "torch", "tensorflow": "tensorflow"}[framework]
    assert loaded == {"0": [module], "1": [module]}, loaded
    # nor pandas: tf-keras imports it only for pandas inputs to fit (dtc_train.tf_env keeps it out)
    assert not any(record["pandas"] for record in records), records
    # The exit handlers ran (dtc_train.common.leave): TensorFlow's autograph removed the 18 modules
    # per rank it had generated there. What stays is PyTorch's compile cache, kept on purpose.
    left = {p.name for p in scratch.iterdir()}
    assert left <= {f"torchinductor_{getpass.getuser()}"}, sorted(left)

    epochs = [(int(e), int(n), float(acc), int(s)) for e, n, acc, s in METRIC.findall(result.stdout)]
    assert [e for e, *_ in epochs] == list(range(1, EPOCHS + 1)), result.stdout[-3000:]
    assert all(samples == VALIDATION_IMAGES for *_, samples in epochs)   # exact, sharded evaluation
    assert len(re.findall(r"ignoring 5 entries that are not image files", result.output)) == 2   # once per channel
    assert epochs[-1][2] >= 0.90
    check_observability(result.stdout, root / "output", list(range(1, EPOCHS + 1)), world_size=2)

    digests = {int(rank): (int(size), digest) for rank, size, digest in DIGEST.findall(result.stdout)}
    assert set(digests) == {0, 1} and {size for size, _ in digests.values()} == {2}
    assert digests[0][1] == digests[1][1], "ranks finished with different weights"

    model_dir = root / "model"
    assert {p.name for p in model_dir.iterdir()} == model_files            # written once, by rank 0
    assert json.loads((model_dir / "model.json").read_text())["world_size"] == 2
    assert any((root / "checkpoints").iterdir())

    scored = subprocess.run([sys.executable, str(PROGRAMS / "score_model.py"), framework, str(model_dir),
                             str(root / "input" / "data" / "validation")],
                            capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0, scored.stderr[-3000:]
    score = json.loads(scored.stdout.strip().splitlines()[-1])
    assert score["samples"] == VALIDATION_IMAGES and score["accuracy"] >= 0.90


def _accuracy_by_epoch(result) -> dict[int, float]:
    return {int(e): float(acc) for e, _, acc, _ in METRIC.findall(result.stdout)}


def test_an_unreadable_checkpoint_is_named_and_replaced(digits_channels, tmp_path):
    root = digits_job(tmp_path / "job", digits_channels, {
        "sagemaker_program": "builtin:pytorch", "sagemaker_mpi_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": 2, "epochs": 2})
    (root / "checkpoints").mkdir(exist_ok=True)
    (root / "checkpoints" / "checkpoint.pt").write_bytes(b"truncated")
    result = run_train(root)
    assert result.returncode == 0, result.output[-3000:]
    assert "ignoring checkpoint" in result.output and sorted(_accuracy_by_epoch(result)) == [1, 2]
    assert torch_load(root / "checkpoints" / "checkpoint.pt")["epoch"] == 2


def test_progress_lines_within_epochs_are_rate_limited(digits_channels, tmp_path):
    """One line per progress-seconds at most, with step, global samples/s and an ETA."""
    root = mpi_digits_job(tmp_path, digits_channels, "pytorch", epochs=4, **{"batch-size": 8, "progress-seconds": 0.25})
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    progress = [tuple(map(float, m)) for m in PROGRESS.findall(result.stdout)]
    steps = 90            # ceil(1437 training images / (8 per rank x 2 ranks))
    assert progress, result.stdout[-2000:]
    assert all(n == 4 and 0 < step < total == steps and rate > 0 and eta >= 0
               for _, n, step, total, rate, eta in progress)
    assert all(1 <= epoch <= 4 for epoch, *_ in progress)
    seconds = sum(float(s) for s in re.findall(r"epoch_seconds=([0-9.]+)", result.stdout))
    assert len(progress) <= seconds / 0.25 + 4          # never more than one per interval
    etas = [eta for *_, eta in progress]
    assert etas[-1] < etas[0]



def _set_input_modes(root, modes: dict[str, str]) -> None:
    path = root / "input" / "config" / "inputdataconfig.json"
    channels = json.loads(path.read_text())
    for name, mode in modes.items():
        channels[name]["TrainingInputMode"] = mode
    path.write_text(json.dumps(channels))


def test_fastfile_channels_train_and_a_pipe_channel_is_refused_before_training(digits_channels, tmp_path):
    """FastFile presents the S3 objects as files: the trainer reads them as in File mode. Pipe
    mode gives FIFOs, which the trainers cannot shuffle and re-read: refused before any step,
    naming the channel and the mode to use instead."""
    hps = {"sagemaker_program": "builtin:pytorch", "sagemaker_mpi_enabled": True,
           "sagemaker_mpi_num_of_processes_per_host": 2, "epochs": 1}
    root = digits_job(tmp_path / "fastfile", digits_channels, hps)
    _set_input_modes(root, {"training": "FastFile", "validation": "FastFile"})
    result = run_train(root)
    assert result.returncode == 0, result.output[-3000:]
    assert "channels (input mode): training (FastFile), validation (FastFile)" in result.output
    assert [int(e) for e, *_ in METRIC.findall(result.stdout)] == [1]

    root = digits_job(tmp_path / "pipe", digits_channels, hps)
    _set_input_modes(root, {"validation": "Pipe"})
    result = run_train(root, timeout_s=300)
    assert result.returncode == 1, result.output[-3000:]
    assert result.failure.splitlines()[0].startswith(
        "ValueError: channel 'validation' is in Pipe mode (TrainingInputMode in input/config/inputdataconfig.json), "
        "but the built-in trainers read a directory of image files"), result.failure
    assert not METRIC.findall(result.stdout) and not any((root / "model").iterdir())


def test_multi_worker_mirrored_waits_the_trainers_heartbeat_timeout():
    """TensorFlow's coordination service fails a MultiWorkerMirrored job when a task misses its
    heartbeats for the timeout, 10 s by default, which a busy host can miss. The trainer sets 20 s
    (tensorflow_mwms.HEARTBEAT_TIMEOUT_S) and the strategy keeps it: a one-worker TF_CONFIG here,
    a strategy built by the trainer's own choose_strategy."""
    tf_config = {"cluster": {"worker": [f"localhost:{free_port()}"]}, "task": {"type": "worker", "index": 0}}
    code = ("from dtc_train import tensorflow_mwms\n"
            "from tensorflow.python.eager import context\n"
            "strategy, name = tensorflow_mwms.choose_strategy(1)\n"
            "print('RESULT', name, context.context().coordination_service.heartbeat_timeout_in_ms)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TF_CONFIG": json.dumps(tf_config)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RESULT multi_worker_mirrored 20000\n" in result.stdout, result.stdout + result.stderr[-3000:]


def test_tensorflow_without_a_distribution_mirrors_over_the_hosts_devices(digits_channels, tmp_path):
    """One host, no distribution: builtin:tensorflow runs MirroredStrategy over every local device
    (#19 item 4), here two logical CPU devices (cpu-replicas=2; GPUs would be found by
    themselves): one process, two replicas in sync, global batches of batch-size x 2, the
    SavedModel written once."""
    epochs = 10
    root = digits_job(tmp_path / "job", digits_channels, {"sagemaker_program": "builtin:tensorflow", "epochs": epochs,
                                                          "cpu-replicas": 2})
    plan = run_train(root, "--plan", timeout_s=60)
    assert json.loads(plan.stdout)["argv"][1:3] == ["-m", "dtc_train.tensorflow_mwms"]
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    assert re.search(r"TensorFlow \S+ MirroredStrategy: worker 0 of 1 workers \(host algo-1\), 2 replicas on "
                     r"\S+device:CPU:0, \S+device:CPU:1; 1437 training images \(23 steps/epoch\)", result.output), \
        result.output[-4000:]        # 23 = ceil(1437 / (32 x 2))
    accuracy = _accuracy_by_epoch(result)
    assert sorted(accuracy) == list(range(1, epochs + 1)) and accuracy[epochs] >= 0.90, accuracy
    assert {p.name for p in (root / "model").iterdir()} == {"1", "model.json"}
    assert json.loads((root / "model" / "model.json").read_text())["strategy"] == "mirrored_strategy"

    root = digits_job(tmp_path / "refused", digits_channels, {"sagemaker_program": "builtin:pytorch",
                                                              "cpu-replicas": 2})
    result = run_train(root, timeout_s=300)   # an option another backend applies is an error, not ignored
    assert result.returncode == 2, result.output[-3000:]
    assert result.failure.splitlines()[0].endswith(
        "error: hyperparameter cpu-replicas does not apply to builtin:pytorch alone (one process, no collectives, "
        "DALI input): remove it from the job's hyperparameters (it applies to builtin:tensorflow alone or under "
        "multi_worker_mirrored_strategy (MirroredStrategy / MultiWorkerMirroredStrategy, tf.data input))"), \
        result.failure
