"""GPU runtime checks, for a machine with NVIDIA GPUs (skipped without one; CI has none).

`make gpu-check` (scripts/gpu-check.sh) runs these with DTC_GPU_IMAGE set and writes a dated
report. They start the GPU image with every GPU passed in (`docker run --gpus all`, or podman's
CDI device `nvidia.com/gpu=all`) and run: the in-image GPU suite (tests/gpu/in_image: NCCL allreduce,
broadcast and allgather with exact values for both frameworks on one GPU and on all of them,
DALI decoding into GPU memory, each built-in trainer on the GPU), and the main job the way a
user runs it (`docker run --gpus all ... train`).
"""

import pytest

from helpers import METRIC, TESTS, container, flavor_image, mpi_digits_job

pytestmark = [pytest.mark.gpu, pytest.mark.image]


def test_gpu_runtime_suite_in_the_gpu_image():
    done = container("run", "--rm", "--all-gpus", "--shm-size", "8g", "-v", f"{TESTS / 'gpu' / 'in_image'}:/tests:ro",
                     flavor_image("gpu"), "python", "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", "/tests",
                     timeout_s=3600)
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert "skipped" not in done.stdout.splitlines()[-1], done.stdout[-3000:]   # the GPUs were visible


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_main_job_with_every_gpu(framework, digits_channels, tmp_path):
    root = mpi_digits_job(tmp_path, digits_channels, framework, processes_per_host=1)
    done = container("run", "--rm", "--all-gpus", "--shm-size", "8g", "-v", f"{root}:/opt/ml", flavor_image("gpu"),
                     "train", timeout_s=1800)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "DALI decodes on gpu" in done.stdout + done.stderr
    assert float(METRIC.findall(done.stdout)[-1][2]) >= 0.90
    assert (root / "output" / "success").exists()
