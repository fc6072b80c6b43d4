"""End to end: `train` runs each built-in trainer on 2 MPI ranks over the digits channels."""

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import PROGRAMS, REPO, add_stray_files, run_train

pytestmark = pytest.mark.e2e

METRIC = re.compile(r"epoch=(\d+)/(\d+) .*?val_accuracy=([0-9.]+) val_samples=(\d+)")
DIGEST = re.compile(r"rank=(\d+) world_size=(\d+) final_weights_sha256=([0-9a-f]{64})")
EPOCHS = 12
VALIDATION_IMAGES = 360
PROGRESS = re.compile(r"progress epoch=(\d+)/(\d+) step=(\d+)/(\d+) samples_per_second=([0-9.]+) eta_seconds=(\d+)")
SCALAR_TAGS = {"train/loss", "train/accuracy", "validation/loss", "validation/accuracy",
               "throughput/samples_per_second", "time/epoch_seconds"}


def readme_metric_definitions() -> list[dict]:
    """The metric_definitions list the README gives users, as Python."""
    text = (REPO / "README.md").read_text()
    block = re.search(r"metric_definitions = (\[.*?\n\])", text, re.S).group(1)
    return ast.literal_eval(block)


def check_observability(log: str, output_dir: Path, epochs: int, world_size: int) -> None:
    """The README's metric regexes, applied line by line as CloudWatch does, read every epoch's
    values from the real log; rank 0 wrote TensorBoard scalars and the report for the same epochs."""
    lines = [line for line in log.splitlines() if METRIC.search(line)]
    assert len(lines) == epochs
    definitions = readme_metric_definitions()
    assert {d["Name"] for d in definitions} >= {"validation:accuracy", "train:samples_per_second"}
    found = {d["Name"]: [float(m.group(1)) for line in log.splitlines() if (m := re.search(d["Regex"], line))]
             for d in definitions}
    assert all(len(values) == epochs for values in found.values()), {k: len(v) for k, v in found.items()}
    assert found["validation:accuracy"] == [float(m.group(3)) for m in map(METRIC.search, lines)]

    # TensorBoard's own reader (TensorBoard 2 scalars are tensors with the scalars plugin's metadata)
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray
    events = EventAccumulator(str(output_dir / "tensorboard"))
    events.Reload()
    assert set(events.Tags()["tensors"]) == SCALAR_TAGS
    assert all(events.SummaryMetadata(tag).plugin_data.plugin_name == "scalars" for tag in SCALAR_TAGS)
    accuracy = events.Tensors("validation/accuracy")
    assert [e.step for e in accuracy] == list(range(1, epochs + 1))
    assert [float(make_ndarray(e.tensor_proto)) for e in accuracy] == pytest.approx(found["validation:accuracy"], abs=1e-4)

    report = output_dir / "data" / "report"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["epochs_this_run"] == list(range(1, epochs + 1)) and summary["world_size"] == world_size
    assert summary["final"]["val_accuracy"] == pytest.approx(found["validation:accuracy"][-1], abs=1e-4)
    assert sum(summary["phase_seconds"].values()) == pytest.approx(summary["wall_seconds"], rel=1e-3)
    assert summary["phase_seconds"]["training_steps"] > 0 and summary["mean_samples_per_second"] > 0
    assert "final validation accuracy" in (report / "summary.md").read_text()
    from PIL import Image
    for name in ("loss.png", "accuracy.png", "throughput.png"):
        with Image.open(report / name) as image:
            assert image.format == "PNG" and image.size == (600, 400)


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
    check_observability(result.stdout, root / "output", EPOCHS, world_size=2)

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


def test_an_unreadable_checkpoint_is_named_and_replaced(make_job, digits_channels, tmp_path):
    root = job_tree_at({"sagemaker_program": "builtin:pytorch", "sagemaker_mpi_enabled": True,
                                  "sagemaker_mpi_num_of_processes_per_host": 2, "epochs": 2}, tmp_path / "job")
    for channel in ("training", "validation"):
        shutil.copytree(digits_channels / channel, root / "input" / "data" / channel, dirs_exist_ok=True)
    (root / "checkpoints").mkdir(exist_ok=True)
    (root / "checkpoints" / "checkpoint.pt").write_bytes(b"truncated")
    result = run_train(root)
    assert result.returncode == 0, result.output[-3000:]
    assert "ignoring checkpoint" in result.output and sorted(_accuracy_by_epoch(result)) == [1, 2]
    assert torch_load(root / "checkpoints" / "checkpoint.pt")["epoch"] == 2


def job_tree_at(hyperparameters, where):
    """A job tree at ``where`` (kept between runs: channels and checkpoints stay)."""
    from dtc_local import job_tree

    root = where / "opt" / "ml"
    job_tree.write(str(root), hyperparameters=hyperparameters, channels=("training", "validation"), clean=False)
    return root


def torch_load(path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def test_progress_lines_within_epochs_are_rate_limited(make_job, digits_channels):
    """One line per progress-seconds at most, with step, global samples/s and an ETA."""
    root = _job(make_job, digits_channels, "pytorch")
    hyperparameters = json.loads((root / "input" / "config" / "hyperparameters.json").read_text())
    hyperparameters.update({"epochs": "4", "batch-size": "8", "progress-seconds": "0.25"})
    (root / "input" / "config" / "hyperparameters.json").write_text(json.dumps(hyperparameters))
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

