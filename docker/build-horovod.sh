#!/usr/bin/env bash
# Builds Horovod from the PyPI sdist with our patches (docker/patches/*.patch, plus
# docker/patches/gpu/*.patch for the GPU flavor) against the
# TensorFlow, PyTorch and OpenMPI already installed for $PYTHON, installs it, and checks that
# its TensorFlow and PyTorch extensions load with MPI and Gloo (plus NCCL on gpu; lib.sh, horovod_built).
#
# Cache: the built wheel is kept under $HOROVOD_WHEEL_CACHE/<key>/, where <key> hashes every input
# that changes the binary (the pins, the patches, the build switches, the Python ABI and the
# flavor), so a rebuild happens exactly when one of them changes. HOROVOD_WHEEL_CACHE= (empty)
# disables it. The log of a build is kept next to its wheel. `--print-entry` prints the entry's
# directory (nothing where the cache is disabled) and builds nothing: the one place callers
# (scripts/build-image.sh, tests/integration/test_install.py) learn where the wheel and its log are.
# HOROVOD_WHEEL_SEED names a read-only directory of such entries to take a wheel from first: the
# image build gets the host setup's entry there (scripts/build-image.sh), so Horovod is compiled
# once per machine, not once for the host and again for the image.
#
# The wheel is relocatable: its libraries find torch's, TensorFlow's (and on GPU the CUDA runtime's
# and NCCL's) libraries through RUNPATH entries relative to themselves ($ORIGIN/../../<package>),
# so one built in the host's venv works in the image's and `ldd` resolves them without
# LD_LIBRARY_PATH. No debug information: Horovod's RelWithDebInfo build compiles without -g
# (docker/horovod-toolchain.cmake, CMake's toolchain file for the build: the same code, a fifth less
# compile), and what the libraries still carry is stripped.
#
# GPU flavor (FLAVOR=gpu): NCCL operations linked against the shared libnccl.so.2 of the
# nvidia-nccl-cu12 wheel torch loads (HOROVOD_NCCL_LINK=SHARED; image-build.md pitfall 8), CUDA
# kernels for HOROVOD_CUDA_CC_LIST, compiled by the toolkit at CUDA_HOME (default /usr/local/cuda;
# docker/install-cuda-toolkit.sh).
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
HOROVOD_WHEEL_CACHE="${HOROVOD_WHEEL_CACHE-${XDG_CACHE_HOME:-$HOME/.cache}/dtc/horovod-wheels}"

# The build's switches. They are part of the cache key: change one and the wheel is rebuilt.
# shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker, not the shell
rpath='$ORIGIN/../../torch/lib:$ORIGIN/../../tensorflow'
build_flags=(HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
             HOROVOD_WITHOUT_MXNET=1)
if [ "$FLAVOR" = gpu ]; then
  # shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker
  rpath+=':$ORIGIN/../../nvidia/cuda_runtime/lib:$ORIGIN/../../nvidia/nccl/lib'
  build_flags+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED "HOROVOD_BUILD_CUDA_CC_LIST=$HOROVOD_CUDA_CC_LIST")
fi
# The hardening flags (lib.sh) reach CMake through CFLAGS/CXXFLAGS/LDFLAGS, as TF's include dirs do.
build_flags+=("CFLAGS=$HARDENING_CFLAGS" "LDFLAGS=$HARDENING_LDFLAGS -Wl,-rpath,$rpath")

