"""Fixtures every tier shares, the tier markers, and the GPU skip. Helpers: tests/helpers.py.

Tiers (docs/development.md): tests/unit (no process started, seconds), tests/integration (real
`train`, mpirun and torchrun on this host), tests/cluster (containers, two hosts), tests/image
(the built images) and tests/gpu (a machine with NVIDIA GPUs). Each test is marked with its
tier's name, so ``-m "not cluster"`` and the like select across directories.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from dtc_local import job_tree
from helpers import handout_order

TIERS = ("unit", "integration", "cluster", "image", "gpu")

# The preflight (docs/preflight.md) runs before every job by default. The jobs the suite starts to
# test other things run without it: it would add its seconds to each of some 300 jobs. Its own tests
# (tests/*/test_preflight.py) turn it on. `train` inherits this, and the local cluster passes it to
# its containers (dtc_local.cluster.PASSED_THROUGH).
os.environ.setdefault("DTC_PREFLIGHT", "off")


def gpu_available() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


def pytest_collection_modifyitems(config, items):
    tests_dir = Path(__file__).parent
    for item in items:
        tier = Path(item.fspath).relative_to(tests_dir).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
    # pytest-xdist hands tests out in this order (helpers.handout_order). Tests marked docker
    # (tests/cluster/test_docker.py) wait for make test's Docker image build (helpers.docker_image):
    # it still runs when the tier starts where DTC_DOCKER_IMAGE_FILE is set and scripts/test.sh has
    # not named its image in DTC_DOCKER_IMAGE.
    docker_build_running = bool(os.environ.get("DTC_DOCKER_IMAGE_FILE")) and not os.environ.get("DTC_DOCKER_IMAGE")
    items[:] = handout_order(items, docker_build_running)
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU on this machine (runs on the lent GPU machine)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture
def make_job(tmp_path):
    """Writes a job tree: make_job(hyperparameters, encoding=..., hosts=..., channels=...)."""

    def make(hyperparameters: dict, **kwargs) -> Path:
        root = tmp_path / "opt" / "ml"
        job_tree.write(str(root), hyperparameters=hyperparameters, **kwargs)
        return root

    return make


@pytest.fixture
def source_dir(tmp_path) -> Path:
    return tmp_path / "source"


@pytest.fixture(scope="session")
def digits_channels(tmp_path_factory) -> Path:
    """The digits data set exported once per session: <dir>/training, <dir>/validation."""
    from dtc_train import digits

    root = tmp_path_factory.mktemp("digits")
    digits.export(str(root))
    return root


@pytest.fixture(scope="session")
def photos_channels(tmp_path_factory) -> Path:
    """Crops of real RGB photographs, one class per photo (dtc_train.photos), exported once per
    session: <dir>/training, <dir>/validation."""
    from dtc_train import photos

    root = tmp_path_factory.mktemp("photos")
    photos.export(str(root))
    return root
