# shellcheck shell=bash
# Shared helpers for the install scripts under docker/. Sourced, never executed.
# Sets: REPO_DIR (the checkout or the image's copy of it), every pin from versions.env,
# PYTHON (the interpreter to install into; defaults to python3 on PATH) and FLAVOR (cpu|gpu).
set -euo pipefail

DOCKER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "$DOCKER_DIR/.." && pwd)"
VERSIONS_FILE="${VERSIONS_FILE:-$REPO_DIR/versions.env}"
set -a
# shellcheck source=../versions.env
. "$VERSIONS_FILE"
set +a

# Image builds hand pip the CA of a TLS-intercepting proxy as a build secret, mounted for one RUN
# step and never stored in a layer (scripts/build-image.sh; Dockerfile `--mount=type=secret`).
if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi

PYTHON="${PYTHON:-python3}"
FLAVOR="${FLAVOR:-cpu}"
case "$FLAVOR" in
  cpu|gpu) ;;
  *) echo "error: FLAVOR must be cpu or gpu, got '$FLAVOR'" >&2; exit 2 ;;
esac

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
die() { printf '[%s] error: %s\n' "$(basename "$0")" "$*" >&2; exit 1; }

pip_install() { "$PYTHON" -m pip install --disable-pip-version-check --quiet "$@"; }

# The extra index PyTorch's build for $FLAVOR comes from, or nothing when PyPI or pip's find-links
# have it. TORCH_INDEX_URL: `auto` (the image's default: PyTorch's CPU index for the CPU flavor,
# unless a directory of PIP_FIND_LINKS holds torch-$TORCH_VERSION+cpu's wheel, as the build's
# build/wheels does where scripts/build-image.sh found one; PyPI's CUDA 12 torch for the GPU
# flavor), empty (find-links hold the wheel), or an index URL.
torch_index_url() {
  local link
  case "${TORCH_INDEX_URL:-}" in
    auto)
      [ "$FLAVOR" = cpu ] || return 0
      for link in ${PIP_FIND_LINKS:-}; do
        if compgen -G "$link/torch-$TORCH_VERSION+cpu-*.whl" > /dev/null; then return 0; fi
      done
      echo "https://download.pytorch.org/whl/cpu" ;;
    *) echo "${TORCH_INDEX_URL:-}" ;;
  esac
}

# Hardening flags for every C/C++ build this project runs (mpi4py, Horovod, the DALI TF plugin,
# sagemaker-training's extension, DeepSpeed's op): the stack protector, FORTIFY and full RELRO
# that AWS's DLC sanity suite asserts of its builds' flags (aws/deep-learning-containers,
# test/sanity/scripts/check_base_image.sh) and Debian's `dpkg-buildflags` gives with
# hardening=+all. dtc_local.image_sanity reads them back from the built ELF files.
HARDENING_CFLAGS="-O2 -fstack-protector-strong -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=2"   # FORTIFY needs -O
HARDENING_LDFLAGS="-Wl,-z,relro,-z,now"
hardened() {   # hardened CMD...: CMD with the hardening flags ahead of any CFLAGS/CXXFLAGS/LDFLAGS set
  CFLAGS="$HARDENING_CFLAGS${CFLAGS:+ $CFLAGS}" CXXFLAGS="$HARDENING_CFLAGS${CXXFLAGS:+ $CXXFLAGS}" \
    LDFLAGS="$HARDENING_LDFLAGS${LDFLAGS:+ $LDFLAGS}" "$@"
}

# Wheels compiled here from an sdist (mpi4py, sagemaker-training, the DALI TF plugin) are kept under
# $DTC_WHEEL_CACHE/<entry>/, <entry> = <name>-<version>-<flavor>-<hash of what changes the binary:
# the Python ABI, the hardening flags, the inputs each *_entry function below names>. pip's own
# wheel cache is keyed by the sdist alone and would hand back a build made with other flags.
# DTC_WHEEL_SEED names a read-only directory of such entries to take a wheel from first: the image
# build gets the host setup's entries there (scripts/build-image.sh stages them), so each is
# compiled once per machine, as Horovod's wheel is (build-horovod.sh).
DTC_WHEEL_CACHE="${DTC_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dtc/built-wheels}"
wheel_entry() {   # wheel_entry NAME VERSION INPUTS: the entry's name for $PYTHON and $FLAVOR
  local abi
  abi="$("$PYTHON" -c 'import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform())')"
  printf '%s-%s-%s-%s\n' "$1" "$2" "$FLAVOR" \
    "$(printf '%s\n' "$abi" "$HARDENING_CFLAGS" "$HARDENING_LDFLAGS" "$3" | sha256sum | cut -c1-16)"
}
mpi4py_entry() { wheel_entry mpi4py "$MPI4PY_VERSION" "openmpi $OPENMPI_VERSION"; }
sagemaker_training_entry() { wheel_entry sagemaker-training "$SAGEMAKER_TRAINING_VERSION" ""; }
dali_tf_plugin_entry() {   # compiled against TensorFlow and CUDA's headers (a toolkit's, or the wheels')
  local headers="cuda-wheels $CUDA_RUNTIME_CU12_VERSION $CUDA_NVCC_CU12_VERSION"
  [ "$FLAVOR" = cpu ] || headers="cuda-toolkit $CUDA_TOOLKIT_DEB_VERSION"
  wheel_entry "nvidia-dali-tf-plugin-$DALI_CUDA_SUFFIX" "$DALI_VERSION" "tensorflow $TENSORFLOW_VERSION $headers"
}

