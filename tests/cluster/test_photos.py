"""The README's photographs commands in the image (issue #19, item 2): builtin:pytorch trains a
torchvision architecture (ShuffleNet V2) on RGB photographs (dtc_train.photos) with `make train`
on one host (Horovod, 2 ranks) and `make cluster` on two hosts (DDP, 1 rank each), each to >= 0.9
validation accuracy with identical weights on both ranks and a saved model that scores >= 0.85 on
the photos read with Pillow (photos_checks.check_photos_job). The CPU image built here, without
PyTorch's CPU index, has PyPI's torchvision with docker/patches/torchvision applied.
"""

import shlex
import subprocess

import pytest

from helpers import CLUSTER, IMAGES, REPO, podman_env, read_json
from photos_checks import README_CLUSTER, README_HYPERPARAMETERS, check_photos_job

pytestmark = [pytest.mark.image,
              pytest.mark.skipif(not IMAGES["cpu"],
                                 reason="DTC_IMAGE is not set (make test builds the image and sets it)")]


def _make(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(REPO), *args, f"IMAGE={IMAGES['cpu']}"], capture_output=True,
                          text=True, timeout=1500, env=podman_env(), stdin=subprocess.DEVNULL)


def test_make_train_trains_a_torchvision_architecture_on_the_photos_in_the_image(tmp_path):
    job = tmp_path / "opt" / "ml"
    done = _make("train", "TRAIN_DATA=photos", "EPOCHS=8", f"JOB_DIR={job}",
                 f"HYPERPARAMETERS={README_HYPERPARAMETERS}")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "model=shufflenet_v2_x1_0" in README_HYPERPARAMETERS
    check_photos_job(job, done.stdout + done.stderr, "shufflenet_v2_x1_0")


def test_make_cluster_trains_a_torchvision_architecture_on_the_photos_on_two_hosts(tmp_path):
    cluster_dir = tmp_path / "cluster"
    done = _make("cluster", *shlex.split(README_CLUSTER), f"CLUSTER_DIR={cluster_dir}",
                 f"CLUSTER_ARGS=--name {CLUSTER.name} --subnet {CLUSTER.subnet}")
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = read_json(cluster_dir / "result.json")
    assert [h["exit_code"] for h in result["hosts"].values()] == [0, 0], result
    assert "DISTRIBUTION=torch_distributed" in README_CLUSTER
    check_photos_job(cluster_dir / "algo-1", done.stdout + done.stderr, "shufflenet_v2_x1_0",
                     validation=cluster_dir / "data-photos" / "validation")   # mounted, not in the tree
