#!/usr/bin/env bash
# Installs NVIDIA DALI and its TensorFlow plugin. The plugin ships as an sdist that compiles
# against the installed TensorFlow and CUDA's headers, so it needs --no-build-isolation (DALI
# PR #6077) and must be rebuilt whenever TensorFlow changes (its entry's inputs: lib.sh,
# dali_tf_plugin_entry). Its build runs its own g++ command, which takes the compiler from CXX and
# no flags: hardened-c++ adds the hardening flags.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
log "DALI $DALI_VERSION ($DALI_CUDA_SUFFIX) and its TensorFlow plugin"
pip_install "nvidia-dali-$DALI_CUDA_SUFFIX==$DALI_VERSION"
# The plugin's compile includes cuda_runtime_api.h (and through it crt/host_defines.h). Without a
# CUDA toolkit (the CPU flavor), take those headers from NVIDIA's CUDA 12 runtime and nvcc
# wheels, unpacked aside for this one build and removed after it.
headers=""
if [ ! -e "${CUDA_HOME:-/usr/local/cuda}/include/cuda_runtime_api.h" ]; then
  headers="$(mktemp -d)"
  pip_install --no-deps --target "$headers" "nvidia-cuda-runtime-cu12==$CUDA_RUNTIME_CU12_VERSION" \
    "nvidia-cuda-nvcc-cu12==$CUDA_NVCC_CU12_VERSION"
  export CPLUS_INCLUDE_PATH="$headers/nvidia/cuda_runtime/include:$headers/nvidia/cuda_nvcc/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
fi
dir="$(HARDENING_CFLAGS="$HARDENING_CFLAGS" HARDENING_LDFLAGS="$HARDENING_LDFLAGS" CXX="$DOCKER_DIR/hardened-c++" \
  built_wheel "$(dali_tf_plugin_entry)" "nvidia-dali-tf-plugin-$DALI_CUDA_SUFFIX==$DALI_VERSION" --no-build-isolation)"
pip_install --no-deps --force-reinstall "$dir"/nvidia_dali_tf_plugin_*.whl
[ -z "$headers" ] || rm -rf "$headers"
"$PYTHON" -c 'import nvidia.dali, nvidia.dali.plugin.pytorch; print("DALI", nvidia.dali.__version__)'
TF_CPP_MIN_LOG_LEVEL=2 "$PYTHON" -c 'import nvidia.dali.plugin.tf'