# built_wheel ENTRY SPEC [PIP_WHEEL_OPTIONS...]: prints the directory holding the wheel of SPEC
# (name==version), compiled from its sdist with the hardening flags once per ENTRY (the seed's
# entry first, then the cache's). The caller's environment reaches the build (MPICC, CXX, ...).
built_wheel() {
  local entry="$1" spec="$2" dir work tmp
  shift 2
  if compgen -G "${DTC_WHEEL_SEED:-/nonexistent}/$entry/*.whl" > /dev/null; then
    log "$spec: the wheel the host setup built from the same inputs ($entry)"
    echo "$DTC_WHEEL_SEED/$entry"
    return
  fi
  dir="$DTC_WHEEL_CACHE/$entry"
  if ! compgen -G "$dir/*.whl" > /dev/null; then
    log "$spec: compiling its sdist with the hardening flags (cached as $entry)"
    work="$(mktemp -d)"
    hardened "$PYTHON" -m pip wheel --disable-pip-version-check --quiet --no-deps --no-cache-dir \
      --no-binary="${spec%%==*}" -w "$work" "$@" "$spec" >&2 || { rm -rf "$work"; die "$spec did not build"; }
    mkdir -p "$DTC_WHEEL_CACHE"
    tmp="$(mktemp -d "$DTC_WHEEL_CACHE/.tmp.XXXXXX")"
    mv "$work"/*.whl "$tmp/" && rm -rf "$work" "$dir" && mv "$tmp" "$dir"   # published whole, or not at all
  fi
  echo "$dir"
}

# horovod_built: checks $PYTHON's Horovod as `horovodrun --check-build` reports it (its TensorFlow and
# PyTorch extensions load, each built with MPI and Gloo, and NCCL for the GPU flavor), in one process
# per framework: horovodrun forks a process per framework and per controller, each importing its
# framework again (horovod/runner/launch.py, check_build): 27 s and 28 CPU-seconds on this project's
# 2-core machine, this check 7.6 s and 8 (2026-12-07). Prints "TensorFlow PyTorch MPI Gloo [NCCL]";
# fails naming what is missing. The tests still run `horovodrun --check-build`, the command users
# run (tests/integration/test_install.py, the in-image suite).
horovod_built() {
  local controllers=(mpi gloo) names=(TensorFlow PyTorch MPI Gloo) framework module lacking missing=""
  if [ "$FLAVOR" = gpu ]; then controllers+=(nccl); names+=(NCCL); fi
  for framework in TensorFlow:horovod.tensorflow PyTorch:horovod.torch; do
    module="${framework#*:}"
    lacking="$(TF_CPP_MIN_LOG_LEVEL=3 "$PYTHON" -P -c 'import importlib, sys
ops = importlib.import_module(sys.argv[1])
print(" ".join({"gloo": "Gloo"}.get(name, name.upper()) for name in sys.argv[2:] if not getattr(ops, name + "_built")()))' "$module" "${controllers[@]}")" \
      || die "Horovod's ${framework%%:*} extension ($module) does not load in $PYTHON (the error above)"
    [ -z "$lacking" ] || missing+=" ${framework%%:*} without $lacking;"
  done
  [ -z "$missing" ] || die "Horovod was built without what the $FLAVOR flavor ships:${missing%;}"
  echo "${names[*]}"
}

# GPU flavor: triton bundles copies of CUPTI for its profiler that are byte-identical to the
# nvidia-cuda-cupti-cu12 wheel's files; each becomes a link to the wheel's file (one copy of every
# CUDA library in the image). Files that differ are left alone.
link_triton_cupti_copies() {
  local site bundled original
  site="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  for bundled in "$site"/triton/backends/nvidia/lib/cupti/*.so*; do
    if [ ! -f "$bundled" ] || [ -L "$bundled" ]; then continue; fi
    for original in "$site"/nvidia/cuda_cupti/lib/*.so*; do
      if cmp -s "$bundled" "$original"; then
        ln -sfr "$original" "$bundled"
        log "triton's $(basename "$bundled") is a copy of ${original#"$site"/}: linked"
        break
      fi
    done
  done
}

# Every package asked for is also appended (name only) to $DTC_APT_MANIFEST when that is set: the
# host setup records what it installs, and tests/integration/test_host_setup.py checks that nothing else
# was installed on the machine (a package the project relies on but setup never installs).
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  if [ -n "${DTC_APT_MANIFEST:-}" ]; then printf '%s\n' "${@%%=*}" >> "$DTC_APT_MANIFEST"; fi
  if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit 2>/dev/null)" ]; then
    apt-get update -qq
  fi
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}
