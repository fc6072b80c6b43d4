#!/usr/bin/env bash
# Installs NVIDIA DALI and its TensorFlow plugin. The plugin ships as an sdist that compiles
# against the installed TensorFlow, so it needs --no-build-isolation (DALI PR #6077) and must be
# reinstalled whenever TensorFlow changes (image-build.md pitfall 20). pip's wheel cache keeps
# the compiled plugin between runs on one machine.
source "$(dirname "$0")/lib.sh"
log "DALI $DALI_VERSION ($DALI_CUDA_SUFFIX) and its TensorFlow plugin"
pip_install "nvidia-dali-$DALI_CUDA_SUFFIX==$DALI_VERSION"
pip_install --no-build-isolation "nvidia-dali-tf-plugin-$DALI_CUDA_SUFFIX==$DALI_VERSION"
"$PYTHON" -c 'import nvidia.dali, nvidia.dali.plugin.pytorch; print("DALI", nvidia.dali.__version__)'
TF_CPP_MIN_LOG_LEVEL=2 "$PYTHON" -c 'import nvidia.dali.plugin.tf'
