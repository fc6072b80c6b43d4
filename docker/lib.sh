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
