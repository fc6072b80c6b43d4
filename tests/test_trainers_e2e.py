"""End to end: `train` runs each built-in trainer on 2 MPI ranks over the digits channels."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from conftest import PROGRAMS, add_stray_files, run_train

pytestmark = pytest.mark.e2e

METRIC = re.compile(r"epoch=(\d+)/(\d+) .*?val_accuracy=([0-9.]+) val_samples=(\d+)")
DIGEST = re.compile(r"rank=(\d+) world_size=(\d+) final_weights_sha256=([0-9a-f]{64})")
EPOCHS = 12
VALIDATION_IMAGES = 360


def _job(make_job, digits_channels, framework, processes_per_host=2):
    root = make_job({
        "sagemaker_program": f"builtin:{framework}", "sagemaker_mpi_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": processes_per_host, "sagemaker_mpi_custom_mpi_options": "",
        "epochs": EPOCHS,
    }, channels=("training", "validation"))
    for channel in ("training", "validation"):
        shutil.rmtree(root / "input" / "data" / channel)
        shutil.copytree(digits_channels / channel, root / "input" / "data" / channel)
        add_stray_files(root / "input" / "data" / channel)    # skipped: counts stay exact
    return root


@pytest.mark.parametrize("framework, model_files", [
    ("pytorch", {"model.pth", "model.json"}),
    ("tensorflow", {"1", "model.json"}),
])
def test_builtin_trainer_on_two_ranks(framework, model_files, make_job, digits_channels):
    root = _job(make_job, digits_channels, framework)
    result = run_train(root)
    assert result.returncode == 0, result.output[-4000:]
    assert result.succeeded and result.failure is None

    epochs = [(int(e), int(n), float(acc), int(s)) for e, n, acc, s in METRIC.findall(result.stdout)]
    assert [e for e, *_ in epochs] == list(range(1, EPOCHS + 1)), result.stdout[-3000:]
    assert all(samples == VALIDATION_IMAGES for *_, samples in epochs)   # exact, sharded evaluation
    assert len(re.findall(r"ignoring 5 entries that are not image files", result.output)) == 2   # once per channel
    assert epochs[-1][2] >= 0.90

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
