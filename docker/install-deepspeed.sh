#!/usr/bin/env bash
# Installs DeepSpeed $DEEPSPEED_VERSION into $PYTHON's environment with its CPU shared-memory op
# (deepspeed_shm_comm) compiled: DeepSpeed loads that op on every CPU init_distributed and would
# otherwise compile it at run time, which the runtime image (no compiler) cannot. The builder stage
# runs this after torch is installed.
#
# How: PyPI has only DeepSpeed's sdist. `pip wheel --no-build-isolation` builds it against the
# installed torch with DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 (only that op prebuilt) and
# DS_ACCELERATOR=cpu (the op is its CPU accelerator's; DeepSpeed records the accelerator it was
# built for and loads prebuilt ops only under the same one, so on a GPU its CUDA accelerator
# JIT-compiles any CUDA op a job selects: ZeRO with torch's optimizers needs none). The op's
# flags are DeepSpeed's own (-O2 -fopenmp, no -march=native: op_builder/cpu/comm.py); its AVX-512
# and AVX2 kernels are chosen at run time (csrc/cpu/comm/shm_interface.cpp, vector_kernel_level).
# The op is compiled with the hardening flags (lib.sh: hardened; torch's cpp_extension reads CFLAGS
# and LDFLAGS). The wheel is kept in $DEEPSPEED_WHEEL_CACHE/<deepspeed version>-<torch version>-<flags>/ (DeepSpeed
# checks at load time that the op was built for the running torch), so each flavor's torch gets
# its own; pip's own wheel cache would hand one flavor's build to the other.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
DEEPSPEED_WHEEL_CACHE="${DEEPSPEED_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dtc/deepspeed-wheels}"
torch_version="$("$PYTHON" -c 'import torch; print(torch.__version__)')"
flags="$(printf '%s\n' "$HARDENING_CFLAGS" "$HARDENING_LDFLAGS" | sha256sum | cut -c1-8)"   # lib.sh's hardening
cache_dir="$DEEPSPEED_WHEEL_CACHE/deepspeed-$DEEPSPEED_VERSION-torch-$torch_version-$flags"
wheel="$(find "$cache_dir" -maxdepth 1 -name 'deepspeed-*.whl' -print -quit 2>/dev/null || true)"
if [ -z "$wheel" ]; then
  log "building DeepSpeed $DEEPSPEED_VERSION against torch $torch_version (its CPU shared-memory op; about 2 minutes)"
  tmp="$(mktemp -d)"
  DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 DS_ACCELERATOR=cpu \
    hardened "$PYTHON" -m pip wheel --quiet --no-deps --no-build-isolation --no-cache-dir -w "$tmp" \
    "deepspeed==$DEEPSPEED_VERSION" || die "DeepSpeed $DEEPSPEED_VERSION did not build against torch $torch_version"
  mkdir -p "$cache_dir"
  mv "$tmp"/deepspeed-*.whl "$cache_dir/"
  rm -rf "$tmp"
  wheel="$(find "$cache_dir" -maxdepth 1 -name 'deepspeed-*.whl' -print -quit)"
fi
log "DeepSpeed from $wheel"
pip_install "$wheel"
DS_ACCELERATOR=cpu "$PYTHON" - <<'PY' || die "DeepSpeed's prebuilt shared-memory op does not load"
from deepspeed.git_version_info import installed_ops
from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder
assert installed_ops.get("deepspeed_shm_comm"), installed_ops
ShareMemCommBuilder().load()
print("DeepSpeed: deepspeed_shm_comm prebuilt and loaded")
PY
