"""Sanity suite run inside the built image (tests/test_image.py starts it with pytest there).

Modelled on AWS DLC's in-container checks (image-build.md section 8): versions equal the pins,
a clean `pip check`, Horovod's build, imports, MPI, sshd, and nothing left that should not be.
"""

import os
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

VERSIONS = Path("/opt/dtc/src/versions.env")


def pins() -> dict[str, str]:
    values = {}
    for line in VERSIONS.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            values[key] = value
    return values


def run(*argv: str, **kwargs) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=300, **kwargs).stdout


@pytest.mark.parametrize("distribution, key", [
    ("tensorflow", "TENSORFLOW_VERSION"), ("tf-keras", "TF_KERAS_VERSION"), ("horovod", "HOROVOD_VERSION"),
    ("mpi4py", "MPI4PY_VERSION"), ("sagemaker-training", "SAGEMAKER_TRAINING_VERSION"),
    ("nvidia-dali-cuda120", "DALI_VERSION"), ("nvidia-dali-tf-plugin-cuda120", "DALI_VERSION"),
    ("numpy", "NUMPY_VERSION"), ("protobuf", "PROTOBUF_VERSION"),
])
def test_versions_equal_the_pins(distribution, key):
    assert metadata.version(distribution) == pins()[key]


def test_torch_is_the_flavors_build():
    suffix = "+cpu" if os.environ["FLAVOR"] == "cpu" else "+" + pins()["TORCH_CUDA_INDEX"]
    assert metadata.version("torch") == pins()["TORCH_VERSION"] + suffix


def test_pip_check_is_clean():
    run("python", "-m", "pip", "check")


def test_horovod_check_build():
    out = run("horovodrun", "--check-build")
    wanted = ["TensorFlow", "PyTorch", "MPI", "Gloo"] + (["NCCL"] if os.environ["FLAVOR"] == "gpu" else [])
    for name in wanted:
        assert re.search(rf"\[X\] {name}\b", out), out


@pytest.mark.parametrize("module", [
    "tensorflow", "torch", "horovod.tensorflow", "horovod.tensorflow.keras", "horovod.torch", "mpi4py.MPI",
    "nvidia.dali", "nvidia.dali.plugin.tf", "nvidia.dali.plugin.pytorch", "sagemaker_training.environment",
    "dtc_entrypoint.cli", "dtc_train.dali_data",
])
def test_imports(module):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    run("python", "-c", f"import {module}", env=env)


def test_horovod_allreduce_on_two_ranks():
    code = "import horovod.torch as h, torch; h.init(); print(int(h.allreduce(torch.tensor([h.rank() + 1]), op=h.Sum)))"
    out = run("mpirun", "-np", "2", "python", "-c", code)
    assert out.split() == ["3", "3"]


def test_mpirun_wrapper_and_openmpi_version():
    assert "--allow-run-as-root" in Path("/usr/local/bin/mpirun").read_text()
    assert shutil.which("mpirun") == "/usr/local/bin/mpirun"
    info = run("ompi_info", "--parsable")
    assert f"ompi:version:full:{pins()['OPENMPI_VERSION']}" in info.splitlines()
    assert shutil.which("orted")


def test_sshd_is_ready_for_multi_host_mpi():
    config = run("/usr/sbin/sshd", "-T")
    settings = dict(line.split(" ", 1) for line in config.splitlines() if " " in line)
    assert settings["port"] == "22"
    assert settings["permitrootlogin"] in ("without-password", "prohibit-password")
    assert settings["passwordauthentication"] == "no"
    assert list(Path("/etc/ssh").glob("ssh_host_*_key"))
    assert Path("/root/.ssh/authorized_keys").read_text() == Path("/root/.ssh/id_ed25519.pub").read_text()
    assert "StrictHostKeyChecking no" in Path("/root/.ssh/config").read_text()
    assert "session optional pam_loginuid.so" in Path("/etc/pam.d/sshd").read_text()


def test_opt_ml_code_is_empty():
    assert not any(Path("/opt/ml/code").iterdir())


def test_no_compilers_in_the_runtime_image():
    assert [c for c in ("gcc", "g++", "cc", "c++", "clang", "nvcc") if shutil.which(c)] == []
    # Debian's openmpi-bin ships the mpicc wrapper; with no compiler behind it, it cannot compile.
    if shutil.which("mpicc"):
        assert subprocess.run(["mpicc", "--version"], capture_output=True).returncode != 0


def test_no_build_ca_or_pip_config_left():
    assert not Path("/run/secrets/pip_ca").exists()
    assert not Path("/etc/pip.conf").exists() and "PIP_CERT" not in os.environ
