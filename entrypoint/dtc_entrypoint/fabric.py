"""The job's network: the interface the launchers pin (with a fallback when the configured one
does not exist), and a warning when NCCL would fall back from EFA to TCP sockets.

Interface: resourceconfig.json's ``network_interface_name`` (``eth0`` on SageMaker) is what
NCCL, Gloo and mpirun are pinned to. SageMaker SDK v3's local mode writes ``ethwe``, which a
container on a podman or Docker network does not have; pinned to it, mpirun and NCCL fail.
``choose_interface`` keeps the configured name when it exists and otherwise picks one that does,
with a warning.

EFA:

On ``ml.p4d``/``ml.p5`` instances the Elastic Fabric Adapter appears in the container as RDMA
devices under ``/dev/infiniband`` (``uverbs0``...). NCCL uses it only through a network plugin,
AWS's aws-ofi-nccl (``libnccl-net.so``; ``libnccl-net-ofi.so`` from EFA installer 1.44), over
libfabric's EFA provider. NCCL looks the plugin up with ``dlopen`` (``NCCL_NET_PLUGIN`` names
another: ``libnccl-net-<name>.so``), and without one it silently uses TCP sockets, several times
slower across hosts. Neither Debian nor PyPI ships aws-ofi-nccl; the GPU flavor's build argument
``INSTALL_EFA=true`` installs it with AWS's EFA installer (docs/image.md). The preflight
(``preflight.checks.efa_finding``) reads ``efa_devices`` and ``find_plugin`` on every host.
"""

import os
import socket
from collections.abc import Mapping, Sequence

DEVICE_DIR = "/dev/infiniband"
PREFERRED_INTERFACE = "eth0"


def choose_interface(configured: str, usable: Sequence[str]) -> tuple[str, str | None]:
    """The interface to pin the launchers to, and a warning when it is not ``configured``.

    Args:
        configured: ``network_interface_name`` from resourceconfig.json.
        usable: interfaces of this container that are up and have an IPv4 address, loopback
            excluded (``usable_interfaces``).

    Returns:
        ``(configured, None)`` when it exists or nothing better is known; otherwise
        ``eth0`` if usable, else the first usable name in sorted order, with the warning text.
    """
    if configured in usable or not usable:
        return configured, None
    chosen = PREFERRED_INTERFACE if PREFERRED_INTERFACE in usable else sorted(usable)[0]
    return chosen, (f"resourceconfig.json names network interface {configured!r}, which this container does "
                    f"not have; pinning NCCL, Gloo and MPI to {chosen!r} instead "
                    f"(usable here: {', '.join(sorted(usable))})")


def usable_interfaces() -> tuple[str, ...]:
    """This container's interfaces that are up and carry an IPv4 address, loopback excluded."""
    import psutil  # noqa: PLC0415

    stats = psutil.net_if_stats()
    return tuple(sorted(name for name, addresses in psutil.net_if_addrs().items()
                        if name != "lo" and name in stats and stats[name].isup
                        and any(a.family == socket.AF_INET and not a.address.startswith("127.") for a in addresses)))
DEFAULT_LIBRARY_DIRS = ("/lib", "/usr/lib", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")


def plugin_names(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The file names NCCL's ``dlopen`` tries for its network plugin."""
    name = environ.get("NCCL_NET_PLUGIN", "")
    if name and name.lower() != "none":
        return (f"libnccl-net-{name}.so", name)
    return ("libnccl-net.so", "libnccl-net-ofi.so")


def find_plugin(environ: Mapping[str, str], ldconfig_cache: str,
                default_dirs: Sequence[str] = DEFAULT_LIBRARY_DIRS) -> str | None:
    """Where ``dlopen`` would find the plugin: ``LD_LIBRARY_PATH``, then the linker cache
    (``ldconfig -p`` output), then the default directories. ``None`` when nowhere."""
    names = plugin_names(environ)
    for directory in [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]:
        for name in names:
            if os.path.exists(os.path.join(directory, name)):
                return os.path.join(directory, name)
    for line in ldconfig_cache.splitlines():
        soname, _, path = line.strip().partition(" => ")
        if soname.split(" (")[0] in names:
            return path.strip()
    for directory in default_dirs:
        for name in names:
            if os.path.exists(os.path.join(directory, name)):
                return os.path.join(directory, name)
    return None


def efa_devices(device_dir: str = DEVICE_DIR) -> list[str]:
    """The RDMA user-verbs devices (``uverbs*``) the container sees."""
    try:
        return sorted(n for n in os.listdir(device_dir) if n.startswith("uverbs"))
    except OSError:
        return []
