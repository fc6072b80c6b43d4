"""The fully sharded PyTorch backend (#20 item 1): builtin:pytorch under torch_distributed with
``data-parallel=fsdp`` (FSDP2 ``fully_shard`` over Gloo here), against DDP's gradients, end to
end through `train`, and resumed from its checkpoint at another world size."""

import json
import subprocess
import sys

import pytest

from helpers import (
    BIN,
    DIGEST,
    METRIC,
    PROGRAMS,
    RESUMING,
    VALIDATION_IMAGES,
    digits_job,
    run_train,
    torch_load,
)

pytestmark = pytest.mark.e2e


def test_fsdp_gradients_and_weights_equal_ddps_on_the_same_batches(tmp_path):
    """Guards against PyTorch #162338 (Gloo's AVG reduce-scatter summing without dividing): the
    sharded gradients must be DDP's averages, not world-size times them."""
    done = subprocess.run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2",
                           str(PROGRAMS / "fsdp_parity.py")], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["max_grad"] > 1e-3                       # the comparison below is not of zeros
    assert result["max_grad_difference"] <= 1e-6 * result["max_grad"], result
    assert result["max_weight_difference"] <= 1e-6, result   # three SGD steps with momentum later
    assert result["local_shard_numel"] * 2 in (result["model_numel"], result["model_numel"] + 1), result   # halves
    assert result["full_state_keys_match"], result


def _fsdp_job(where, digits_channels, processes_per_host: int, epochs: int):
    return digits_job(where, digits_channels, {
        "sagemaker_program": "builtin:pytorch", "sagemaker_torch_distributed_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": processes_per_host, "data-parallel": "fsdp", "epochs": epochs})


def test_fsdp_trains_saves_a_whole_model_and_resumes_at_another_world_size(digits_channels, tmp_path):
    root = _fsdp_job(tmp_path, digits_channels, processes_per_host=2, epochs=8)
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    assert " FSDP2 (gloo): rank 0/2 on cpu " in result.output, result.output[-4000:]   # names what it runs
    epochs = [(int(e), float(acc), int(n)) for e, _, acc, n in METRIC.findall(result.stdout)]
    assert [e for e, *_ in epochs] == list(range(1, 9)) and all(n == VALIDATION_IMAGES for *_, n in epochs)
    assert epochs[-1][1] >= 0.90, epochs
    digests = {int(rank): digest for rank, size, digest in DIGEST.findall(result.stdout)}
    assert set(digests) == {0, 1} and len(set(digests.values())) == 1
    assert json.loads((root / "model" / "model.json").read_text())["world_size"] == 2
    checkpoint = torch_load(root / "checkpoints" / "checkpoint.pt")
    assert checkpoint["epoch"] == 8 and checkpoint["model"] is None                  # the state is sharded:
    shards = sorted(p.name for p in (root / "checkpoints").iterdir() if p.name.startswith("shards-"))
    assert shards == [checkpoint["sharded_state"]]                                  # the older ones pruned
    assert sorted(p.name for p in (root / "checkpoints" / shards[0]).iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]                                # one file per rank

    scored = subprocess.run([sys.executable, str(PROGRAMS / "score_model.py"), "pytorch", str(root / "model"),
                             str(root / "input" / "data" / "validation")], capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert json.loads(scored.stdout.strip().splitlines()[-1])["accuracy"] >= 0.90   # a plain DigitsNet loads it

    # the same tree, one process instead of two and two more epochs: DCP reshards the two ranks'
    # state into one rank's "shards" (the whole model) and training goes on at epoch 9; then back,
    # the one rank's shards into two ranks' for epochs 11 and 12
    _resume_and_check(tmp_path, digits_channels, processes_per_host=1, done=8)
    _resume_and_check(tmp_path, digits_channels, processes_per_host=2, done=10)


def _resume_and_check(tmp_path, digits_channels, processes_per_host: int, done: int) -> None:
    """Runs the FSDP job in ``tmp_path`` again with ``processes_per_host`` ranks for two more epochs
    than the ``done`` its checkpoint holds: it resumes there and ends >= 0.90, identical weights."""
    root = _fsdp_job(tmp_path, digits_channels, processes_per_host=processes_per_host, epochs=done + 2)
    resumed = run_train(root)
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert [int(v) for v in RESUMING.search(resumed.output).groups()] == [done, 0]
    epochs = [(int(e), float(acc)) for e, _, acc, _ in METRIC.findall(resumed.stdout)]
    assert [e for e, _ in epochs] == [done + 1, done + 2] and epochs[-1][1] >= 0.90, epochs
    digests = {int(rank): digest for rank, size, digest in DIGEST.findall(resumed.stdout)}
    assert set(digests) == set(range(processes_per_host)) and len(set(digests.values())) == 1
    assert json.loads((root / "model" / "model.json").read_text())["world_size"] == processes_per_host


@pytest.mark.parametrize("first, then", [("ddp", "fsdp"), ("fsdp", "ddp")])
def test_a_checkpoint_of_the_other_data_parallel_setting_fails_before_training_naming_it(
        first, then, digits_channels, tmp_path):
    for data_parallel, epochs in ((first, 1), (then, 2)):
        root = digits_job(tmp_path, digits_channels, {
            "sagemaker_program": "builtin:pytorch", "sagemaker_torch_distributed_enabled": True,
            "sagemaker_mpi_num_of_processes_per_host": 1, "data-parallel": data_parallel, "epochs": epochs})
        result = run_train(root, timeout_s=300)
    assert result.returncode != 0 and not METRIC.findall(result.stdout), result.output[-3000:]
    first_line = result.failure.splitlines()[0]
    assert first_line.startswith("ValueError: checkpoint ") and "does not fit this model" in first_line, first_line
    assert "data-parallel=ddp and fsdp checkpoints differ" in first_line, first_line


def test_a_sharded_checkpoint_missing_a_ranks_file_fails_naming_the_directory(digits_channels, tmp_path):
    """A restart that did not get every rank's shard file (a host's upload lost) fails before
    training, naming the shard directory, instead of loading part of the state."""
    root = _fsdp_job(tmp_path, digits_channels, processes_per_host=2, epochs=1)
    assert run_train(root).returncode == 0
    shards = torch_load(root / "checkpoints" / "checkpoint.pt")["sharded_state"]
    (root / "checkpoints" / shards / "__1_0.distcp").unlink()
    root = _fsdp_job(tmp_path, digits_channels, processes_per_host=2, epochs=2)
    result = run_train(root, timeout_s=300)
    assert result.returncode != 0 and not METRIC.findall(result.stdout), result.output[-3000:]
    first_line = result.failure.splitlines()[0]
    checkpoints = root / "checkpoints"
    assert first_line.startswith(f"ValueError: checkpoint {checkpoints}/checkpoint.pt: its sharded state "
                                 f"{checkpoints}/{shards} cannot be read (FileNotFoundError"), first_line
