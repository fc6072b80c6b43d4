"""Multi-host MPI bootstrap: the master waits for the workers' sshd; workers serve mpirun.

SageMaker starts every host's container with ``train``. On the master, mpirun reaches the
other hosts over ssh (port 22) and starts ORTE's ``orted`` there; a worker host therefore only
runs sshd and waits, the way sagemaker-training's ``mpi.WorkerRunner`` does, but with bounded
waits: it leaves when its ``orted`` processes have ended instead of polling for a status file
for 20 minutes (sagemaker-contract.md c.1).
"""

import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence

import psutil

log = logging.getLogger(__name__)

SSH_PORT = 22
POLL_S = 1.0


def ensure_sshd() -> None:
    """Starts ``sshd`` unless one is listening already (images configure it; see Dockerfile)."""
    if any(p.info["name"] == "sshd" for p in psutil.process_iter(["name"])):
        return
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        raise RuntimeError("multi-host MPI needs sshd, which is not installed in this image")
    os.makedirs("/run/sshd", exist_ok=True)
    subprocess.run([sshd], check=True)


def wait_for_ports(hosts: Sequence[str], port: int, timeout_s: float,
                   clock: Callable[[], float] = time.monotonic) -> None:
    """Waits until every host accepts TCP connections on ``port``.

    Raises:
        TimeoutError: naming the hosts still unreachable after ``timeout_s`` seconds.
    """
    deadline = clock() + timeout_s
    pending = list(hosts)
    while pending:
        pending = [h for h in pending if not _accepts(h, port)]
        if pending and clock() > deadline:
            raise TimeoutError(
                f"hosts {pending} did not accept ssh on port {port} within {timeout_s:.0f} s: "
                "check the security group allows traffic between the job's hosts, or raise "
                "DTC_MPI_WAIT_FOR_WORKERS_TIMEOUT_S")
        if pending:
            time.sleep(POLL_S)


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def serve_as_worker(start_timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Runs sshd, waits for the master's mpirun to start ``orted`` here, and returns once every
    ``orted`` has exited.

    Raises:
        TimeoutError: no ``orted`` appeared within ``start_timeout_s`` seconds (the master failed
            before launching, or cannot reach this host).
    """
    ensure_sshd()
    deadline = clock() + start_timeout_s
    log.info("MPI worker: sshd is up; waiting up to %.0f s for the master's mpirun", start_timeout_s)
    while True:
        daemons = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "orted"]
        if daemons:
            break
        if clock() > deadline:
            raise TimeoutError(
                f"the MPI master did not start processes on this host within {start_timeout_s:.0f} s; "
                "see the master host's log (raise DTC_MPI_WORKER_START_TIMEOUT_S if it starts slowly)")
        time.sleep(POLL_S)
    log.info("MPI worker: mpirun's daemon is running; waiting for it to finish")
    psutil.wait_procs(daemons)
    log.info("MPI worker: the job's processes on this host have ended")
