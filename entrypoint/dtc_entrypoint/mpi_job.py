"""An MPI job's parts on its hosts besides the master's ``mpirun`` (``launchers``: the MPI record).

On several hosts the master's ``mpirun`` starts every rank over ssh; the other hosts' ``train``
only serves it (``mpi_hosts.serve_as_worker``) and gives its verdict; the master starts sshd,
waits for the workers' sshd, and watches it while the job runs.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import TYPE_CHECKING

from . import env_settings, forensics, host_identity, mpi_hosts, peers, rank_shim, report, stack_dump
from .errors import EXIT_INTERNAL_ERROR, EXIT_PEER_ERROR
from .plan import HOST_SPECIFIC_SM_VARS, LaunchPlan, Role, stacks_dir

if TYPE_CHECKING:
    from .config import JobConfig

log = logging.getLogger("dtc")


def host_part(config: JobConfig, plan: LaunchPlan, program_name: str) -> int | None:
    """Before the plan's command, on several hosts: writes this host's identity for the ranks
    the master's mpirun starts here (``host_identity``); a worker host then serves mpirun and
    returns its exit code (``serve_worker``); the master starts sshd and waits for the others'
    (``$DTC_MPI_WAIT_FOR_WORKERS_TIMEOUT_S``, 600 s) and returns ``None`` to run ``mpirun``.

    Raises:
        PeerError: a worker host's sshd did not answer in time, naming it.
    """
    if len(plan.hosts) < 2:
        return None
    host_identity.write({k: v for k, v in config.sm_env.items() if k in HOST_SPECIFIC_SM_VARS},
                        host_identity.host_env_file())
    if plan.role == Role.MPI_WORKER:
        return serve_worker(config, plan, program_name)
    mpi_hosts.ensure_sshd()
    workers = [h for h in plan.hosts if h != config.current_host]
    mpi_hosts.wait_for_workers(workers, env_settings.seconds("DTC_MPI_WAIT_FOR_WORKERS_TIMEOUT_S", 600))
    return None


def ssh_daemons(plan: LaunchPlan, current_host: str) -> dict[tuple[str, int], str]:
    """The master's watch: the other hosts' sshd, which outlives their ranks (mpirun would
    otherwise wait on a silently lost host's daemon until the job's MaxRuntime)."""
    return {(host, mpi_hosts.SSH_PORT): "sshd" for host in plan.hosts if host != current_host}


def serve_worker(config: JobConfig, plan: LaunchPlan, program_name: str) -> int:
    """An MPI worker host's part (``mpi_hosts.serve_as_worker``) and its verdict: stopped, a rank
    here failed (its ``rank_shim`` note), a rank here ended unfinished (the master's mpirun
    aborted the job), or success. Returns the exit code."""
    rank_shim.clear_outcomes()
    stop = mpi_hosts.serve_as_worker(plan.master_host, env_settings.seconds("DTC_MPI_WORKER_START_TIMEOUT_S", 600))
    if stop:
        report.write_failure(config.output_dir, f"{program_name} was stopped by {signal.Signals(stop).name}\n")
        return 128 + stop
    if os.path.exists(os.path.join(config.output_dir, "failure")):   # written here during the job
        log.error("training failed on this host: see %s", os.path.join(config.output_dir, "failure"))
        return EXIT_INTERNAL_ERROR
    failed = [note for note in rank_shim.recorded_outcomes() if note["exit_code"]]
    unfinished = ", ".join(map(str, rank_shim.unfinished(plan.ranks)))
    if failed or unfinished:
        master_up = peers.accepts(plan.master_host, mpi_hosts.SSH_PORT)
        if failed:
            text, code = failed[0]["text"], failed[0]["exit_code"]
        elif not master_up:   # mpirun's daemon lost the master
            text, code = report.lost_host(plan.master_host, f"mpirun's daemon here lost it and ended rank {unfinished} "
                                                            "before they finished"), EXIT_PEER_ERROR
        else:
            text, code = (f"rank {unfinished} on host {config.current_host} did not finish: mpirun's daemon ended it "
                          f"because the master's mpirun (host {plan.master_host}) ended the job"), EXIT_INTERNAL_ERROR
        kept = stack_dump.dumped(stacks_dir(config))   # asked for by the master's stall rule
        if kept:
            text += f" (its ranks' stacks: {forensics.keep(kept, config.output_dir)})"
        report.write_failure(config.output_dir, text + "\n\nThe master host's failure file has the job's whole "
                             "account (its mpirun saw every rank's output).\n")
        log.error("training failed on this host: %s", text)
        if master_up:   # the master is ending the job: its account (every rank's output) goes out first
            wait_s = env_settings.seconds("DTC_MPI_WORKER_MASTER_EXIT_WAIT_S", 60)
            log.info("waiting up to %.0f s for the master %s to exit first", wait_s, plan.master_host)
            mpi_hosts.wait_for_master_to_exit(plan.master_host, wait_s)
        return code
    report.write_success(config.output_dir)
    return 0
