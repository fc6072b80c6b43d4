"""Launch plans: pure functions from ``JobConfig`` and ``Program`` to this host's ``LaunchPlan``.

Nothing here starts a process or reads files; ``supervise`` runs what ``build`` returns and
``train --plan`` prints it. One module per launcher: ``launch_mpi``, ``launch_torch``,
``launch_tf``.
"""

from types import MappingProxyType

from . import launch_mpi, launch_tf, launch_torch
from . import strategy as strategies
from .config import JobConfig
from .plan import LaunchPlan, job_env, master_env, network_env, program_argv
from .program import Program


def single_process_plan(config: JobConfig, program: Program) -> LaunchPlan:
    """One process on this host: ``python <program> <args>``, with ``MASTER_ADDR`` and
    ``MASTER_PORT`` (``plan.master_env``) and, on several hosts, the network interface
    (``plan.network_env``) for a script that joins the other hosts itself."""
    env = job_env(config, program)
    env.update(network_env(config))
    env.update(master_env(config))
    return LaunchPlan(
        strategy=strategies.SINGLE, role="launcher", argv=tuple(program_argv(config, program)),
        env=MappingProxyType(env), workdir=program.workdir,
        hosts=(config.current_host,), master_host=config.current_host,
    )


_PLANS = {
    strategies.MPI: launch_mpi.mpi_plan,
    strategies.TORCH_DISTRIBUTED: launch_torch.torchrun_plan,
    strategies.MULTI_WORKER_MIRRORED: launch_tf.multi_worker_mirrored_plan,
    strategies.PARAMETER_SERVER: launch_tf.parameter_server_plan,
}


def build(config: JobConfig, program: Program) -> LaunchPlan:
    """The plan for this host. A strategy applies only on hosts of the distribution groups;
    the other hosts of a heterogeneous cluster run the program alone, as sagemaker-training's
    ``trainer.train`` does (aws/sagemaker-training-toolkit, ``trainer.py``)."""
    if config.strategy != strategies.SINGLE and config.is_distributed_host:
        return _PLANS[config.strategy](config, program)
    return single_process_plan(config, program)
