"""The pure parts of this image's fixes to sagemaker-training's contract: SM_* naming our master,
the network interface fallback, naming a lost peer by host from what Gloo and TensorFlow print,
and the end notice over a real socket (tests/integration/test_contract_fixes.py runs `train`)."""

import json

import pytest

from dtc_entrypoint import config as job_config


def test_aligned_sm_env_names_rank_0s_host_as_master():
    toolkit_env = {"SM_HOSTS": '["algo-1", "algo-10", "algo-2"]',
                   "SM_TRAINING_ENV": json.dumps({"hosts": ["algo-1", "algo-10", "algo-2"],
                                                  "master_hostname": "algo-10", "is_master": True, "lr": 1})}
    hosts = ("algo-1", "algo-2", "algo-10")
    on_10 = job_config.aligned_sm_env(toolkit_env, hosts, "algo-1", "algo-10")
    on_1 = job_config.aligned_sm_env(toolkit_env, hosts, "algo-1", "algo-1")
    assert json.loads(on_10["SM_HOSTS"]) == list(hosts)
    assert json.loads(on_10["SM_TRAINING_ENV"]) == {"hosts": list(hosts), "master_hostname": "algo-1",
                                                    "is_master": False, "lr": 1}
    assert json.loads(on_1["SM_TRAINING_ENV"])["is_master"] is True


@pytest.mark.parametrize("configured, usable, chosen, warned", [
    ("eth0", ("eth0", "eth1"), "eth0", False),
    ("ethwe", ("eth0", "eth1"), "eth0", True),        # SDK v3 local mode's name, absent in the container
    ("ethwe", ("ens5",), "ens5", True),
    ("ethwe", (), "ethwe", False),                     # nothing known: keep what was asked for
])
def test_choose_interface(configured, usable, chosen, warned):
    from dtc_entrypoint import fabric

    name, warning = fabric.choose_interface(configured, usable)
    assert name == chosen and (warning is not None) == warned
    if warned:
        assert configured in warning and chosen in warning


@pytest.mark.parametrize("line, expected", [
    ("[rank0]: RuntimeError: [/w/gloo/transport/tcp/pair.cc:537] Read error [10.1.1.12]:64658: "
     "Connection reset by peer.",
     "host algo-2 stopped answering: the connection to its ranks was lost (10.1.1.12, Gloo; one of its ranks "
     "dying does the same, and that host's failure file then names it)"),
    ("[rank1]: RuntimeError: [/w/gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.1.1.12]:28354. This is",
     "host algo-2 stopped answering: the connection to its ranks was lost (10.1.1.12, Gloo; one of its ranks "
     "dying does the same, and that host's failure file then names it)"),
    ("Collective ops is aborted by: ... The following tasks are unhealthy (stopped sending heartbeats):\n"
     "/job:worker/replica:0/task:1",
     "host algo-2 stopped answering: TensorFlow task worker:1 there stopped sending heartbeats"),
    # a worker whose chief (task 0, the coordination service's leader) vanished: both seen here
    ("E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort UNAVAILABLE: recvmsg:Connection reset "
     "by peer\nAdditional GRPC error information from remote target /job:worker/replica:0/task:0 while calling "
     "/tensorflow.WorkerService/CompleteInstance:",
     "host algo-1 stopped answering: TensorFlow task worker:0 there reset its connection"),
    ("E0000 base_collective_executor.cc:252] BaseCollectiveExecutor::StartAbort DEADLINE_EXCEEDED: Deadline Exceeded\n"
     "\nRPC: /tensorflow.CoordinationService/Heartbeat",
     "host algo-1 stopped answering: TensorFlow's coordination service there (task worker:0) "
     "stopped taking heartbeats"),
])
def test_a_lost_peer_is_named_by_host_from_what_gloo_and_tensorflow_print(line, expected):
    """Gloo and TensorFlow name an address or a task; the failure's first line names the host."""
    from dtc_entrypoint import report

    text = report.describe_failure("builtin:pytorch", 1, ["Traceback (most recent call last):", *line.split("\n"),
                                                          "RuntimeError: boom"],
                                   peers={"10.1.1.12": "algo-2", "worker:1": "algo-2", "worker:0": "algo-1"})
    assert text.splitlines()[0].startswith(expected + " (the host or its container died")


def test_what_a_worker_hosts_tf_server_says_of_the_master_heads_its_failure():
    """A parameter-server worker host's tf_server logs the master's loss or the chief's failure;
    its own train makes that line the failure's first."""
    from dtc_entrypoint import report

    for said in (report.lost_host("algo-1", "its parameter server (algo-1:2223) closed and its train never said "
                                            "that training had ended"),
                 report.chief_failed("algo-1", 1)):
        text = report.describe_failure("builtin:tensorflow", 3, [f"2026-11-23 05:00:00,000 [tf_server] {said}"])
        assert text.splitlines()[0] == said


def test_the_end_notice_reaches_the_listener_and_a_closed_port_is_reported():
    """The master's word that training ended (``peers.send_end_notice``) over a real socket."""
    from dtc_entrypoint import peers
    from helpers import free_port

    port = free_port()
    listener = peers.EndNoticeListener(port)
    assert listener.wait(0.2) is None
    assert peers.send_end_notice([f"127.0.0.1:{port}", "127.0.0.1:1"], 143, timeout_s=2) == ["127.0.0.1:1"]
    assert listener.wait(5) == 143
    peers.send_end_notice([f"127.0.0.1:{port}"], 0)
    assert listener.wait(1) == 143        # the first word counts
