"""Reaching the job's other hosts: waiting for a port to open, and noticing when it closes."""

import logging
import socket
import time
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

POLL_S = 1.0


def accepts(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether ``host:port`` accepts a TCP connection now (a name that does not resolve: no)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_ports(hosts: Sequence[str], port: int, timeout_s: float, what: str, hint: str,
                   clock: Callable[[], float] = time.monotonic, poll_s: float = POLL_S) -> None:
    """Waits until every host accepts TCP connections on ``port``.

    Args:
        what: the service, for the error (``ssh``).
        hint: what to change, for the error (the timeout's variable).

    Raises:
        TimeoutError: naming the hosts still unreachable after ``timeout_s`` seconds.
    """
    deadline = clock() + timeout_s
    pending = list(hosts)
    while pending:
        pending = [h for h in pending if not accepts(h, port)]
        if pending and clock() > deadline:
            raise TimeoutError(
                f"hosts {pending} did not accept {what} on port {port} within {timeout_s:.0f} s: "
                f"check the security group allows traffic between the job's hosts, or {hint}")
        if pending:
            time.sleep(poll_s)


def wait_until_closed(host: str, port: int, closed_checks: int = 3, poll_s: float = 2.0) -> None:
    """Returns once ``host:port`` has refused ``closed_checks`` consecutive connections
    (``closed_checks * poll_s`` seconds after the peer stopped serving)."""
    refused = 0
    while refused < closed_checks:
        refused = 0 if accepts(host, port) else refused + 1
        time.sleep(poll_s if refused < closed_checks else 0)
