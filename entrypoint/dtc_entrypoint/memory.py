"""Whether the kernel's out-of-memory killer has struck in this container.

A process killed by SIGKILL may have been killed by anyone; the kernel counts its own OOM kills
per memory cgroup, and a container is one (Docker, podman and SageMaker alike). cgroup v2
(Amazon Linux 2023, current Docker hosts): ``oom_kill N`` in ``<root>/memory.events``; cgroup
v1: ``oom_kill N`` in ``<root>/memory/memory.oom_control`` (Linux 4.13+). Sources: the kernel's
Documentation/admin-guide/cgroup-v2.rst ("memory.events") and cgroup-v1/memory.rst.
"""

import os

CGROUP_ROOT = "/sys/fs/cgroup"
COUNTER_FILES = ("memory.events", os.path.join("memory", "memory.oom_control"))


def oom_kills(root: str = CGROUP_ROOT) -> int | None:
    """The number of processes the OOM killer has killed in this container's memory cgroup, or
    ``None`` where no counter can be read (no memory controller, not in a container)."""
    for name in COUNTER_FILES:
        try:
            with open(os.path.join(root, name)) as handle:
                for line in handle:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


def oom_killed_since(before: int | None, root: str = CGROUP_ROOT) -> bool:
    """The counter grew since ``before`` (``oom_kills`` at the job's start; ``None``: since the
    container started)."""
    now = oom_kills(root)
    return now is not None and now > (before or 0)
