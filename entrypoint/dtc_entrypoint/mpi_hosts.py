"""Multi-host MPI bootstrap: the master waits for the workers' sshd; workers serve mpirun.

SageMaker starts every host's container with ``train``. On the master, mpirun reaches the
other hosts over ssh (port 22) and starts ORTE's ``orted`` there; a worker host therefore only
runs sshd and waits, the way sagemaker-training's ``mpi.WorkerRunner`` does, but with bounded
waits: it leaves when its ``orted`` processes have ended, or when the master's sshd has gone
away before starting any, or while they run, instead of polling for a status file for 20
minutes (aws/sagemaker-training-toolkit, ``mpi.py``).
"""

import io
import logging
import os
import shlex
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable

import psutil

from . import peers, rank_shim, report, stack_dump
from .errors import PeerError

log = logging.getLogger(__name__)

SSH_PORT = 22
POLL_S = 1.0
MASTER_CHECK_EVERY_S = 5.0


def ensure_sshd() -> None:
    """Starts ``sshd`` unless one is running already (images configure it; see Dockerfile)."""
    if any(p.info["name"] == "sshd" for p in psutil.process_iter(["name"])):
        return
    sshd = shutil.which("sshd") or "/usr/sbin/sshd"
    if not os.path.exists(sshd):
        raise RuntimeError("multi-host MPI needs sshd, which is not installed in this image")
    os.makedirs("/run/sshd", exist_ok=True)
    subprocess.run([sshd], check=True)


def wait_for_workers(workers: list[str], timeout_s: float) -> None:
    """The master's wait for every worker's sshd (``DTC_MPI_WAIT_FOR_WORKERS_TIMEOUT_S``).

    Raises:
        PeerError: naming the unreachable hosts.
    """
    peers.wait_for_ports(workers, SSH_PORT, timeout_s, "ssh", "raise DTC_MPI_WAIT_FOR_WORKERS_TIMEOUT_S")


