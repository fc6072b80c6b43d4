"""A process the kernel's out-of-memory killer ends is named as such (#19 item 6): the container's
memory cgroup counts OOM kills (dtc_entrypoint.memory), so a SIGKILL during the job is reported as
running out of memory, with what to change, instead of a hint. Real containers with a memory
limit (podman --memory, no swap) and a program that fills more than it."""

import shutil

import pytest

from dtc_local import job_tree
from helpers import IMAGES, PROGRAMS, REPO, container

pytestmark = [pytest.mark.image,
              pytest.mark.skipif(not IMAGES["cpu"],
                                 reason="DTC_IMAGE is not set (make test builds the image and sets it)")]

LIMIT = "768m"


@pytest.mark.parametrize("mpi", [False, True], ids=["single", "mpi"])
def test_a_process_the_oom_killer_ends_is_named_as_out_of_memory(tmp_path, mpi):
    source = tmp_path / "source"
    source.mkdir()
    shutil.copy(PROGRAMS / "use_memory.py", source)
    hyperparameters = {"sagemaker_program": "use_memory.py", "sagemaker_submit_directory": "/opt/ml/input/source",
                       "megabytes": 2048}
    if mpi:   # two ranks; rank 1 fills the memory
        hyperparameters.update(sagemaker_mpi_enabled=True, sagemaker_mpi_num_of_processes_per_host=2, rank="1")
    root = tmp_path / "ml"
    job_tree.write(str(root), hyperparameters=hyperparameters)
    in_checkout = (REPO / "oom").exists()
    # Debian 12's conmon (2.1.6) marks an OOM kill with an empty file named "oom" in its working
    # directory, podman's (containers/conmon#504; conmon#514 fixed it upstream in 2024): run from the
    # test's own directory, so that the file does not land in the checkout
    done = container("run", "--rm", "--memory", LIMIT, "--memory-swap", LIMIT, "--network", "none",
                     "-v", f"{root}:/opt/ml", "-v", f"{source}:/opt/ml/input/source:ro", IMAGES["cpu"], "train",
                     timeout_s=300, cwd=tmp_path)
    assert in_checkout or not (REPO / "oom").exists(), "the OOM kill left a file named oom in the checkout"
    failure = (root / "output" / "failure").read_text()
    first = failure.splitlines()[0]
    assert done.returncode == 137, done.stderr[-3000:]
    if mpi:
        assert first == ("rank 1 on host algo-1 was killed by SIGKILL from the kernel's out-of-memory killer: the "
                         "container ran out of memory: lower batch-size or the processes per host, or use an instance "
                         "type with more memory"), failure
    else:
        assert first == ("use_memory.py was killed by SIGKILL from the kernel's out-of-memory killer (exit code 137): "
                         "the container ran out of memory: lower batch-size or the processes per host, or use an "
                         "instance type with more memory"), failure
