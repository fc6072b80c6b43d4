"""Every script in examples/ trains on a two-host cluster in the image, with its own job file
(`make cluster JOB_FILE=examples/<name>/job.json`, the command examples/README.md shows), and a
rerun with more epochs resumes from the checkpoints the first run left in /opt/ml/checkpoints.

Each run asserts what the example promises: exit 0 on both hosts, the validation accuracy
reached, identical weights on every data-parallel rank (not under the parameter server, whose
workers update asynchronously, nor for independent models), and the model files written.
"""

import json
from pathlib import Path

import pytest

from helpers import EPOCH_LINE, EXAMPLES, REPO, WEIGHTS_LINE, run_cluster

pytestmark = pytest.mark.image


def run_example(name: str, job_dir: Path, checkpoints: Path, epochs: int, *args: str) -> tuple[str, dict]:
    done, result = run_cluster(job_dir, "--job-file", str(REPO / "examples" / name / "job.json"),
                               "--checkpoint-dir", str(checkpoints), "-p", f"epochs={epochs}", *args, timeout_s=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0 and result["exit_code"] == 0, log[-6000:]
    assert {host: info["exit_code"] for host, info in result["hosts"].items()} == {"algo-1": 0, "algo-2": 0}
    return log, result


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_example_trains_on_two_hosts_and_resumes_from_its_checkpoints(name, tmp_path):
    ranks, model_file, accuracy = EXAMPLES[name]
    epochs = json.loads((REPO / "examples" / name / "job.json").read_text())["hyperparameters"]["epochs"]
    checkpoints = tmp_path / "checkpoints"

    log, _ = run_example(name, tmp_path / "first", checkpoints, epochs - 2)
    assert {int(e) for e, _, _ in EPOCH_LINE.findall(log)} == set(range(1, epochs - 1)), log[-4000:]
    assert "resuming from" not in log
    assert any(checkpoints.iterdir())

    log, _ = run_example(name, tmp_path / "resumed", checkpoints, epochs)
    assert "resuming from" in log, log[-4000:]
    lines = EPOCH_LINE.findall(log)
    assert {int(e) for e, _, _ in lines} == {epochs - 1, epochs}, log[-4000:]   # only the epochs not done
    finals = [float(a) for e, _, a in lines if int(e) == epochs]
    assert finals and min(finals) >= accuracy, log[-4000:]
    if ranks:
        digests = {int(rank): digest for rank, size, digest in WEIGHTS_LINE.findall(log) if int(size) == ranks}
        assert sorted(digests) == list(range(ranks)) and len(set(digests.values())) == 1, log[-4000:]
    model_dir = tmp_path / "resumed" / "algo-1" / "model"
    assert (model_dir / model_file).is_file(), sorted(str(p) for p in model_dir.rglob("*"))
    if name == "deepspeed_zero":   # the older epochs' tags are pruned once the newest is written
        assert sorted(p.name for p in checkpoints.glob("epoch-*")) == [f"epoch-{epochs}"], list(checkpoints.iterdir())
    if name == "independent_models":   # one model per host, each with its host's learning rate
        metrics = {host: json.loads((tmp_path / "resumed" / host / "model" / host / "metrics.json").read_text())
                   for host in ("algo-1", "algo-2")}
        assert {host: m["learning_rate"] for host, m in metrics.items()} == {"algo-1": 0.005, "algo-2": 0.02}
        assert min(m["val_accuracy"] for m in metrics.values()) >= accuracy, metrics


@pytest.mark.parametrize("stage", [1, 3])
def test_deepspeed_zero_stages_1_and_3_train_on_two_hosts_over_gloo(stage, tmp_path):
    """Stage 2 is the example's default (above); 1 shards the optimizer state only, 3 the
    parameters too (the model is gathered to save it). Four ranks on two hosts, Gloo on CPU."""
    log, _ = run_example("deepspeed_zero", tmp_path / "job", tmp_path / "checkpoints", 4, "-p", f"zero-stage={stage}")
    lines = EPOCH_LINE.findall(log)
    assert {int(e) for e, _, _ in lines} == {1, 2, 3, 4} and f"zero_stage={stage} " in log, log[-4000:]
    assert float(lines[-1][2]) >= 0.85, log[-4000:]
    digests = {int(rank): digest for rank, size, digest in WEIGHTS_LINE.findall(log) if int(size) == 4}
    assert sorted(digests) == [0, 1, 2, 3] and len(set(digests.values())) == 1, log[-4000:]
    assert (tmp_path / "job" / "algo-1" / "model" / "model.pt").is_file()


def test_the_ddp_example_reads_sharded_channels_on_two_hosts(tmp_path):
    """examples/pytorch_ddp on ShardedByS3Key channels (#20 item 3; dtc_local deals each channel's
    files to the hosts in turn): each host's two ranks split its part (719 and 718 training
    files: 359 per rank, 11 batches of 32), every rank runs the same steps, validation sums every
    host's images, and the ranks end with identical weights."""
    log, _ = run_example("pytorch_ddp", tmp_path / "job", tmp_path / "checkpoints", 8,
                         "--sharded-channel", "training", "--sharded-channel", "validation")
    assert "training: ShardedByS3Key, split by local rank; 11 steps per epoch on every rank" in log, log[-4000:]
    lines = EPOCH_LINE.findall(log)
    assert [int(e) for e, _, _ in lines] == list(range(1, 9)) and float(lines[-1][2]) >= 0.85, log[-4000:]
    digests = {int(rank): digest for rank, size, digest in WEIGHTS_LINE.findall(log) if int(size) == 4}
    assert sorted(digests) == [0, 1, 2, 3] and len(set(digests.values())) == 1, log[-4000:]
    assert sum(1 for _ in (tmp_path / "job" / "algo-2" / "input" / "data" / "training").rglob("*.png")) == 718
