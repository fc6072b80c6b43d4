#!/usr/bin/env bash
# `docker` where a daemon answers, else `podman` with this project's settings (podman-env.sh).
# Usage: scripts/container.sh run --rm -v "$PWD/build/job/opt/ml:/opt/ml" dtc:cpu train
# `--all-gpus` (anywhere before the image) passes every NVIDIA GPU in the engine's own way:
# Docker's `--gpus all`, podman's CDI device `--device nvidia.com/gpu=all` (needs a CDI spec:
# `nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`).
# `scripts/container.sh --which` prints the engine it would use (docker | podman).
# Env: DOCKER (the Docker CLI, default `docker` on PATH; scripts/docker-daemon.sh env names
# Debian's), DOCKER_HOST (which daemon; unset: Docker's default socket).
set -euo pipefail
engine=podman
docker="${DOCKER:-docker}"
if command -v "$docker" >/dev/null && "$docker" info >/dev/null 2>&1; then engine=docker; fi
if [ "${1:-}" = --which ]; then echo "$engine"; exit 0; fi
args=()
for arg in "$@"; do
  if [ "$arg" = --all-gpus ]; then
    if [ "$engine" = docker ]; then args+=(--gpus all); else args+=(--device nvidia.com/gpu=all); fi
  else
    args+=("$arg")
  fi
done
if [ "$engine" = docker ]; then exec "$docker" "${args[@]}"; fi
# shellcheck source=podman-env.sh
. "$(dirname "$0")/podman-env.sh"
exec podman "${args[@]}"
