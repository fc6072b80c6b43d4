#!/usr/bin/env bash
# `docker` where a daemon answers, else `podman` with this project's settings (podman-env.sh).
# Usage: scripts/container.sh run --rm -v "$PWD/build/job/opt/ml:/opt/ml" dtc:cpu train
# `--all-gpus` (anywhere before the image) passes every NVIDIA GPU in the engine's own way:
# Docker's `--gpus all`, podman's CDI device `--device nvidia.com/gpu=all` (needs a CDI spec:
# `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`).
# `scripts/container.sh --which` prints the engine it would use (docker | podman).
set -euo pipefail
engine=podman
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then engine=docker; fi
if [ "${1:-}" = --which ]; then echo "$engine"; exit 0; fi
args=()
for arg in "$@"; do
  if [ "$arg" = --all-gpus ]; then
    if [ "$engine" = docker ]; then args+=(--gpus all); else args+=(--device nvidia.com/gpu=all); fi
  else
    args+=("$arg")
  fi
done
# shellcheck source=podman-env.sh
[ "$engine" = docker ] || . "$(dirname "$0")/podman-env.sh"
exec "$engine" "${args[@]}"
