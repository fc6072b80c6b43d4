"""The local cluster's plumbing (`dtc_local.cluster`), without containers: how hosts find each other
(static addresses and a hosts entry for every host, no DNS plugin), the container environment,
and stopping the other hosts once one has failed (real processes)."""

import subprocess
import sys
import time

import pytest

from dtc_local import cluster


def _job(**kwargs) -> cluster.ClusterJob:
    return cluster.ClusterJob(image="dtc:cpu", instance_count=3, **kwargs)


def test_every_host_gets_a_static_address_and_an_entry_for_every_host():
    job = _job()
    assert cluster.host_addresses(job) == {"algo-1": "10.213.37.11", "algo-2": "10.213.37.12",
                                           "algo-3": "10.213.37.13"}
    argv = cluster.podman_run_argv(job, "algo-2", "/tmp/tree")
    assert argv[argv.index("--ip") + 1] == "10.213.37.12"
    hosts = [argv[i + 1] for i, a in enumerate(argv) if a == "--add-host"]
    assert hosts == ["algo-1:10.213.37.11", "algo-2:10.213.37.12", "algo-3:10.213.37.13"]
    assert "--network-alias" not in argv      # aliases need a DNS plugin, which CNI networks lack


def test_the_compose_file_carries_the_same_addresses_and_hosts_entries():
    job = _job(subnet="192.168.250.0/24")
    compose = cluster.compose_file(job, {h: f"/tmp/{h}" for h in job.hosts})
    network = compose["networks"][cluster.NETWORK]
    assert network["internal"] is True and network["ipam"] == {"config": [{"subnet": "192.168.250.0/24"}]}
    service = compose["services"]["algo-3"]
    assert service["networks"] == {cluster.NETWORK: {"ipv4_address": "192.168.250.13"}}
    assert service["extra_hosts"] == ["algo-1:192.168.250.11", "algo-2:192.168.250.12", "algo-3:192.168.250.13"]


def test_local_waits_are_short_and_the_jobs_environment_wins():
    job = _job(environment={"DTC_MPI_WAIT_FOR_WORKERS_TIMEOUT_S": "90", "NCCL_DEBUG": "INFO"})
    env = cluster.container_env(job)
    assert env["DTC_HOST_RESOLVE_TIMEOUT_S"] == "10" and env["DTC_MPI_WAIT_FOR_WORKERS_TIMEOUT_S"] == "90"
    assert env["NCCL_DEBUG"] == "INFO"
    argv = cluster.podman_run_argv(job, "algo-1", "/tmp/tree")
    assert ["--env", "NCCL_DEBUG"] == argv[argv.index("NCCL_DEBUG") - 1:argv.index("NCCL_DEBUG") + 1]
    assert "INFO" not in argv                 # values travel in the environment, not the command line


def test_a_subnet_too_small_for_the_hosts_is_refused():
    with pytest.raises(ValueError, match="too small for 3 hosts"):
        cluster.host_addresses(_job(subnet="10.0.0.0/29"))


def _sleeper(code: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import sys, time; time.sleep({seconds}); sys.exit({code})"])


def test_once_a_host_fails_the_others_are_stopped_after_the_grace_period():
    procs = {"algo-1": _sleeper(0, 600), "algo-2": _sleeper(7, 0.2), "algo-3": _sleeper(0, 600)}
    stopped = []

    def stop(host):
        stopped.append(host)
        procs[host].terminate()

    start = time.monotonic()
    codes = cluster.supervise_hosts(procs, timeout_s=300, peer_grace_s=1.0, stop=stop, poll_s=0.1)
    assert codes == {"algo-1": -15, "algo-2": 7, "algo-3": -15}
    assert sorted(stopped) == ["algo-1", "algo-3"] and time.monotonic() - start < 20


def test_hosts_that_end_on_their_own_are_not_stopped():
    procs = {"algo-1": _sleeper(0, 0.5), "algo-2": _sleeper(0, 0.1)}
    codes = cluster.supervise_hosts(procs, timeout_s=60, peer_grace_s=0.1, stop=lambda h: pytest.fail(h), poll_s=0.05)
    assert codes == {"algo-1": 0, "algo-2": 0}


def test_hosts_still_running_at_the_timeout_are_stopped_and_reported_as_124():
    procs = {"algo-1": _sleeper(0, 600)}
    codes = cluster.supervise_hosts(procs, timeout_s=0.5, peer_grace_s=30, stop=lambda h: procs[h].kill(), poll_s=0.05)
    assert codes == {"algo-1": 124}
