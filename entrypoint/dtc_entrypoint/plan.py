"""The launch plan: what one host runs, as data. Built by the pure ``launch*`` functions,
printed by ``train --plan`` and executed by ``supervise``, so a printed plan and a real run
cannot drift apart."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from . import forensics
from .hyperparameters import to_argv
from .stack_dump import ENV as STACKS_DIR_VARIABLE

if TYPE_CHECKING:
    from .config import JobConfig
    from .program import Program

# SM_* variables that describe *this* host. They are not forwarded from the MPI master to the
# other hosts' ranks (sagemaker-training forwards them all, so every rank saw the master's
# SM_CURRENT_HOST: aws/sagemaker-training-toolkit#158); ranks on other hosts get their own.
HOST_SPECIFIC_SM_VARS = frozenset({
    "SM_CURRENT_HOST", "SM_CURRENT_INSTANCE_TYPE", "SM_CURRENT_INSTANCE_GROUP",
    "SM_CURRENT_INSTANCE_GROUP_HOSTS", "SM_TRAINING_ENV", "SM_RESOURCE_CONFIG",
})


HEARTBEAT_VARIABLE = "DTC_HEARTBEAT_FILE"
# PyTorch's Flight Recorder dump file prefix (the rank is appended), and its older name
# (torch/csrc/distributed/c10d/FlightRecorder.hpp): NCCL's watchdog dumps there when a collective
# times out (TORCH_NCCL_DUMP_ON_TIMEOUT, on by default); its default is under $HOME/.cache.
FLIGHT_RECORDER_FILE_VARIABLES = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# MASTER_ADDR on one host, and torchrun's --master_addr there.
LOCAL_MASTER = "127.0.0.1"
# What AWS's PyTorch and TensorFlow containers set on every job, with their values, unless the
# job's environment sets them (aws/sagemaker-pytorch-training-toolkit
# sagemaker_pytorch_container/training.py: NCCL_DEBUG; aws/sagemaker-tensorflow-training-toolkit
# sagemaker_tensorflow_container/training.py: TF_CPP_MIN_LOG_LEVEL).
AWS_CONTAINER_DEFAULTS = {"NCCL_DEBUG": "WARN", "TF_CPP_MIN_LOG_LEVEL": "1"}


class Role(StrEnum):
    """What a host does in its plan (``LaunchPlan.role``)."""

    LAUNCHER = "launcher"        # runs the job's command
    MPI_WORKER = "mpi-worker"    # only serves the master's mpirun daemons
    CHIEF = "chief"              # the parameter-server chief (trains, with its servers beside it)
    TF_SERVER = "tf-server"      # a parameter-server host other than the chief's: servers only


@dataclass(frozen=True)
class Service:
    """A process a host runs beside its main command (a TensorFlow parameter server), started
    before it and stopped when it ends.

    Attributes:
        name: for logs (``ps:0``).
        argv: the command (no shell).
        env: variables added to the inherited environment (its own ``TF_CONFIG``).
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str]

    def to_dict(self) -> dict:
        return {"name": self.name, "argv": list(self.argv), "env": dict(self.env)}


@dataclass(frozen=True)
class LaunchPlan:
    """What this host runs.

    Attributes:
        strategy: the launcher's name (``launchers.Launcher.strategy``), set by ``launch.build``.
        role: ``launcher`` (runs the job's command), ``mpi-worker`` (only serves mpirun's remote
            daemons; ``argv`` is empty), ``chief`` or ``tf-server`` (parameter-server hosts).
        argv: the main command, never passed through a shell.
        env: variables added to the inherited environment.
        workdir: the directory the commands run in.
        hosts: the hosts taking part, in node-rank order (master first).
        master_host: the host that coordinates (mpirun, torchrun's store, the chief, worker 0).
        processes_per_host / world_size: data-parallel processes per host and in all.
        ranks: the global ranks this host's processes get.
        tasks: TensorFlow cluster tasks on this host (``chief:0``, ``ps:1``, ``worker:0``).
        tf_config: the main command's ``TF_CONFIG`` (also in ``env``), or ``None``.
        services: processes started before ``argv`` and stopped after it.
        end_notice: ``host:port`` addresses ``train`` sends the main command's exit code to when
            it ends, before stopping ``services`` (the parameter-server chief's word to the worker
            hosts, which otherwise could not tell the end of training from the loss of its host).
    """

    role: Role
    argv: tuple[str, ...]
    env: Mapping[str, str]
    workdir: str
    hosts: tuple[str, ...]
    master_host: str
    processes_per_host: int = 1
    world_size: int = 1
    ranks: tuple[int, ...] = (0,)
    tasks: tuple[str, ...] = ()
    tf_config: Mapping | None = None
    services: tuple[Service, ...] = ()
    end_notice: tuple[str, ...] = ()
    strategy: str = ""

    def to_dict(self) -> dict:
        """JSON-ready form (for ``train --plan`` and logs)."""
        return {
            "strategy": self.strategy, "role": self.role, "master_host": self.master_host,
            "hosts": list(self.hosts), "processes_per_host": self.processes_per_host,
            "world_size": self.world_size, "ranks": list(self.ranks), "tasks": list(self.tasks),
            "argv": list(self.argv), "env": dict(self.env), "workdir": self.workdir,
            "tf_config": json.loads(json.dumps(self.tf_config)) if self.tf_config is not None else None,
            "services": [s.to_dict() for s in self.services], "end_notice": list(self.end_notice),
        }


