"""Imported first by the TensorFlow trainers and the parameter-server processes
(``dtc_entrypoint.tf_server``): selects the Keras 2 API (``tf-keras``) before
TensorFlow loads, quiets TensorFlow's C++ logging (see ``tensorflow_horovod``'s docstring
for why Keras 2), and imports TensorFlow and tf-keras without pandas.

tf-keras imports pandas only to accept pandas objects in ``Model.fit``, and takes its absence
as designed (``tf_keras/src/engine/data_adapter.py``: ``try: import pandas as pd`` / ``except
ImportError: pd = None``). The built-in trainers give ``fit`` tf.data and DALI datasets, never
pandas objects, and pandas' import (with pyarrow and scipy.sparse under it) was 0.57 s of the
5.1 s ``import tensorflow`` took in every TensorFlow rank (``python -X importtime`` on a 2-core
machine running ``make test``, 2026-12-06; the trainer's import, alternated on the idle machine,
took 0.32 s less this way, docs/performance.md). So pandas is made unimportable (``sys.modules["pandas"] = None``,
the import system's own way of saying a module is absent) while TensorFlow and tf-keras load,
and importable again right after: a later ``import pandas`` in the process loads it as usual.
"""

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

if "pandas" not in sys.modules:
    sys.modules["pandas"] = None   # type: ignore[assignment]
    try:
        import tensorflow  # noqa: F401
        import tf_keras  # noqa: F401
    finally:
        del sys.modules["pandas"]
