"""The GPU flavor, checked on a machine without a GPU (issue #9): its in-image suite (one CUDA
major, one copy of every CUDA library, Horovod's NCCL and kernels, ldd, imports, pip check), its
labels, the main job of both frameworks reaching the CPU image's accuracy, and a two-host
cluster. DTC_GPU_IMAGE names the image: `make gpu-verify` builds it and runs these, and so does
`make test` when the GPU build's inputs differ from tests/fixtures/gpu-verified.json. The checks
that need a GPU are tests/gpu (scripts/gpu-check.sh).
"""

import shutil

import pytest

from helpers import (
    DIGEST,
    METRIC,
    check_in_image_suite,
    check_labels,
    check_two_host_job,
    flavor_image,
    mpi_digits_job,
    run_job_in,
)

pytestmark = pytest.mark.image


def test_gpu_in_image_sanity_suite():
    check_in_image_suite("gpu")


def test_gpu_labels():
    check_labels("gpu")


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_main_job_in_the_gpu_image_on_cpu_reaches_the_cpu_images_accuracy(framework, digits_channels, tmp_path):
    """`make train` in the GPU flavor, on a machine without a GPU (its CPU code path), against the
    same job in the CPU flavor: both >= 0.90, within 2 points of each other (PyTorch differs:
    2.10 on GPU, 2.13 on CPU; TensorFlow is the same release)."""
    gpu_image, cpu_image = flavor_image("gpu"), flavor_image("cpu")
    accuracy = {}
    for flavor, image in (("gpu", gpu_image), ("cpu", cpu_image)):
        root = mpi_digits_job(tmp_path / flavor, digits_channels, framework)
        done = run_job_in(image, root)
        assert done.returncode == 0, f"{flavor}: " + done.stdout[-3000:] + done.stderr[-3000:]
        epochs = METRIC.findall(done.stdout)
        assert len(epochs) == 12 and int(epochs[-1][3]) == 360
        digests = {d for _, _, d in DIGEST.findall(done.stdout)}
        assert len(digests) == 1, f"{flavor}: ranks ended with different weights"
        accuracy[flavor] = float(epochs[-1][2])
        shutil.rmtree(root)
    assert min(accuracy.values()) >= 0.90 and abs(accuracy["gpu"] - accuracy["cpu"]) <= 0.02, accuracy



@pytest.mark.parametrize("case", ["mpi-pytorch", "multi-worker-mirrored"])
def test_two_hosts_in_the_gpu_image_on_cpu(case, tmp_path):
    """The GPU flavor's CPU code path across hosts: the same checks as for the CPU image."""
    check_two_host_job(case, tmp_path, flavor_image("gpu"))
