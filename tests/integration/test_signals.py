"""SageMaker stops a job (and a spot interruption ends one) with SIGTERM to the container's main
process: `train` must pass it to the training processes, under MPI to every rank."""

import os
import shutil
import signal
import subprocess
import time

import pytest

from helpers import BIN, PROGRAMS, copy_programs, processes_of_job


@pytest.mark.parametrize("mpi_processes, save_seconds", [(None, 0), (2, 0), (None, 8), (2, 8)])
def test_sigterm_reaches_every_training_process(make_job, source_dir, mpi_processes, save_seconds):
    """Every rank gets the signal, and one whose handler takes 8 s to save (a checkpoint) is given
    the time: mpirun alone would kill it about 2 s after the signal (rank_shim)."""
    source_dir.mkdir()
    shutil.copy(PROGRAMS / "wait_for_sigterm.py", source_dir)
    hps = {"sagemaker_program": "wait_for_sigterm.py", "sagemaker_submit_directory": str(source_dir),
           "save-seconds": save_seconds}
    if mpi_processes:
        hps.update(sagemaker_mpi_enabled=True, sagemaker_mpi_num_of_processes_per_host=mpi_processes)
    root = make_job(hps)
    data = root / "output" / "data"
    ranks = [str(r) for r in range(mpi_processes)] if mpi_processes else ["single"]
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "PATH": f"{BIN}:{os.environ['PATH']}"}
    train = subprocess.Popen([str(BIN / "train")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not all((data / f"started-{r}").exists() for r in ranks):
        assert train.poll() is None and time.monotonic() < deadline, train.stderr.read().decode()[-2000:]
        time.sleep(0.2)

    train.send_signal(signal.SIGTERM)
    returncode = train.wait(timeout=60)

    assert returncode == 128 + signal.SIGTERM
    for rank in ranks:
        assert (data / f"sigterm-{rank}").read_text() == "SIGTERM"
    assert (root / "output" / "failure").read_text().splitlines()[0] == "wait_for_sigterm.py was stopped by SIGTERM"
    assert not (root / "output" / "success").exists()
    assert processes_of_job(root) == []


def test_a_stop_before_training_starts_ends_the_job_there_and_says_so(make_job, source_dir):
    """SIGTERM while `train` waits for another host (here one whose name never resolves): exit 143
    at once, and the failure file names the phase; the toolkit would die without a word."""
    copy_programs(source_dir, "wait_for_sigterm.py")
    root = make_job({"sagemaker_program": "wait_for_sigterm.py", "sagemaker_submit_directory": str(source_dir),
                     "sagemaker_mpi_enabled": True}, hosts=["algo-1", "algo-2"], current_host="algo-1")
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(root), "PATH": f"{BIN}:{os.environ['PATH']}",
           "DTC_HOST_RESOLVE_TIMEOUT_S": "300"}
    train = subprocess.Popen([str(BIN / "train")], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    for line in train.stderr:    # until it waits for algo-2's name
        if "waiting for the names of algo-2" in line:
            break
    train.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    returncode = train.wait(timeout=30)
    assert returncode == 128 + signal.SIGTERM and time.monotonic() - signalled < 5, returncode
    assert (root / "output" / "failure").read_text().splitlines()[0] == (
        "stopped by SIGTERM while waiting for the other hosts, before training started")
    assert not (root / "output" / "data" / "started-single").exists()
