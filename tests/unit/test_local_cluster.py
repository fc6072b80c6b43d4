"""The local cluster's plumbing (`dtc_local.cluster`), without containers: how hosts find each other
(static addresses and a hosts entry for every host, no DNS plugin) and the container environment.
Stopping the other hosts once one has failed, with real processes: tests/integration/test_cluster_supervision.py."""


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


def test_a_named_cluster_names_its_network_and_containers_and_keeps_the_host_names():
    job = _job(name="team-a", subnet="10.213.60.0/24")
    argv = cluster.podman_run_argv(job, "algo-2", "/tmp/tree")
    assert argv[argv.index("--name") + 1] == "team-a-algo-2" and argv[argv.index("--hostname") + 1] == "algo-2"
    assert argv[argv.index("--network") + 1] == "team-a"
    compose = cluster.compose_file(job, {h: f"/tmp/{h}" for h in job.hosts})
    assert compose["services"]["algo-1"]["container_name"] == "team-a-algo-1"
    assert list(compose["networks"]) == ["team-a"]
    default = _job()
    assert (default.network, default.container("algo-1")) == (cluster.NETWORK, "algo-1")   # make cluster's names


def test_a_subnet_too_small_for_the_hosts_is_refused():
    with pytest.raises(ValueError, match="too small for 3 hosts"):
        cluster.host_addresses(_job(subnet="10.0.0.0/29"))
