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
# PyPI's CUDA 12 torch for the GPU flavor), empty (find-links hold the wheel), or an index URL.
torch_index_url() {
  case "${TORCH_INDEX_URL:-}" in
    auto) if [ "$FLAVOR" = cpu ]; then echo "https://download.pytorch.org/whl/cpu"; fi ;;
    *) echo "${TORCH_INDEX_URL:-}" ;;
  esac
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
