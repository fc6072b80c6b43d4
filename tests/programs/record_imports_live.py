"""Copied into a directory on a process's ``PYTHONPATH`` as ``sitecustomize.py``, for a test that
reads the process's imports while it runs (a server that never exits normally; the trainers'
record at exit is ``record_imports.py``): every module a finder is asked for (the ``import`` audit
event) is appended to ``$IMPORTS_FILE`` once, as it happens. A package made unimportable with
``None`` in ``sys.modules`` (``dtc_train.tf_env``) is asked for too, but none of its submodules is:
a package really loaded imports its own."""

import os
import sys

_seen: set[str] = set()


def _record(event: str, args: tuple) -> None:
    if event == "import" and args[0] not in _seen:
        _seen.add(args[0])
        with open(os.environ["IMPORTS_FILE"], "a") as out:
            out.write(args[0] + "\n")


sys.addaudithook(_record)