def wait_for_master_to_exit(master_host: str, timeout_s: float, port: int = SSH_PORT, poll_s: float = 1.0,
                            clock: Callable[[], float] = time.monotonic) -> bool:
    """A worker host's last wait after its ranks failed or were ended by the master's mpirun: until
    the master's sshd (``port``) stops answering (its container has exited), ``timeout_s`` seconds have
    passed, or SIGTERM/SIGINT arrives (its job is being stopped), whichever comes first. The caller
    has just seen the master's sshd answer (``mpi_job``: ``peers.accepts``), so one that stops
    before this wait's first connection ends it at that connection, not at ``timeout_s``.

    The master's mpirun collected every rank's output and its ``train`` writes the job's whole
    account; a worker that exits first can cut that account short where the first container to
    exit stops the others: the SageMaker SDK's local mode runs ``docker compose up
    --abort-on-container-exit`` (``sagemaker/local/image.py``), which stops the master before its
    log has reached compose (seen: a two-host job's traceback ending after its first line).

    Returns:
        whether the master's sshd stopped answering within ``timeout_s``.
    """
    stopped: list[int] = []

    def on_stop(signum, _frame):
        stopped.append(signum)

    previous = {sig: signal.signal(sig, on_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        deadline = clock() + timeout_s
        master = (master_host, port)
        gone = peers.watch_until_one_closes([master], closed_checks=1, poll_s=poll_s, seen_up=[master],
                                            stop=lambda: bool(stopped) or clock() > deadline)
        return gone is not None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _orted() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "orted"]


def _orted_alive() -> list[psutil.Process]:
    """The ``orted`` processes still running (those that exited are reaped: a daemonized
    ``orted`` is this process's child once its first process has exited)."""
    return psutil.wait_procs(_orted(), timeout=0)[1]


def _end_local_ranks() -> None:
    """SIGKILL to whatever is left of this host's ranks: ``orted`` and every process started for
    a rank (``OMPI_COMM_WORLD_RANK`` in its environment: the shim, its program, the program's
    own children), wherever it was reparented (a shim killed by ``orted`` leaves its program
    behind, possibly blocked in a collective)."""
    for process in psutil.process_iter(["name"]):
        try:
            if process.info["name"] == "orted" or "OMPI_COMM_WORLD_RANK" in process.environ():
                process.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def serve_as_worker(master_host: str, start_timeout_s: float, clock: Callable[[], float] = time.monotonic
                    ) -> int | None:
    """Runs sshd, waits for the master's mpirun to start ``orted`` here, and returns once every
    ``orted`` has exited, killing what its ranks left behind.

    While ``orted`` runs, the master's sshd is watched (``peers.watch_until_one_closes``): a
    master that stops answering (its host or container died, or the network to it failed) ends
    this host's ranks, which would otherwise wait in a collective until the job's MaxRuntime.

    SIGTERM or SIGINT (SageMaker stops every host's container) goes to this host's ranks through
    their ``rank_shim``, and the wait goes on while they finish (mpirun's daemon must outlive
    them, or the master's mpirun would abort every rank, the master's included, at once). A stop
    before any ``orted`` has started ends the wait at once.

    Returns:
        the stop signal received, or ``None``.

    Raises:
        PeerError: no ``orted`` appeared within ``start_timeout_s`` seconds; the master's sshd
            answered and then went away before starting ``orted`` here (its job ended or failed
            first); or it went away while ``orted`` ran (``report.lost_host``).
    """
    stopped: list[int] = []

    def on_stop(signum, _frame):
        if not stopped:
            log.warning("received %s: passing it to this host's ranks", signal.Signals(signum).name)
        stopped.append(signum)
        log.info("passed %s to %d rank shim(s)", signal.Signals(signum).name, rank_shim.signal_shims(signum))

    previous = {sig: signal.signal(sig, on_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        ensure_sshd()
        deadline = clock() + start_timeout_s
        log.info("MPI worker: sshd is up; waiting up to %.0f s for the master %s to start mpirun", start_timeout_s,
                 master_host)
        master_seen, next_check = False, clock()
        while not (daemons := _orted()):
            if stopped:
                return stopped[0]
            if clock() > deadline:
                raise PeerError(
                    f"the MPI master {master_host} did not start processes on this host within "
                    f"{start_timeout_s:.0f} s; "
                    "see the master host's log (raise DTC_MPI_WORKER_START_TIMEOUT_S if it starts slowly)")
            if clock() >= next_check:
                next_check = clock() + MASTER_CHECK_EVERY_S
                up = peers.accepts(master_host, SSH_PORT)
                if master_seen and not up and not _orted():
                    raise PeerError(f"the MPI master {master_host} went away before starting processes on this "
                                    "host; see the master host's log")
                master_seen = master_seen or up
            time.sleep(POLL_S)
        log.info("MPI worker: mpirun's daemon is running; waiting for it to finish")
        # a stopped job's master may go first: then only wait for the ranks to finish saving
        lost = peers.watch_until_one_closes([(master_host, SSH_PORT)], stop=lambda: bool(stopped) or not _orted_alive())
        if lost:
            _end_local_ranks()
            raise PeerError(report.lost_host(master_host, "the MPI master's sshd stopped answering while this host's "
                                                          "ranks ran; they were ended"))
        # `orted --daemonize` forks and its first process exits at once: the poll above may have
        # seen only that one, so look again until no orted is left (the daemon's ranks run on)
        while daemons:
            psutil.wait_procs(daemons)
            daemons = _orted()
        log.info("MPI worker: the job's processes on this host have ended")
        _end_local_ranks()
        return stopped[0] if stopped else None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def fetch_stacks(hosts: list[str], directory: str, wait_s: float = stack_dump.REQUEST_WAIT_S,
                 poll_s: float = 1.0) -> list[str]:
    """The stacks the ranks on the other ``hosts`` wrote into their own ``directory`` (the same
    path on every host: ``plan.stacks_dir``) after the master's mpirun passed them ``SIGUSR2``,
    copied over ssh (the channel mpirun itself uses: ``ssh HOST tar``) into
    ``<directory>/<host>/``. A host whose files hold no dump yet is asked again every ``poll_s``
    until ``wait_s`` has passed; a host ssh cannot reach gives none (logged). Returns the local
    paths of the copies that hold a dump (``stack_dump.dumped``)."""
    found: list[str] = []
    deadline = time.monotonic() + wait_s
    for host in hosts:
        local = os.path.join(directory, host)
        while True:
            command = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", host,
                       f"tar -C {shlex.quote(directory)} -cf - ."]
            try:
                done = subprocess.run(command, capture_output=True, timeout=20, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                log.warning("cannot copy the stacks of host %s: ssh did not answer within 20 s", host)
                break
            if done.returncode != 0 or not done.stdout:
                log.warning("cannot copy the stacks of host %s (ssh exit code %d): %s", host, done.returncode,
                            done.stderr.decode(errors="replace").strip()[-300:])
                break
            shutil.rmtree(local, ignore_errors=True)
            os.makedirs(local)
            with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
                for member in archive.getmembers():   # the registrations only, by their own names
                    name = os.path.basename(member.name)
                    if member.isfile() and name.startswith("pid") and name.endswith(".txt"):
                        with open(os.path.join(local, name), "wb") as copy:
                            copy.write(archive.extractfile(member).read())
            dumps = stack_dump.dumped(local)
            if dumps or time.monotonic() >= deadline:
                found += dumps
                break
            time.sleep(poll_s)
    return found
