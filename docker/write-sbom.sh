#!/usr/bin/env bash
# Writes the image's SBOM (CycloneDX 1.6 JSON; docker/sbom.py says what it holds) to OUT, with
# cyclonedx-bom $CYCLONEDX_BOM_VERSION installed in a throwaway environment that is deleted after:
# the generator is never part of the image, nor of its SBOM. The runtime stage's last step (after
# this project's own install, which the SBOM names as its main component).
#
# Usage: write-sbom.sh OUT   (env: VENV, the image's environment; FLAVOR)
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
out="${1:?usage: write-sbom.sh OUT}"
: "${VENV:?VENV must name the environment of the image}"
tool="$(mktemp -d)"
trap 'rm -rf "$tool"' EXIT
"python$PYTHON_VERSION" -m venv "$tool"
# not the image's constraint file: it protects the image's environment, and this is not it
PIP_CONSTRAINT="" PYTHON="$tool/bin/python" pip_install \
  "cyclonedx-bom==$CYCLONEDX_BOM_VERSION" "cyclonedx-python-lib==$CYCLONEDX_PYTHON_LIB_VERSION"
"$tool/bin/python" "$DOCKER_DIR/sbom.py" "$out" --python "$VENV/bin/python" --lock /opt/dtc/requirements.lock \
  --versions "$VERSIONS_FILE" --pyproject "$REPO_DIR/pyproject.toml" --patches "$DOCKER_DIR/patches" --flavor "$FLAVOR"
chmod 0644 "$out"
