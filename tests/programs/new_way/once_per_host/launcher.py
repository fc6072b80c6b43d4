"""The ``once_per_host`` launcher: the program once on every host of the distribution, its host's
index as its rank. Registered under the entry-point group ``dtc.launchers``."""

from types import MappingProxyType

from dtc_entrypoint.launchers import Launcher, Port
from dtc_entrypoint.plan import LaunchPlan, Role, job_env, master_env, network_env, program_argv


def once_per_host_plan(config, program) -> LaunchPlan:
    """``python <program> <hyperparameters>`` on this host, with ``MASTER_ADDR``/``MASTER_PORT``
    and the job's network interface; rank = this host's index."""
    env = job_env(config, program)
    env.update(network_env(config))
    env.update(master_env(config))
    env["ONCE_PER_HOST_PORT"] = str(config.ports["once_per_host"])
    hosts = config.distribution_hosts
    return LaunchPlan(role=Role.LAUNCHER, argv=tuple(program_argv(config, program)), env=MappingProxyType(env),
                      workdir=program.workdir, hosts=hosts, master_host=config.master_host,
                      world_size=len(hosts), ranks=(config.host_index,))


LAUNCHER = Launcher(
    "once_per_host", once_per_host_plan, "the program once per host",
    flag="sagemaker_once_per_host_enabled", estimator_argument='distribution={"once_per_host": {"enabled": True}}',
    sdk_hyperparameters=MappingProxyType({"sagemaker_once_per_host_enabled": True}),
    ports=(Port("once_per_host", "DTC_ONCE_PER_HOST_PORT", 7010, "nothing: a port the test sees in the plan"),),
)
