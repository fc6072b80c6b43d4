"""TensorFlow launch plans: MultiWorkerMirroredStrategy and TF2 ParameterServerStrategy.

``TF_CONFIG`` is written with plain ``json.dumps`` and ``"environment": "cloud"``, as the
TensorFlow toolkit's ``_build_tf_config_for_mwms`` / ``_build_tf_config_for_ps`` do
(aws/sagemaker-tensorflow-training-toolkit, ``src/sagemaker_tensorflow_container/training.py``);
host lists follow the one master rule every host applies.
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import TYPE_CHECKING

from .plan import LaunchPlan, Role, Service, job_env, network_env, program_argv

if TYPE_CHECKING:
    from .config import JobConfig
    from .program import Program

TF_SERVER_MODULE = "dtc_entrypoint.tf_server"


def _addresses(config: JobConfig) -> tuple[str, ...]:
    """The hosts as cluster addresses; a one-host job uses ``localhost`` (no name resolution)."""
    hosts = config.distribution_hosts
    return hosts if len(hosts) > 1 else ("localhost",)


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> dict:
    """A ``TF_CONFIG`` value: ``{"cluster": ..., "environment": "cloud", "task": {...}}``."""
    return {"cluster": cluster, "environment": "cloud", "task": {"index": index, "type": task_type}}


def multi_worker_mirrored_plan(config: JobConfig, program: Program) -> LaunchPlan:
    """One process per host with ``TF_CONFIG`` listing every host as a worker.

    ``cluster.worker`` is ``<host>:<DTC_TF_WORKER_PORT, 8890>`` for each host in node-rank order;
    this host's task is its index; worker 0 (the master) is the strategy's chief.
    """
    hosts = config.distribution_hosts
    cluster = {"worker": [f"{h}:{config.ports['tf_worker']}" for h in _addresses(config)]}
    task = tf_config(cluster, "worker", config.host_index)
    env = job_env(config, program)
    env.update(network_env(config))
    env["TF_CONFIG"] = json.dumps(task)
    return LaunchPlan(
        role=Role.LAUNCHER, argv=tuple(program_argv(config, program)),
        env=MappingProxyType(env), workdir=program.workdir, hosts=hosts, master_host=config.master_host,
        world_size=len(hosts), ranks=(config.host_index,), tasks=(f"worker:{config.host_index}",), tf_config=task,
    )


def parameter_server_cluster(config: JobConfig) -> dict[str, list[str]]:
    """The TF2 cluster: the chief on the master host, one worker on every other host, one
    parameter server on every host.

    Ports: chief and workers ``DTC_TF_TASK_PORT`` (2222), ps ``DTC_TF_PS_PORT`` (2223), the
    toolkit's. On a single host (``localhost``) the worker takes ``DTC_TF_PS_PORT + 1`` (2224),
    beside the chief.
    """
    hosts = _addresses(config)
    task, ps = config.ports["tf_task"], config.ports["tf_ps"]
    workers = [f"{h}:{task}" for h in hosts[1:]] or [f"{hosts[0]}:{ps + 1}"]
    return {"chief": [f"{hosts[0]}:{task}"], "worker": workers, "ps": [f"{h}:{ps}" for h in hosts]}


def parameter_server_plan(config: JobConfig, program: Program) -> LaunchPlan:
    """TF2 ``ParameterServerStrategy``: the master host runs the program as the chief (the
    ``ClusterCoordinator``) beside parameter server ``ps:0``; every other host runs ``ps:<i>``
    and ``worker:<i-1>``, plain ``tf.distribute.Server``s (``dtc_entrypoint.tf_server``).

    The TensorFlow toolkit only knows the TF1 layout (``master``/``worker``/``ps``, user code on
    every host; c.4), which ``ParameterServerStrategy`` rejects. Ending: the chief's host stops
    its parameter server when the program ends; every other host's worker server watches that
    port and leaves when it closes, stopping its own parameter server (the toolkit's hosts poll
    the master with curl and hung at exit: TF toolkit PR #120). Before stopping it, the master's
    ``train`` sends the chief's exit code to every other host (``end_notice``,
    ``DTC_TF_END_PORT``), so that the port closing without that word means the master's host was
    lost. Parameter servers see no GPU.
    """
    hosts = config.distribution_hosts
    cluster = parameter_server_cluster(config)
    index = config.host_index
    base = job_env(config, program)
    base.update(network_env(config))
    server_argv = (config.python, "-m", TF_SERVER_MODULE)

    def service(task_type: str, task_index: int, **extra: str) -> Service:
        env = {"TF_CONFIG": json.dumps(tf_config(cluster, task_type, task_index)), **extra}
        return Service(f"{task_type}:{task_index}", server_argv, MappingProxyType(env))

    services = [service("ps", index, CUDA_VISIBLE_DEVICES="")]
    common = dict(workdir=program.workdir, hosts=hosts,
                  master_host=config.master_host, world_size=len(cluster["worker"]), ranks=())
    if config.is_master:
        if len(hosts) == 1:
            services.append(service("worker", 0))
        task = tf_config(cluster, "chief", 0)
        env = {**base, "TF_CONFIG": json.dumps(task)}
        return LaunchPlan(role=Role.CHIEF, argv=tuple(program_argv(config, program)), env=MappingProxyType(env),
                          tasks=("chief:0",) + tuple(s.name for s in services), tf_config=task,
                          services=tuple(services),
                          end_notice=tuple(f"{h}:{config.ports['tf_end']}" for h in hosts[1:]), **common)
    task = tf_config(cluster, "worker", index - 1)
    master_ps = cluster["ps"][0]
    env = {**base, "TF_CONFIG": json.dumps(task)}
    argv = server_argv + ("--until-closed", master_ps, "--end-port", str(config.ports["tf_end"]))
    return LaunchPlan(role=Role.TF_SERVER, argv=argv, env=MappingProxyType(env),
                      tasks=(f"worker:{index - 1}", f"ps:{index}"),
                      tf_config=task, services=tuple(services), **common)
