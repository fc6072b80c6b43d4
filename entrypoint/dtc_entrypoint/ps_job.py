"""A parameter-server job's parts on the chief's host besides its program (``launchers``: the
parameter-server record): the other hosts' TensorFlow servers the chief's ``train`` watches, and
its wait for them before the program starts.

``ParameterServerStrategy``'s coordinator waits for a lost worker to come back, forever, so the
chief's ``train`` watches the other hosts' servers itself (``cli._peer_watch``). The watch reports
an endpoint only once it has seen it up; the chief waits for every one of them to answer before
its program starts, so the watch counts them as seen up from its start. Without that wait, a
worker host whose servers came up while the chief's program was already waiting for them could be
cut off before the watch's first poll (every 2 s) had seen them, and the chief waited for it
forever (CI's run on 2026-12-04 08:55 UTC:
``test_a_host_cut_off_without_a_word_ends_every_host_within_a_minute[parameter-server]``: the
host cut off right after the chief's first epoch, which ended 0.3 s after the worker host logged
that the chief was up; the chief's container killed by the harness 116 s later).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from . import env_settings, peers
from .plan import Role

if TYPE_CHECKING:
    from .config import JobConfig
    from .plan import LaunchPlan

START_TIMEOUT_VARIABLE = "DTC_TF_SERVER_START_TIMEOUT_S"   # the other hosts' wait for the chief's uses it too
START_TIMEOUT_S = 600.0


def tensorflow_servers(plan: LaunchPlan, current_host: str) -> dict[tuple[str, int], str]:
    """The chief's watch: the other hosts' TensorFlow servers, ``(host, port) -> "TensorFlow
    worker:1 server"`` (``{}`` on any other host, and on one host, where the chief's own
    services are the servers and start after this host's part)."""
    if plan.role != Role.CHIEF or len(plan.hosts) < 2:
        return {}
    endpoints = {}
    for job in ("worker", "ps"):
        for index, task in enumerate(plan.tf_config["cluster"].get(job, [])):
            host, _, port = task.rpartition(":")
            if host != current_host:
                endpoints[(host, int(port))] = f"TensorFlow {job}:{index} server"
    return endpoints


def host_part(config: JobConfig, plan: LaunchPlan, program_name: str) -> None:
    """Before the plan's command: on the chief's host, waits until every other host's TensorFlow
    server (``tensorflow_servers``) accepts connections, within ``$DTC_TF_SERVER_START_TIMEOUT_S``
    seconds (600) in all, the time the other hosts give the chief's; returns ``None`` (the plan's
    command runs next) on every host.

    Raises:
        PeerError: a server did not answer in time, naming its host, port and the variable.
    """
    endpoints = tensorflow_servers(plan, config.current_host)
    deadline = time.monotonic() + env_settings.seconds(START_TIMEOUT_VARIABLE, START_TIMEOUT_S)
    for (host, port), what in endpoints.items():
        peers.wait_for_ports([host], port, max(0.0, deadline - time.monotonic()), what,
                             f"raise {START_TIMEOUT_VARIABLE}")
    return None
