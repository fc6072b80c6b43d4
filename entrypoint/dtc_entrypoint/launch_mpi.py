"""The MPI launch plan (Horovod, mpi4py): ``mpirun`` on the master, a serving role elsewhere."""

from __future__ import annotations

import shlex
from types import MappingProxyType
from typing import TYPE_CHECKING

from . import rank_shim
from .plan import HOST_SPECIFIC_SM_VARS, LaunchPlan, Role, job_env, master_env, network_env, program_argv

if TYPE_CHECKING:
    from .config import JobConfig
    from .program import Program

# Prefixed to each rank's command on multi-host jobs: loads the SM_* identity of the host the
# rank runs on (written there by that host's entrypoint) and execs the program.
HOST_IDENTITY_MODULE = "dtc_entrypoint.host_identity"


HOROVOD_STALL_CHECK = "HOROVOD_STALL_CHECK_TIME_SECONDS"
HOROVOD_STALL_SHUTDOWN = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"


def horovod_stall_env(config: JobConfig) -> dict[str, str]:
    """Horovod's stall inspector set to warn within the job's stall timeout: every
    ``HOROVOD_STALL_CHECK_TIME_SECONDS`` (a third of ``config.stall_timeout_s``, at most Horovod's
    own 60 s) it names the ranks that did not submit a tensor the others wait for
    (horovod/common/stall_inspector.cc; Horovod's "Troubleshooting" docs). Its warnings are not
    progress (``report.horovod_stall_line``), so the job's own stall rule ends the job, with the
    start-up grace Horovod's shutdown would not give a first step, and names those ranks beside
    every rank's stack (``report.horovod_missing``). Nothing when the check is off or the
    container's environment sets ``HOROVOD_STALL_CHECK_TIME_SECONDS`` or
    ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` itself (the user's own settings win)."""
    timeout_s = config.stall_timeout_s
    if not timeout_s or {HOROVOD_STALL_CHECK, HOROVOD_STALL_SHUTDOWN} & set(config.inherited_names):
        return {}
    return {HOROVOD_STALL_CHECK: str(min(60, max(1, timeout_s // 3)))}


def split_custom_mpi_options(options: str) -> tuple[list[str], dict[str, str]]:
    """Splits ``sagemaker_mpi_custom_mpi_options`` like a shell, without running one.

    ``--NCCL_DEBUG <level>`` is taken out and returned as ``{"NCCL_DEBUG": level}``, as
    sagemaker-training's ``mpi._parse_custom_mpi_options`` does. Returns (mpirun args, env).
    """
    tokens = shlex.split(options)
    args: list[str] = []
    env: dict[str, str] = {}
    i = 0
    while i < len(tokens):
        if tokens[i] == "--NCCL_DEBUG" and i + 1 < len(tokens):
            env["NCCL_DEBUG"] = tokens[i + 1]
            i += 2
            continue
        args.append(tokens[i])
        i += 1
    return args, env


def _user_overrides(args: list[str]) -> tuple[set[str], set[str]]:
    """MCA parameter names and mpirun flags the user's options set, so ours step aside
    (appended duplicates cannot override an earlier -mca: aws/sagemaker-training-toolkit#70)."""
    mca: set[str] = set()
    flags: set[str] = set()
    for i, token in enumerate(args):
        if token in ("-mca", "--mca") and i + 1 < len(args):
            mca.add(args[i + 1])
        elif token.lstrip("-") in ("bind-to", "map-by", "tag-output", "np", "n", "host", "H"):
            flags.add(token.lstrip("-"))
    return mca, flags


def _host_ranks(config: JobConfig, per_host: int, world_size: int) -> tuple[int, ...]:
    """Ranks ``-map-by slot`` puts on this host: the hosts' slots are filled in ``--host`` order."""
    start = config.host_index * per_host
    return tuple(range(start, min(start + per_host, world_size)))


def mpi_plan(config: JobConfig, program: Program) -> LaunchPlan:
    """``mpirun`` across ``config.distribution_hosts`` on the master; ``mpi-worker`` elsewhere.

    The command mirrors sagemaker-training's ``mpi.MasterRunner._create_command``
    (aws/sagemaker-training-toolkit, ``src/sagemaker_training/mpi.py``) with these differences: one
    host runs as ``localhost`` (no ssh, no name resolution); the master's host-specific ``SM_*``
    variables are not forwarded, and on several hosts each rank loads its own host's
    (``host_identity``; toolkit #158); the user's custom options replace our defaults instead of
    being appended after them (#70); and the argv is never joined into a shell string (#128).
    """
    hosts = config.distribution_hosts
    per_host = config.processes_per_host
    world_size = config.mpi.num_processes or per_host * len(hosts)
    env = job_env(config, program)
    custom_args, custom_env = split_custom_mpi_options(config.mpi.custom_options)
    env.update(network_env(config))
    env.update(master_env(config))   # a script that maps OMPI_COMM_WORLD_* to torch.distributed's env://
    env.update(horovod_stall_env(config))
    env.update(custom_env)
    common = dict(workdir=program.workdir, hosts=hosts, master_host=config.master_host,
                  processes_per_host=per_host, world_size=world_size,
                  ranks=_host_ranks(config, per_host, world_size))
    if not config.is_master:
        return LaunchPlan(role=Role.MPI_WORKER, argv=(), env=MappingProxyType(env), **common)
    multi_host = len(hosts) > 1
    host_list = ",".join(f"{h}:{per_host}" for h in hosts) if multi_host else f"localhost:{per_host}"
    mca_set, flags_set = _user_overrides(custom_args)
    argv = ["mpirun"]
    if not flags_set & {"host", "H"}:
        argv += ["--host", host_list]
    if not flags_set & {"np", "n"}:
        argv += ["-np", str(world_size)]
    if "tag-output" not in flags_set:
        argv.append("--tag-output")
    defaults = [("pml", "ob1"), ("btl", "^openib"), ("orte_abort_on_non_zero_status", "1"),
                ("btl_vader_single_copy_mechanism", "none")]
    if config.num_gpus == 0:
        # CPU hosts: a rank waiting in MPI (Horovod's background thread negotiates every cycle)
        # yields the core to the ranks' compute threads instead of spinning on it. OpenMPI yields
        # only when it sees more ranks than slots; 2 Horovod ranks on 2 cores trained digits 2.4x
        # faster per epoch with it (docs/performance.md, 2026-11-25).
        defaults.append(("mpi_yield_when_idle", "1"))
    if multi_host:
        iface = config.network_interface
        defaults += [("btl_tcp_if_include", iface), ("oob_tcp_if_include", iface),
                     ("plm_rsh_no_tree_spawn", "1")]
    for name, value in defaults:
        if name not in mca_set and name.replace("_include", "_exclude") not in mca_set:  # OpenMPI takes one
            argv += ["-mca", name, value]
    if "bind-to" not in flags_set:
        argv += ["-bind-to", "none"]
    if "map-by" not in flags_set:
        argv += ["-map-by", "slot"]
    forwarded = sorted(set(config.inherited_names) | {k for k in env if k not in HOST_SPECIFIC_SM_VARS})
    for name in forwarded:
        argv += ["-x", name]
    argv += custom_args
    argv += [config.python, "-m", rank_shim.MODULE]   # lets a stopped rank finish saving (rank_shim)
    if multi_host:
        argv += [config.python, "-m", HOST_IDENTITY_MODULE]
    argv += program_argv(config, program, under_mpi4py=program.is_python)
    return LaunchPlan(role=Role.LAUNCHER, argv=tuple(argv), env=MappingProxyType(env), **common)
