"""The parameter-server chief's watch of the other hosts' TensorFlow servers (ps_job, cli._peer_watch):
ParameterServerStrategy's coordinator waits for a lost worker forever, so `train` must report a
worker host whose servers went away even when they went before the watch's first poll (CI's run on
2026-12-04 08:55 UTC: the worker host cut off right after the chief's first epoch, moments after its
servers came up; the chief never ended)."""

import socket
import threading
import time

import pytest

from dtc_entrypoint import cli, launch, launchers, ps_job
from dtc_entrypoint.errors import PeerError
from helpers import PLAIN_SCRIPT, config_for, free_ports


def listener(port: int) -> socket.socket:
    server = socket.create_server(("127.0.0.1", port))
    server.listen()
    return server


def chief_plan(task_port: int, ps_port: int):
    """A two-host parameter-server job seen from its chief's host (127.0.0.1); the other host is
    ``localhost``, so its servers are this machine's ports."""
    ports = launchers.ports_from({"DTC_TF_TASK_PORT": str(task_port), "DTC_TF_PS_PORT": str(ps_port)})
    config = config_for(hosts=("127.0.0.1", "localhost"), current="127.0.0.1", strategy="parameter_server", ports=ports)
    return config, launch.build(config, PLAIN_SCRIPT)


def test_the_chief_watches_the_other_hosts_servers_and_nothing_on_one_host():
    task_port, ps_port = free_ports(2)
    config, plan = chief_plan(task_port, ps_port)
    assert ps_job.tensorflow_servers(plan, "127.0.0.1") == {("localhost", task_port): "TensorFlow worker:0 server",
                                                             ("localhost", ps_port): "TensorFlow ps:1 server"}
    worker = launch.build(config_for(hosts=("127.0.0.1", "localhost"), current="localhost", strategy="parameter_server",
                              ports=config.ports), PLAIN_SCRIPT)
    assert ps_job.tensorflow_servers(worker, "localhost") == {}
    one_host = launch.build(config_for(strategy="parameter_server"), PLAIN_SCRIPT)   # the chief's own services
    assert ps_job.tensorflow_servers(one_host, "algo-1") == {}
    assert ps_job.host_part(config_for(strategy="parameter_server"), one_host, "train.py") is None


def test_the_chief_waits_for_every_server_and_names_the_one_that_never_answers(monkeypatch):
    task_port, ps_port = free_ports(2)
    config, plan = chief_plan(task_port, ps_port)
    servers = []
    late = threading.Timer(1.0, lambda: servers.extend([listener(task_port), listener(ps_port)]))
    late.start()
    try:
        started = time.monotonic()
        assert ps_job.host_part(config, plan, "train.py") is None
        assert time.monotonic() - started >= 1.0                 # it waited for the late servers
    finally:
        late.join()
        for server in servers:
            server.close()

    monkeypatch.setenv("DTC_TF_SERVER_START_TIMEOUT_S", "1")
    with listener(task_port):                                    # the parameter server never answers
        with pytest.raises(PeerError) as raised:
            ps_job.host_part(config, plan, "train.py")
    first_line = str(raised.value).splitlines()[0]
    assert first_line.startswith("host localhost could not be reached: it did not accept TensorFlow ps:1 server on "
                                 f"port {ps_port} within 1 s"), first_line
    assert "raise DTC_TF_SERVER_START_TIMEOUT_S" in first_line


def test_servers_that_close_before_the_watchs_first_poll_are_reported():
    task_port, ps_port = free_ports(2)
    config, plan = chief_plan(task_port, ps_port)
    with listener(task_port), listener(ps_port):
        assert ps_job.host_part(config, plan, "train.py") is None   # seen up here ...
    watch = cli._peer_watch(plan, "127.0.0.1", config.ports)       # ... and gone before the watch starts
    started = time.monotonic()
    lost = watch(lambda: time.monotonic() - started > 20)
    assert lost is not None and lost.startswith("host localhost stopped answering: its TensorFlow worker:0 server "
                                                f"(localhost:{task_port}) stopped answering while the job ran"), lost
