"""Imported first by the TensorFlow trainers: selects the Keras 2 API (``tf-keras``) before
TensorFlow loads, and quiets TensorFlow's C++ logging (see ``tensorflow_horovod``'s docstring
for why Keras 2)."""

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
