#!/usr/bin/env bash
# Copies a built image's SBOM and lock (/opt/dtc/sbom.cdx.json, /opt/dtc/requirements.lock) into DIR,
# emptied first, with the engine scripts/container.sh picks: what `make image` writes beside the image
# (scripts/build-image.sh) and what `make push` publishes with it (scripts/release.sh).
# Usage: scripts/image-files.sh IMAGE DIR
set -euo pipefail
image="${1:?usage: image-files.sh IMAGE DIR}"
dir="${2:?usage: image-files.sh IMAGE DIR}"
rm -rf "$dir" && mkdir -p "$dir"
"$(dirname "$0")/container.sh" run --rm --network none --entrypoint tar "$image" -C /opt/dtc -c sbom.cdx.json \
  requirements.lock | tar -x -C "$dir"
