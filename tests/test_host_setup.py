"""The host setup installs everything the project relies on: after `scripts/setup-host.sh`, every
Debian package on this machine is either on a fresh machine of this project's kind or brought by
a package setup asked for (with its dependencies). A package installed by hand, which a new
machine would lack, fails this test by name (issue #8: a DNS plugin installed by hand once made
the two-host cluster pass here and fail everywhere else).
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, REPO

FRESH = REPO / "tests" / "fixtures" / "fresh-machine-debian-packages.txt"
MANIFEST = BIN.parent / "apt-requested.txt"

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


def test_setup_recorded_what_it_installed():
    assert MANIFEST.exists(), f"{MANIFEST} is missing: run scripts/setup-host.sh (without SKIP_APT=1)"
    requested = _names(MANIFEST.read_text())
    assert {"podman", "buildah", "containernetworking-plugins", "openmpi-bin", "openssh-client"} <= requested


def test_no_package_on_this_machine_comes_from_a_hand_install():
    requested = _names(MANIFEST.read_text())
    expected = _names(FRESH.read_text()) | dependency_closure(requested)
    hand_installed = sorted(installed_packages() - expected)
    assert not hand_installed, (
        f"installed on this machine but neither on a fresh machine ({FRESH.name}) nor brought by "
        f"scripts/setup-host.sh: {', '.join(hand_installed)}; add what the project uses to setup's package list, "
        "and remove the rest")


def test_the_closure_would_catch_a_dns_plugin_installed_by_hand():
    """The check can fail: netavark's DNS server (aardvark-dns) and a Docker engine are not among
    what setup brings (it brings CNI's dnsname plugin, for the SDKs' local modes)."""
    expected = _names(FRESH.read_text()) | dependency_closure(_names(MANIFEST.read_text()))
    assert "golang-github-containernetworking-plugin-dnsname" in expected
    assert not {"aardvark-dns", "docker.io"} & expected
