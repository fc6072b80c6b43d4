"""Copied into a job's code directory as ``sitecustomize.py`` (that directory is on every rank's
``PYTHONPATH``, so Python imports it as each process starts): at exit, a built-in trainer's process
(one that imported ``dtc_train.observe``) writes which frameworks it had imported to
``$RECORD_IMPORTS_DIR/<pid>.json``, and whether it had imported pandas: ``{"rank": "0", "frameworks":
["torch"], "pandas": false}``. An exit handler
(``atexit``): the built-in trainers run them as they leave (``dtc_train.common.leave``)."""

import atexit
import json
import os
import sys

FRAMEWORKS = ("torch", "tensorflow")


def _record() -> None:
    directory = os.environ.get("RECORD_IMPORTS_DIR")
    if not directory or "dtc_train.observe" not in sys.modules:
        return
    rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("RANK", "?")
    with open(os.path.join(directory, f"{os.getpid()}.json"), "w") as out:
        json.dump({"rank": rank, "frameworks": [name for name in FRAMEWORKS if name in sys.modules],
                   "pandas": "pandas" in sys.modules}, out)


atexit.register(_record)
