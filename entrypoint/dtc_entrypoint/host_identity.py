"""Gives an MPI rank the ``SM_*`` identity of the host it runs on, then execs its program.

mpirun starts ranks on other hosts with the master's forwarded environment, so without this
every rank would see the master's ``SM_CURRENT_HOST`` (aws/sagemaker-training-toolkit#158).
Each host's entrypoint writes its own host-specific variables (``plan.HOST_SPECIFIC_SM_VARS``,
computed by sagemaker-training from that host's resourceconfig.json) to ``HOST_ENV_FILE``;
this module, prefixed to the rank's command by ``launch_mpi``, loads them.

Usage: ``python -m dtc_entrypoint.host_identity PROGRAM [ARGS...]``. Imports only the standard
library, so it adds milliseconds per rank.
"""

import json
import os
import sys

HOST_ENV_VARIABLE = "DTC_HOST_ENV_FILE"
DEFAULT_HOST_ENV_FILE = "/tmp/dtc/host-env.json"


def host_env_file(environ=os.environ) -> str:
    """Where this host's identity is kept: ``$DTC_HOST_ENV_FILE`` or ``/tmp/dtc/host-env.json``."""
    return environ.get(HOST_ENV_VARIABLE) or DEFAULT_HOST_ENV_FILE


def write(variables: dict[str, str], path: str) -> None:
    """Writes ``variables`` (name -> value) atomically for this host's ranks to load."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as handle:
        json.dump(variables, handle)
    os.replace(tmp, path)


def read(environ=os.environ) -> dict[str, str]:
    """This host's ``SM_*`` identity as its entrypoint wrote it (empty before it has)."""
    path = host_env_file(environ)
    if not os.path.isfile(path):
        return {}
    with open(path) as handle:
        return json.load(handle)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m dtc_entrypoint.host_identity PROGRAM [ARGS...]")
    os.environ.update(read())
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main(sys.argv[1:])
