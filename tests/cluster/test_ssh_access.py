"""The image's ssh key opens a host's sshd to the job's own hosts only (#21 item 5).

Three containers of the image on one private network: ``algo-1`` runs sshd with a
resourceconfig.json naming hosts algo-1 and algo-2; ``algo-2`` logs in with the image's key; a
third container at another address, holding the same key (anyone with a copy of the image has
it), is refused. dtc_entrypoint.ssh_access is what sshd asks at each login.
"""

import ipaddress
import json
import subprocess
import time

import pytest

from helpers import CLUSTER, IMAGES, podman_env

pytestmark = [pytest.mark.image,
              pytest.mark.skipif(not IMAGES["cpu"],
                                 reason="DTC_IMAGE is not set (make test builds the image and sets it)")]

SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "algo-1", "echo", "logged-in"]


def _podman(*argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=timeout_s, env=podman_env())


def test_only_the_jobs_hosts_can_log_in_with_the_images_key(tmp_path):
    network, image = f"{CLUSTER.name}-ssh", IMAGES["cpu"]
    subnet = ipaddress.IPv4Network(CLUSTER.subnet)
    addresses = {name: str(subnet.network_address + offset)
                 for name, offset in (("algo-1", 11), ("algo-2", 12), ("outsider", 13))}
    hosts = [f"--add-host={name}:{address}" for name, address in addresses.items() if name != "outsider"]
    config = tmp_path / "config"
    config.mkdir()
    (config / "resourceconfig.json").write_text(json.dumps(
        {"current_host": "algo-1", "hosts": ["algo-1", "algo-2"], "network_interface_name": "eth0"}))

    def login_from(name: str) -> subprocess.CompletedProcess:
        return _podman("run", "--rm", "--network", network, "--ip", addresses[name], "--hostname", name, *hosts,
                       image, *SSH)

    server = f"{network}-algo-1"
    _podman("rm", "-f", server)
    _podman("network", "rm", "-f", network)
    assert _podman("network", "create", "--internal", "--subnet", CLUSTER.subnet, network).returncode == 0
    try:
        started = _podman("run", "-d", "--rm", "--name", server, "--network", network, "--ip", addresses["algo-1"],
                          "--hostname", "algo-1", *hosts, "-v", f"{config}:/opt/ml/input/config:ro", image,
                          "/usr/sbin/sshd", "-D", "-e")
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 60
        while (inside := login_from("algo-2")).returncode == 255 and "refused" in inside.stderr \
                and time.monotonic() < deadline:   # sshd still starting
            time.sleep(1)
        assert inside.returncode == 0 and inside.stdout.strip() == "logged-in", inside.stderr

        outside = login_from("outsider")
        assert outside.returncode == 255 and outside.stdout == ""
        assert "Permission denied (publickey)" in outside.stderr, outside.stderr

        # what sshd asked: the key, allowed from the loopback and the two hosts' addresses only
        said = _podman("exec", server, "dtc-authorized-keys", "root")
        assert said.stdout.startswith(f'from="127.0.0.1,::1,{addresses["algo-1"]},{addresses["algo-2"]}" '
                                      "ssh-ed25519 "), said.stdout
        assert _podman("exec", server, "test", "-e", "/root/.ssh/authorized_keys").returncode == 1
    finally:
        _podman("rm", "-f", server)
        _podman("network", "rm", "-f", network)
