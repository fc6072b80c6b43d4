"""Who may log in with the image's ssh key: the job's own hosts, nobody else.

Every host of a multi-host MPI job runs the same image, so one root key pair, generated when the
image is built (docker/configure-sshd.sh), lets mpirun on the master reach the other hosts'
sshd, as in AWS's Deep Learning Containers. Whoever has the image has that key too. sshd
therefore takes no ``authorized_keys`` file: it asks this command at each login
(``AuthorizedKeysCommand``, sshd_config(5)), which prints the key with a ``from=`` list of the
job's hosts' addresses (sshd(8), AUTHORIZED_KEYS FILE FORMAT), read from
``/opt/ml/input/config/resourceconfig.json`` (``hosts``) and resolved at that moment, plus the
loopback. A login from any other address (another instance in the VPC with a copy of the
image) is refused. Outside a training job (no resourceconfig.json) only the loopback may log in.

It holds whoever starts sshd: this image's ``train``, SageMaker SDK v3's MPI driver
(``sm_train.sh`` starts ``/usr/sbin/sshd -D`` itself), or a user's own script.
"""

import json
import os
import socket
import sys
from collections.abc import Callable, Iterable

RESOURCE_CONFIG = "/opt/ml/input/config/resourceconfig.json"
PUBLIC_KEY = "/etc/ssh/dtc_job_key.pub"
LOOPBACK = ("127.0.0.1", "::1")


def job_hosts(resource_config: str = RESOURCE_CONFIG) -> list[str]:
    """The ``hosts`` of SageMaker's resourceconfig.json (docs: your-algorithms-training-algo-running-container,
    "Distributed Training Configuration"), or ``[]`` when the file is missing or unreadable."""
    try:
        with open(resource_config) as handle:
            hosts = json.load(handle).get("hosts", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [host for host in hosts if isinstance(host, str)] if isinstance(hosts, list) else []


def addresses_of(host: str) -> list[str]:
    """Every IPv4/IPv6 address ``host`` resolves to now; ``[]`` when it does not resolve."""
    try:
        return sorted({info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)})
    except (socket.gaierror, UnicodeError):
        return []


def authorized_key(public_key: str, hosts: Iterable[str],
                   resolve: Callable[[str], list[str]] = addresses_of) -> str:
    """One ``authorized_keys`` line: ``from="<addresses>" <public_key>``.

    Args:
        public_key: the key's line (``ssh-ed25519 AAAA... comment``).
        hosts: the job's host names; each contributes every address ``resolve`` gives (a host
            that does not resolve contributes none), after ``LOOPBACK``.
    """
    allowed = list(LOOPBACK)
    for host in hosts:
        allowed += [address for address in resolve(host) if address not in allowed]
    return f'from="{",".join(allowed)}" {public_key.strip()}'


def main(argv: list[str] | None = None) -> int:
    """``dtc-authorized-keys USER``, sshd's ``AuthorizedKeysCommand``: prints root's one key line
    (nothing for any other user). Exits 0; a missing key file prints nothing (no login)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["root"] or not os.path.isfile(PUBLIC_KEY):
        return 0
    with open(PUBLIC_KEY) as handle:
        print(authorized_key(handle.read(), job_hosts()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
