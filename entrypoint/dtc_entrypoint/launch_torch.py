"""The ``torch_distributed`` launch plan: torchrun with static rendezvous on every host."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from .hyperparameters import to_argv
from .plan import LOCAL_MASTER, LaunchPlan, Role, job_env, network_env

if TYPE_CHECKING:
    from .config import JobConfig
    from .program import Program


def torchrun_plan(config: JobConfig, program: Program) -> LaunchPlan:
    """``torchrun`` (``python -m torch.distributed.run``) on every host of the job.

    Mirrors sagemaker-training's ``TorchDistributedRunner._create_command``
    (aws/sagemaker-training-toolkit, ``torch_distributed.py``): ``--nnodes <hosts> --nproc_per_node
    <processes per host> --master_addr <master> --master_port <port> --node_rank <host index>``,
    static rendezvous, no ssh. Differences: node ranks follow the one master rule every host applies
    (not the unsorted ``instance_groups`` order); the master flags are kept on one host (loopback
    address), so the port setting always applies; ``NCCL_PROTO=simple`` is not forced; Python
    modules and executables are accepted (``-m``, ``--no-python``), not only ``.py`` files.
    """
    hosts = config.distribution_hosts
    per_host = config.processes_per_host
    master = config.master_host if len(hosts) > 1 else LOCAL_MASTER
    argv = [config.python, "-m", "torch.distributed.run",
            "--nnodes", str(len(hosts)), "--nproc_per_node", str(per_host),
            "--node_rank", str(config.host_index),
            "--master_addr", master, "--master_port", str(config.ports["torch_master"])]
    if not program.is_python:
        argv.append("--no-python")
    argv += list(program.argv) + to_argv(config.user_hyperparameters)
    env = job_env(config, program)
    env.update(network_env(config))
    start = config.host_index * per_host
    return LaunchPlan(
        role=Role.LAUNCHER, argv=tuple(argv), env=MappingProxyType(env),
        workdir=program.workdir, hosts=hosts, master_host=config.master_host, processes_per_host=per_host,
        world_size=per_host * len(hosts), ranks=tuple(range(start, start + per_host)),
    )
