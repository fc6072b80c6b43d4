"""The installed stack matches versions.env, and Horovod was built with everything we ship."""

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from helpers import BIN, REPO, pins


@pytest.mark.parametrize("distribution, key", [
    ("tensorflow", "TENSORFLOW_VERSION"), ("tf-keras", "TF_KERAS_VERSION"), ("horovod", "HOROVOD_VERSION"),
    ("mpi4py", "MPI4PY_VERSION"), ("sagemaker-training", "SAGEMAKER_TRAINING_VERSION"),
    ("nvidia-dali-cuda120", "DALI_VERSION"), ("nvidia-dali-tf-plugin-cuda120", "DALI_VERSION"),
    ("numpy", "NUMPY_VERSION"), ("protobuf", "PROTOBUF_VERSION"),
])
def test_installed_versions_equal_the_pins(distribution, key):
    assert metadata.version(distribution) == pins()[key]


def test_torch_is_the_pinned_cpu_build():
    assert metadata.version("torch") == pins()["TORCH_VERSION"] + "+cpu"


def test_python_is_the_pinned_minor():
    assert f"{sys.version_info[0]}.{sys.version_info[1]}" == pins()["PYTHON_VERSION"]


def test_horovod_check_build_lists_frameworks_and_controllers():
    out = subprocess.run([str(BIN / "horovodrun"), "--check-build"], capture_output=True, text=True, check=True).stdout
    for name in ("TensorFlow", "PyTorch", "MPI", "Gloo"):
        assert re.search(rf"\[X\] {name}\b", out), out


def test_horovod_was_compiled_at_o3_without_debug_information():
    """The log of the build this environment's Horovod came from (kept beside its wheel in the
    cache entry docker/build-horovod.sh --print-entry names): every C and C++ compile of Horovod and
    its Gloo is -O3 (Horovod's RelWithDebInfo) without -g (docker/horovod-toolchain.cmake)."""
    entry = subprocess.run([str(REPO / "docker" / "build-horovod.sh"), "--print-entry"], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHON": sys.executable, "FLAVOR": "cpu"}).stdout.strip()
    if not entry:
        pytest.skip("HOROVOD_WHEEL_CACHE is empty: docker/build-horovod.sh kept no build log")
    log = (Path(entry) / "build.log").read_text()
    compiles = [line.split() for line in log.splitlines() if re.search(r"\s-c\s\S+\.cc?$", line)]
    assert len(compiles) > 100, log[-3000:]     # 143 in Horovod 0.28.1's CPU build
    assert all("-O3" in flags and "-g" not in flags for flags in compiles), [
        " ".join(flags) for flags in compiles if "-O3" not in flags or "-g" in flags][:3]


def test_openmpi_is_the_pinned_4_1_with_orte():
    info = subprocess.run(["ompi_info", "--parsable"], capture_output=True, text=True, check=True).stdout
    assert f"ompi:version:full:{pins()['OPENMPI_VERSION']}" in info.splitlines()
    assert subprocess.run(["which", "orted"], capture_output=True).returncode == 0   # the toolkit waits for it


def test_mpirun_wrapper_runs_a_job_as_root_with_our_defaults():
    """Binding none, and on this host with no GPU, ranks that yield while they wait in MPI
    (OMPI_MCA_mpi_yield_when_idle=1, passed to every rank), unless the caller set it."""
    assert "--allow-run-as-root" in (BIN / "mpirun").read_text()
    assert not list(Path("/dev").glob("nvidia[0-9]*")), "this test is for a host with no GPU"
    ranks = "echo $OMPI_COMM_WORLD_RANK $OMPI_MCA_hwloc_base_binding_policy ${OMPI_MCA_mpi_yield_when_idle:-unset}"
    for caller, yield_when_idle in (({}, "1"), ({"OMPI_MCA_mpi_yield_when_idle": "0"}, "0")):
        env = {k: v for k, v in os.environ.items() if k != "OMPI_MCA_mpi_yield_when_idle"} | caller
        done = subprocess.run([str(BIN / "mpirun"), "-np", "2", "sh", "-c", ranks],
                              capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split("\n")[:2]) == [f"0 none {yield_when_idle}", f"1 none {yield_when_idle}"]
