#!/usr/bin/env bash
# Builds Horovod from the PyPI sdist with our patches (docker/patches/*.patch, plus
# docker/patches/gpu/*.patch for the GPU flavor) against the
# TensorFlow, PyTorch and OpenMPI already installed for $PYTHON, installs it, and checks that
# `horovodrun --check-build` lists TensorFlow, PyTorch, MPI and Gloo (plus NCCL on gpu).
#
# Cache: the built wheel is kept under $HOROVOD_WHEEL_CACHE/<key>/, where <key> hashes every input
# that changes the binary (the pins, the patches, the build switches, the Python ABI and the
# flavor), so a rebuild happens exactly when one of them changes. HOROVOD_WHEEL_CACHE= (empty)
# disables it. The log of a build is kept next to its wheel. `--print-key` prints the entry's name.
#
# GPU flavor (FLAVOR=gpu): NCCL operations linked against the shared libnccl.so.2 that PyTorch
# loads (HOROVOD_NCCL_LINK=SHARED; image-build.md pitfall 8), CUDA architectures from
# HOROVOD_CUDA_CC_LIST, CUDA_HOME default /usr/local/cuda.
source "$(dirname "$0")/lib.sh"
HOROVOD_WHEEL_CACHE="${HOROVOD_WHEEL_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/dtc/horovod-wheels}"

# The build's switches. They are part of the cache key: change one and the wheel is rebuilt.
build_flags=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
             HOROVOD_WITHOUT_MXNET=1)
if [ "$FLAVOR" = gpu ]; then
  build_flags+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED "HOROVOD_BUILD_CUDA_CC_LIST=$HOROVOD_CUDA_CC_LIST")
fi

abi="$("$PYTHON" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())')"
key="$( {
  echo "$abi $FLAVOR ${build_flags[*]}"
  for pin in HOROVOD_VERSION TENSORFLOW_VERSION TORCH_VERSION OPENMPI_VERSION NUMPY_VERSION; do echo "$pin=${!pin}"; done
  if [ "$FLAVOR" = gpu ]; then
    for pin in CUDA_VERSION TORCH_CUDA_INDEX NCCL_PIP_PACKAGE; do echo "$pin=${!pin}"; done
  fi
  cat "$DOCKER_DIR"/patches/*.patch
  if [ "$FLAVOR" = gpu ]; then cat "$DOCKER_DIR"/patches/gpu/*.patch; fi
} | sha256sum | cut -c1-16)"
cache_dir="$HOROVOD_WHEEL_CACHE/horovod-$HOROVOD_VERSION-$FLAVOR-$key"
if [ "${1:-}" = --print-key ]; then echo "horovod-$HOROVOD_VERSION-$FLAVOR-$key"; exit 0; fi

wheel="$(ls "$cache_dir"/horovod-*.whl 2>/dev/null | head -1 || true)"
if [ -n "$HOROVOD_WHEEL_CACHE" ] && [ -n "$wheel" ]; then
  log "using cached wheel $wheel"
else
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  log "downloading the horovod $HOROVOD_VERSION sdist"
  "$PYTHON" -m pip download --no-deps --no-binary=:all: --no-build-isolation -q -d "$work" "horovod==$HOROVOD_VERSION"
  tar -xzf "$work/horovod-$HOROVOD_VERSION.tar.gz" -C "$work"
  src="$work/horovod-$HOROVOD_VERSION"
  patches=("$DOCKER_DIR"/patches/*.patch)
  if [ "$FLAVOR" = gpu ]; then patches+=("$DOCKER_DIR"/patches/gpu/*.patch); fi   # GPU-only code paths
  for p in "${patches[@]}"; do
    log "applying $(basename "$p")"
    patch -d "$src" -p1 --forward --quiet < "$p"
  done

  # TF's wheel does not report these two include dirs; without them the build stops at
  # highwayhash/arch_specific.h (conda-forge's recipe passes the same flags).
  tf_include="$("$PYTHON" -c 'import os; os.environ["TF_CPP_MIN_LOG_LEVEL"]="3"; import tensorflow as tf; print(tf.sysconfig.get_include())')"
  export CXXFLAGS="${CXXFLAGS:-} -I$tf_include/external/highwayhash -I$tf_include/external/farmhash_archive/src"
  export "${build_flags[@]}" MAKEFLAGS="-j${HOROVOD_BUILD_JOBS:-$(nproc)}"
  export CMAKE_POLICY_VERSION_MINIMUM=3.5   # Gloo's cmake_minimum_required under CMake 4 (horovod #4310)
  if [ "$FLAVOR" = gpu ]; then
    nccl_home="$("$PYTHON" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])')"
    [ -e "$nccl_home/lib/libnccl.so" ] || ln -sf libnccl.so.2 "$nccl_home/lib/libnccl.so"
    export HOROVOD_NCCL_HOME="$nccl_home" HOROVOD_CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
  fi
  log "building (about 8 minutes on 2 cores); MAKEFLAGS=$MAKEFLAGS"
  start=$(date +%s)
  "$PYTHON" -m pip wheel -v --no-deps --no-build-isolation -w "$work/dist" "$src" > "$work/build.log" 2>&1 \
    || { tail -60 "$work/build.log" >&2; die "horovod build failed (log tail above)"; }
  log "built in $(( $(date +%s) - start )) s"
  wheel="$(ls "$work"/dist/horovod-*.whl)"
  if [ -n "$HOROVOD_WHEEL_CACHE" ]; then
    mkdir -p "$HOROVOD_WHEEL_CACHE"
    tmp_cache="$(mktemp -d "$HOROVOD_WHEEL_CACHE/.tmp.XXXXXX")"
    cp "$wheel" "$work/build.log" "$tmp_cache/"
    rm -rf "$cache_dir" && mv "$tmp_cache" "$cache_dir"   # atomic publish of the cache entry
    wheel="$(ls "$cache_dir"/horovod-*.whl)"
    log "cached $wheel"
  fi
fi

pip_install --no-deps --force-reinstall "$wheel"
pip_install cloudpickle psutil pyyaml packaging "cffi>=1.4.0"   # horovod's runtime requirements

horovodrun="$("$PYTHON" -c 'import os, sys; print(os.path.dirname(sys.executable))')/horovodrun"
check="$("$horovodrun" --check-build)"
echo "$check"
required=(TensorFlow PyTorch MPI Gloo)
[ "$FLAVOR" = gpu ] && required+=(NCCL)
for what in "${required[@]}"; do
  grep -Eq "\[X\] $what\b" <<<"$check" || die "horovodrun --check-build does not list $what"
done
log "horovod $HOROVOD_VERSION ready with ${required[*]}"
