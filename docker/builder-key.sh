#!/usr/bin/env bash
# Prints the key of the builder stage's inputs (16 hex digits): the flavor, the torch index, the
# resolved pins (versions.env as docker/resolve-pins.sh wrote it, build arguments included), every
# file under docker/, and every file the build context hands over in WHEELS (build/wheels/: the
# host setup's wheels) but the handed-over builder output itself (WHEELS/builder/). The builder
# stage writes it beside its lock (/opt/dtc/wheels/builder-key); a later build whose inputs give
# the same key takes that output from WHEELS/builder/ instead of building it again
# (scripts/build-image.sh hands buildah's to Docker's build; docs/image.md, Build).
#
# Usage (in the builder stage, in /opt/dtc/src): docker/builder-key.sh WHEELS
set -euo pipefail
wheels="${1:?usage: builder-key.sh WHEELS, the build context build/wheels mounted}"
cd "$(dirname "$0")/.."
{
  printf 'FLAVOR=%s TORCH_INDEX_URL=%s\n' "${FLAVOR:?}" "${TORCH_INDEX_URL:-}"
  sha256sum versions.env
  find docker "$wheels" -path "$wheels/builder" -prune -o -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum --
} | sha256sum | cut -c1-16