abi="$("$PYTHON" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())')"
key="$( {
  echo "$abi $FLAVOR ${build_flags[*]} CXXFLAGS=$HARDENING_CFLAGS"
  for pin in HOROVOD_VERSION TENSORFLOW_VERSION TORCH_VERSION OPENMPI_VERSION NUMPY_VERSION; do echo "$pin=${!pin}"; done
  if [ "$FLAVOR" = gpu ]; then
    for pin in TORCH_GPU_VERSION NCCL_VERSION CUDA_TOOLKIT_DEB_VERSION CUDA_BUILD_RUNTIME_CU12_VERSION; do
      echo "$pin=${!pin}"
    done
  fi
  echo "stripped"
  cat "$DOCKER_DIR/horovod-toolchain.cmake"   # its content, not its path: the host's and the image's builds share a key
  cat "$DOCKER_DIR"/patches/*.patch
  if [ "$FLAVOR" = gpu ]; then cat "$DOCKER_DIR"/patches/gpu/*.patch; fi
} | sha256sum | cut -c1-16)"
cache_dir="$HOROVOD_WHEEL_CACHE/horovod-$HOROVOD_VERSION-$FLAVOR-$key"
if [ "${1:-}" = --print-entry ]; then
  [ -z "$HOROVOD_WHEEL_CACHE" ] || echo "$cache_dir"
  exit 0
fi

wheel="$(find "$cache_dir" -maxdepth 1 -name 'horovod-*.whl' -print -quit 2>/dev/null || true)"
[ -n "$HOROVOD_WHEEL_CACHE" ] || wheel=""
seeded="$(find "${HOROVOD_WHEEL_SEED:-/nonexistent}/$(basename "$cache_dir")" -maxdepth 1 -name 'horovod-*.whl' -print -quit \
  2>/dev/null || true)"
if [ -n "$wheel" ]; then
  log "using cached wheel $wheel"
elif [ -n "$seeded" ]; then
  log "using the wheel the host setup built from the same inputs: $seeded"
  wheel="$seeded"
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
  export CXXFLAGS="$HARDENING_CFLAGS ${CXXFLAGS:-} -I$tf_include/external/highwayhash -I$tf_include/external/farmhash_archive/src"
  export "${build_flags[@]}" MAKEFLAGS="-j${HOROVOD_BUILD_JOBS:-$(nproc)}"
  export CMAKE_POLICY_VERSION_MINIMUM=3.5   # Gloo's cmake_minimum_required under CMake 4 (horovod #4310)
  export CMAKE_TOOLCHAIN_FILE="$DOCKER_DIR/horovod-toolchain.cmake"   # RelWithDebInfo without -g
  nccl_link=""
  if [ "$FLAVOR" = gpu ]; then
    nccl_home="$("$PYTHON" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])')"
    # The linker wants the unversioned name; the link exists for this build only.
    [ -e "$nccl_home/lib/libnccl.so" ] || { ln -s libnccl.so.2 "$nccl_home/lib/libnccl.so"; nccl_link="$nccl_home/lib/libnccl.so"; }
    export HOROVOD_NCCL_HOME="$nccl_home" HOROVOD_CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
  fi
  log "building (about 3 minutes on 2 idle cores, 7 for the GPU flavor); MAKEFLAGS=$MAKEFLAGS"
  start=$(date +%s)
  "$PYTHON" -m pip wheel -v --no-deps --no-build-isolation -w "$work/dist" "$src" > "$work/build.log" 2>&1 \
    || { tail -60 "$work/build.log" >&2; die "horovod build failed (log tail above)"; }
  log "built in $(( $(date +%s) - start )) s"
  [ -z "$nccl_link" ] || rm -f "$nccl_link"
  "$PYTHON" -m wheel unpack -d "$work/unpacked" "$work"/dist/horovod-*.whl >/dev/null
  find "$work/unpacked" -name '*.so' -exec strip --strip-debug {} +
  rm "$work"/dist/horovod-*.whl
  "$PYTHON" -m wheel pack -d "$work/dist" "$work"/unpacked/horovod-* >/dev/null
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
pip_install "cloudpickle==$CLOUDPICKLE_VERSION" "psutil==$PSUTIL_VERSION" "pyyaml==$PYYAML_VERSION" \
  "packaging==$PACKAGING_VERSION" "cffi==$CFFI_VERSION"   # horovod's runtime requirements

log "horovod $HOROVOD_VERSION ready with $(horovod_built)"
