"""The ``single`` launch plan: the program alone on this host."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from .plan import LaunchPlan, Role, job_env, master_env, network_env, program_argv

if TYPE_CHECKING:
    from .config import JobConfig
    from .program import Program


def single_process_plan(config: JobConfig, program: Program) -> LaunchPlan:
    """One process on this host: ``python <program> <args>``, with ``MASTER_ADDR`` and
    ``MASTER_PORT`` (``plan.master_env``) and, on several hosts, the network interface
    (``plan.network_env``) for a script that joins the other hosts itself."""
    env = job_env(config, program)
    env.update(network_env(config))
    env.update(master_env(config))
    return LaunchPlan(
        role=Role.LAUNCHER, argv=tuple(program_argv(config, program)),
        env=MappingProxyType(env), workdir=program.workdir,
        hosts=(config.current_host,), master_host=config.current_host,
    )
