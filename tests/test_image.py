"""The built CPU image, exercised with podman (or docker): its in-image sanity suite, its entry
script and labels, the main job inside it, and SIGTERM reaching the training processes.

`make test` builds the image first and names it in DTC_IMAGE; without DTC_IMAGE these tests skip.
"""

import json
import os
import re
import shutil
import subprocess
import time

import pytest

from conftest import PROGRAMS, REPO, run_train
from test_install import pins
from test_trainers_e2e import DIGEST, METRIC, _job

IMAGE = os.environ.get("DTC_IMAGE")
pytestmark = [pytest.mark.image,
              pytest.mark.skipif(not IMAGE, reason="DTC_IMAGE is not set (make test builds the image and sets it)")]
CONTAINER = str(REPO / "scripts" / "container.sh")


def container(*argv: str, timeout_s: float = 900, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run([CONTAINER, *argv], capture_output=True, text=True, timeout=timeout_s, check=check)


def test_in_image_sanity_suite():
    done = container("run", "--rm", "--network", "none", "-v", f"{REPO / 'tests' / 'image'}:/tests:ro", IMAGE,
                     "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "/tests")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_any_other_command_is_execd_as_pid_1():
    done = container("run", "--rm", IMAGE, "bash", "-c", 'echo "$$ $(cat /proc/1/comm)"', check=True)
    assert done.stdout.split() == ["1", "bash"]


def test_labels_carry_the_versions():
    labels = json.loads(container("image", "inspect", IMAGE, check=True).stdout)[0]["Config"]["Labels"]
    pinned = pins()
    assert labels["ai.dtc.tensorflow"] == pinned["TENSORFLOW_VERSION"]
    assert labels["ai.dtc.pytorch"] == pinned["TORCH_VERSION"]
    assert labels["ai.dtc.horovod"] == pinned["HOROVOD_VERSION"]
    assert labels["ai.dtc.python"] == pinned["PYTHON_VERSION"]
    assert labels["ai.dtc.cuda"] == pinned["CUDA_VERSION"] and labels["ai.dtc.flavor"] == "cpu"


def test_main_job_in_the_image_matches_the_host(make_job, digits_channels, tmp_path_factory):
    """The same job, in the image and on the host's venv, ends with bit-identical weights."""
    root = _job(make_job, digits_channels, "pytorch")
    done = container("run", "--rm", "--shm-size", "1g", "-v", f"{root}:/opt/ml", IMAGE, "train")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    epochs = METRIC.findall(done.stdout)
    assert len(epochs) == 12 and float(epochs[-1][2]) >= 0.90
    in_image = {rank: digest for rank, _, digest in DIGEST.findall(done.stdout)}
    assert len(in_image) == 2 and len(set(in_image.values())) == 1
    assert (root / "output" / "success").exists() and (root / "model" / "model.pth").exists()

    host_root = tmp_path_factory.mktemp("host") / "opt" / "ml"
    shutil.copytree(root / "input", host_root / "input")
    on_host = run_train(host_root)
    assert on_host.returncode == 0, on_host.output[-3000:]
    assert METRIC.findall(on_host.stdout)[-1] == epochs[-1]
    assert {d for _, _, d in DIGEST.findall(on_host.stdout)} == set(in_image.values())


def test_sigterm_to_the_container_reaches_the_training_processes(make_job):
    root = make_job({"sagemaker_program": "wait_for_sigterm.py", "sagemaker_mpi_enabled": True,
                     "sagemaker_mpi_num_of_processes_per_host": 2})
    shutil.copy(PROGRAMS / "wait_for_sigterm.py", root / "code")
    name = f"dtc-sigterm-{os.getpid()}"
    container("run", "-d", "--name", name, "-v", f"{root}:/opt/ml", IMAGE, "train", check=True)
    try:
        deadline = time.monotonic() + 120
        while not all((root / "output" / "data" / f"started-{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline, container("logs", name).stderr[-3000:]
            time.sleep(0.5)
        container("stop", "-t", "60", name, check=True)
        state = json.loads(container("inspect", name, check=True).stdout)[0]["State"]
        assert state["ExitCode"] != 0
    finally:
        container("rm", "-f", name)
    assert all((root / "output" / "data" / f"sigterm-{r}").read_text() == "SIGTERM" for r in (0, 1))
    assert re.match(r"wait_for_sigterm.py was stopped by SIGTERM", (root / "output" / "failure").read_text())
