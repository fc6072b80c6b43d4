"""The host setup installs everything the project relies on: after `scripts/setup-host.sh`, no
package on this machine that setup did not bring (nor a fresh machine of this project's kind)
changes what the project's tools do. Issue #8: a DNS plugin installed by hand once made the
two-host cluster pass here and fail everywhere else.

Other packages are the machine owner's business (an editor, a language runtime):
a hand-installed package fails this test only when it puts files where the tools setup installs
look for plugins, runtimes and configuration (``PLUGIN_DIRS``), or ships a command the project
runs (``COMMANDS``).
"""

import re
import shutil
import subprocess

import pytest

from helpers import BIN, FIXTURES

FRESH = FIXTURES / "fresh-machine-debian-packages.txt"
MANIFEST = BIN.parent / "apt-requested.txt"
# Where podman, buildah, CNI, OpenMPI and OpenSSH pick up plugins and configuration by themselves.
PLUGIN_DIRS = ("/usr/lib/cni/", "/opt/cni/", "/etc/cni/", "/usr/lib/podman/", "/usr/libexec/podman/",
               "/etc/containers/", "/usr/share/containers/", "/usr/lib/x86_64-linux-gnu/openmpi/", "/etc/openmpi/",
               "/usr/lib/x86_64-linux-gnu/pmix2/", "/etc/ssh/ssh_config.d/")
# Commands the project's scripts, harness and tests run, by the name they run them under.
COMMANDS = ("podman", "buildah", "runc", "conmon", "debootstrap", "newuidmap", "iptables", "mpirun", "orterun",
            "orted", "mpicc", "ompi_info", "ssh", "ssh-keygen", "g++", "gcc", "cmake", "make", "patch",
            "docker-compose", "docker-registry", "shellcheck", "docker", "dockerd")

pytestmark = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian machine")


def _names(text: str) -> set[str]:
    return {line.split(":")[0].strip() for line in text.splitlines() if line.strip() and not line.startswith("#")}


def installed_packages() -> set[str]:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${Package}\n"], capture_output=True,
                         text=True, check=True).stdout
    return {line.split()[1] for line in out.splitlines() if line.startswith("ii")}


def dependency_closure(packages: set[str]) -> set[str]:
    """``packages`` and everything they may pull in (Depends and Pre-Depends, every alternative of an
    alternative, the providers of virtual packages): a superset of what apt installed for them."""
    out = subprocess.run(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                          "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *sorted(packages)],
                         capture_output=True, text=True, check=True).stdout
    names = set()
    for line in out.splitlines():
        name = re.sub(r"^\s*\|?[A-Za-z-]+:\s*", "", line).strip().strip("<>")
        if name:
            names.add(name.split(":")[0])
    return names


def package_files(package: str) -> list[str]:
    return subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True).stdout.splitlines()


def what_the_project_would_pick_up(files: list[str]) -> list[str]:
    """The files of a package that change what the project's tools do: anything under
    ``PLUGIN_DIRS``, and a command in ``COMMANDS`` on the standard paths, itself or as an
    alternative (``mpirun.mpich`` would take ``mpirun`` over through update-alternatives)."""
    bins = ("/usr/bin/", "/usr/sbin/", "/bin/", "/sbin/")
    return [f for f in files
            if any(f.startswith(d) and f != d.rstrip("/") for d in PLUGIN_DIRS)
            or any(f == b + c or f.startswith(f"{b}{c}.") for b in bins for c in COMMANDS)]


def test_setup_recorded_what_it_installed():
    assert MANIFEST.exists(), f"{MANIFEST} is missing: run scripts/setup-host.sh (without SKIP_APT=1)"
    requested = _names(MANIFEST.read_text())
    assert {"podman", "buildah", "containernetworking-plugins", "openmpi-bin", "openssh-client",
            "shellcheck", "docker.io"} <= requested


def test_no_package_installed_by_hand_changes_what_the_project_runs():
    requested = _names(MANIFEST.read_text())
    expected = _names(FRESH.read_text()) | dependency_closure(requested)
    picked_up = {package: found for package in sorted(installed_packages() - expected)
                 if (found := what_the_project_would_pick_up(package_files(package)))}
    assert not picked_up, (
        "installed on this machine but neither on a fresh machine nor brought by scripts/setup-host.sh, and used by "
        f"the project's tools: {picked_up}; add the package to setup's list if the project needs it, else remove it")


def test_the_check_would_catch_a_dns_plugin_installed_by_hand_and_ignores_unrelated_packages():
    """Setup brings CNI's dnsname plugin (for the SDKs' local modes): had it been installed by
    hand, its real file list would fail the check. A package of a fresh machine that the
    project's tools do not load (coreutils) would not."""
    assert what_the_project_would_pick_up(package_files("golang-github-containernetworking-plugin-dnsname")) == [
        "/usr/lib/cni/dnsname"]
    assert what_the_project_would_pick_up(package_files("coreutils")) == []
    assert what_the_project_would_pick_up(["/usr/bin/vim.basic", "/etc/vim/vimrc"]) == []
    # Docker's engine is one the project runs (setup brings Debian's docker.io): a hand-installed one counts
    assert what_the_project_would_pick_up(["/usr/bin/docker", "/usr/sbin/dockerd", "/etc/docker/daemon.json"]) == [
        "/usr/bin/docker", "/usr/sbin/dockerd"]
    assert what_the_project_would_pick_up(["/usr/lib/podman/aardvark-dns"]) == ["/usr/lib/podman/aardvark-dns"]
    assert what_the_project_would_pick_up(["/usr/bin/mpirun.mpich",
                                           "/usr/bin/mpichversion"]) == ["/usr/bin/mpirun.mpich"]