def job_env(config: JobConfig, program: Program) -> dict[str, str]:
    """The variables every launcher adds: the toolkit's ``SM_*`` set (with ``SM_USER_ARGS`` in
    our argv form), ``PYTHONPATH`` led by the code directory (the container's own ``PYTHONPATH``
    follows it, as the toolkit's does), unbuffered Python output, Python's fault handler (every
    thread's Python stack on stderr when a process dies of SIGSEGV, SIGABRT, SIGBUS, SIGFPE or
    SIGILL: a C++ library's abort at exit names where each thread was; docs.python.org
    ``faulthandler``), the folder where each Python process registers for its stacks
    (``stack_dump``: ``$DTC_STACKS_DIR``), the file a program may touch to say it is alive
    (``$DTC_HEARTBEAT_FILE``, ``supervise.StallRule``), the Flight Recorder's dump files in the
    job's forensics (``flight_recorder_dir``; unless the job's environment names its own), the
    warm pool's cache directories (``config.cache_env``), and what AWS's framework containers
    set on every job (``AWS_CONTAINER_DEFAULTS`` unless the job sets them;
    ``SM_DLC_TORCH_VERSION``, the image's PyTorch)."""
    env = dict(config.sm_env)
    env.update(config.cache_env)
    env["SM_USER_ARGS"] = json.dumps(to_argv(config.user_hyperparameters))
    env["SM_USER_ENTRY_POINT"] = program.name
    env["SAGEMAKER_BASE_DIR"] = config.base_dir
    env["PYTHONPATH"] = os.pathsep.join(p for p in (config.code_dir, config.inherited_pythonpath) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    env[STACKS_DIR_VARIABLE] = stacks_dir(config)
    env[HEARTBEAT_VARIABLE] = heartbeat_file(config)
    if not set(FLIGHT_RECORDER_FILE_VARIABLES) & set(config.inherited_names):
        env[FLIGHT_RECORDER_FILE_VARIABLES[0]] = os.path.join(flight_recorder_dir(config), "rank_")
    env.update({name: value for name, value in AWS_CONTAINER_DEFAULTS.items() if name not in config.inherited_names})
    if config.image_torch_version:
        env["SM_DLC_TORCH_VERSION"] = config.image_torch_version
    return env


def flight_recorder_dir(config: JobConfig) -> str:
    """Where NCCL's Flight Recorder dumps go: ``output/data/forensics/flight-recorder`` (uploaded
    with the job's output; ``train`` makes the folder, and removes it when the job leaves it empty)."""
    return forensics.folder(config.output_dir, "flight-recorder")


def stacks_dir(config: JobConfig) -> str:
    """Where the job's processes register for their stacks (``stack_dump``): under the job's
    output folder, outside ``output/data`` (what SageMaker uploads)."""
    return os.path.join(config.output_dir, ".stacks")


def heartbeat_file(config: JobConfig) -> str:
    """The file a program touches to say it is alive (``supervise.StallRule``)."""
    return os.path.join(config.output_dir, ".heartbeat")


def program_argv(config: JobConfig, program: Program, under_mpi4py: bool = False) -> list[str]:
    """The program with its interpreter and the user's hyperparameters as arguments."""
    if program.is_python:
        runner = [config.python, "-m", "mpi4py"] if under_mpi4py else [config.python]
        return runner + list(program.argv) + to_argv(config.user_hyperparameters)
    return list(program.argv) + to_argv(config.user_hyperparameters)


def master_env(config: JobConfig) -> dict[str, str]:
    """``MASTER_ADDR`` and ``MASTER_PORT``, as AWS's PyTorch container sets them on every job,
    with or without a distribution (aws/sagemaker-pytorch-training-toolkit,
    ``sagemaker_pytorch_container/training.py``: the master host and 7777), so that a script
    written for it (``dist.init_process_group("gloo", rank=hosts.index(current_host),
    world_size=len(hosts))`` on several instances) runs here unchanged. Differences: one host
    gets the loopback address (its name need not resolve outside SageMaker); the port is
    torchrun's (``DTC_TORCH_MASTER_PORT``, 7777 by default). Under torchrun, torchrun sets both."""
    master = config.master_host if len(config.hosts) > 1 else LOCAL_MASTER
    return {"MASTER_ADDR": master, "MASTER_PORT": str(config.ports["torch_master"])}


def network_env(config: JobConfig) -> dict[str, str]:
    """Pins NCCL and Gloo to the job's interface when several hosts take part (as the toolkit
    does for NCCL; aws/sagemaker-training-toolkit, ``mpi.py`` and
    ``torch_distributed.py``)."""
    if len(config.distribution_hosts) < 2:
        return {}
    iface = config.network_interface
    return {"NCCL_SOCKET_IFNAME": iface, "GLOO_SOCKET_IFNAME": iface}
