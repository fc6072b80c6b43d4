"""Launch plans: pure functions from ``JobConfig`` and ``Program`` to the argv and environment.

Nothing here starts a process or reads files; ``supervise`` runs what these return, and
``train --plan`` (later) prints it, so a real run and a printed plan cannot drift apart.
"""

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .config import JobConfig
from .hyperparameters import to_argv
from .program import Program

# SM_* variables that describe *this* host. They are not forwarded from the MPI master to the
# other hosts' ranks (sagemaker-training forwards them all, so every rank saw the master's
# SM_CURRENT_HOST: aws/sagemaker-training-toolkit#158); ranks on other hosts get their own.
HOST_SPECIFIC_SM_VARS = frozenset({
    "SM_CURRENT_HOST", "SM_CURRENT_INSTANCE_TYPE", "SM_CURRENT_INSTANCE_GROUP",
    "SM_CURRENT_INSTANCE_GROUP_HOSTS", "SM_TRAINING_ENV", "SM_RESOURCE_CONFIG",
})


@dataclass(frozen=True)
class LaunchPlan:
    """What this host runs.

    Attributes:
        strategy: ``single`` or ``mpi``.
        role: ``launcher`` (starts the job: the only host for single, the master for MPI) or
            ``mpi-worker`` (hosts that only serve mpirun's remote daemons; ``argv`` is empty).
        argv: the command, never passed through a shell.
        env: variables added to the inherited environment.
        workdir: the directory the command runs in.
        hosts: the hosts taking part, master first.
        master_host: the host that runs the launcher.
    """

    strategy: str
    role: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str
    hosts: tuple[str, ...]
    master_host: str
    processes_per_host: int = 1
    world_size: int = 1

    def to_dict(self) -> dict:
        """JSON-ready form (for ``train --plan`` and logs)."""
        return {
            "strategy": self.strategy, "role": self.role, "argv": list(self.argv),
            "env": dict(self.env), "workdir": self.workdir, "hosts": list(self.hosts),
            "master_host": self.master_host, "processes_per_host": self.processes_per_host,
            "world_size": self.world_size,
        }


def job_env(config: JobConfig, program: Program) -> dict[str, str]:
    """The variables every launcher adds: the toolkit's ``SM_*`` set (with ``SM_USER_ARGS`` in
    our argv form), ``PYTHONPATH`` led by the code directory, and unbuffered Python output."""
    env = dict(config.sm_env)
    env["SM_USER_ARGS"] = json.dumps(to_argv(config.user_hyperparameters))
    env["SM_USER_ENTRY_POINT"] = program.name
    env["SAGEMAKER_BASE_DIR"] = config.base_dir
    env["PYTHONPATH"] = config.code_dir
    env["PYTHONUNBUFFERED"] = "1"
    return env


def program_argv(config: JobConfig, program: Program, under_mpi4py: bool) -> list[str]:
    """The program with its interpreter and the user's hyperparameters as arguments."""
    if program.is_python:
        runner = [config.python, "-m", "mpi4py"] if under_mpi4py else [config.python]
        return runner + list(program.argv) + to_argv(config.user_hyperparameters)
    return list(program.argv) + to_argv(config.user_hyperparameters)


def single_process_plan(config: JobConfig, program: Program) -> LaunchPlan:
    """One process on this host: ``python <program> <args>``."""
    return LaunchPlan(
        strategy="single", role="launcher",
        argv=tuple(program_argv(config, program, under_mpi4py=False)),
        env=MappingProxyType(job_env(config, program)), workdir=program.workdir,
        hosts=(config.current_host,), master_host=config.current_host,
    )


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


def mpi_plan(config: JobConfig, program: Program) -> LaunchPlan:
    """``mpirun`` across ``config.distribution_hosts`` on the master; a worker role elsewhere.

    The command mirrors sagemaker-training's ``mpi.MasterRunner._create_command``
    (sagemaker-contract.md c.1) with these differences: one host runs as ``localhost`` (no ssh,
    no name resolution); the master's host-specific ``SM_*`` variables are not forwarded (#158);
    the user's custom options replace our defaults instead of being appended after them (#70);
    and the argv is never joined into a shell string (#128).
    """
    hosts = config.distribution_hosts
    per_host = config.mpi.processes_per_host
    world_size = config.mpi.num_processes or per_host * len(hosts)
    env = job_env(config, program)
    custom_args, custom_env = split_custom_mpi_options(config.mpi.custom_options)
    env.update(custom_env)
    if not config.is_master:
        return LaunchPlan(
            strategy="mpi", role="mpi-worker", argv=(), env=MappingProxyType(env),
            workdir=program.workdir, hosts=hosts, master_host=config.master_host,
            processes_per_host=per_host, world_size=world_size,
        )
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
    if multi_host:
        iface = config.network_interface
        defaults += [("btl_tcp_if_include", iface), ("oob_tcp_if_include", iface),
                     ("plm_rsh_no_tree_spawn", "1")]
        env.setdefault("NCCL_SOCKET_IFNAME", iface)
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
    argv += program_argv(config, program, under_mpi4py=program.is_python)
    return LaunchPlan(
        strategy="mpi", role="launcher", argv=tuple(argv), env=MappingProxyType(env),
        workdir=program.workdir, hosts=hosts, master_host=config.master_host,
        processes_per_host=per_host, world_size=world_size,
    )


def build(config: JobConfig, program: Program) -> LaunchPlan:
    """The plan for this host. MPI applies only on hosts of the distribution groups; other hosts
    of a heterogeneous cluster run the program alone, as sagemaker-training's ``trainer.train``
    does."""
    if config.mpi.enabled and config.is_distributed_host:
        return mpi_plan(config, program)
    return single_process_plan(config, program)
