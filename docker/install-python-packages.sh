#!/usr/bin/env bash
# Installs the pinned Python stack into $PYTHON's environment: packaging tools, numpy, protobuf,
# TensorFlow + tf-keras, PyTorch, sagemaker-training (compiles its gethostname C extension),
# scikit-learn (ships the digits data set), Pillow, and pytest (the image's own sanity suite).
#
# PyTorch: the CPU flavor takes the `+cpu` build, the GPU flavor the `+$TORCH_CUDA_INDEX` build.
# TORCH_INDEX_URL names PyTorch's wheel index for that build (e.g.
# https://download.pytorch.org/whl/cpu), or `auto` for PyTorch's index of the flavor (the image's
# default); leave it empty where pip's find-links already hold the wheel (this project's CI
# machines have the CPU wheel on disk).
#
# TensorFlow: `tensorflow` (not `tensorflow-cpu`) because tf-keras depends on `tensorflow`;
# installing both would put two copies of TF in one site-packages. On Linux the `tensorflow`
# wheel runs on CPU; the GPU flavor adds its `and-cuda` extra.
source "$(dirname "$0")/lib.sh"

log "packaging tools"
pip_install "pip==$PIP_VERSION" "setuptools==$SETUPTOOLS_VERSION" "wheel==$WHEEL_VERSION"

if [ "$FLAVOR" = gpu ]; then
  torch_req="torch==$TORCH_VERSION+$TORCH_CUDA_INDEX"
  tf_req="tensorflow[and-cuda]==$TENSORFLOW_VERSION"
else
  torch_req="torch==$TORCH_VERSION+cpu"
  tf_req="tensorflow==$TENSORFLOW_VERSION"
fi
if [ "${TORCH_INDEX_URL:-}" = auto ]; then   # the image's default: PyTorch's own index for the flavor
  TORCH_INDEX_URL="https://download.pytorch.org/whl/$([ "$FLAVOR" = gpu ] && echo "$TORCH_CUDA_INDEX" || echo cpu)"
fi
index_args=()
[ -n "${TORCH_INDEX_URL:-}" ] && index_args=(--extra-index-url "$TORCH_INDEX_URL")

log "frameworks ($FLAVOR): $tf_req, $torch_req"
pip_install "${index_args[@]}" \
  "numpy==$NUMPY_VERSION" "protobuf==$PROTOBUF_VERSION" \
  "$tf_req" "tf-keras==$TF_KERAS_VERSION" "$torch_req" \
  "sagemaker-training==$SAGEMAKER_TRAINING_VERSION" \
  "scikit-learn==$SCIKIT_LEARN_VERSION" "pillow==$PILLOW_VERSION" "pytest==$PYTEST_VERSION" \
  || die "framework install failed; for PyTorch's $FLAVOR build set TORCH_INDEX_URL (see docs/versions.md)"
