#!/usr/bin/env bash
# Builds the image from ./Dockerfile: with `docker` where a daemon answers, else with buildah
# (podman's builder; no daemon needed). Every pin of versions.env goes in as a build argument.
#
# Env: FLAVOR (cpu|gpu, default cpu), IMAGE (tag, default dtc:$FLAVOR), DRY_RUN=1 (print the
# resolved build and exit), PIP_CA (a CA bundle pip needs behind a TLS-intercepting proxy; passed
# as a build secret, never stored; default: this machine's bundle when it exists),
# IMAGE_SIZE_BUDGET_GB (fail above it; docs/image.md says why 7 for cpu), INSTALL_EFA (gpu).
# The CPU flavor's base, debian:bookworm-slim, is made locally (scripts/make-base-image.sh) when
# no registry can be reached. A CPU torch wheel in pip's find-links (this project's CI machines
# have one) is handed to the build instead of PyTorch's index, which those machines cannot reach.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO_DIR"
FLAVOR="${FLAVOR:-cpu}"
IMAGE="${IMAGE:-dtc:$FLAVOR}"
log() { printf '[build-image] %s\n' "$*" >&2; }

build_args=(--build-arg "FLAVOR=$FLAVOR" --build-arg "INSTALL_EFA=${INSTALL_EFA:-false}")
while IFS='=' read -r key value; do
  [[ "$key" =~ ^[A-Z][A-Z0-9_]*$ ]] && build_args+=(--build-arg "$key=$value")
done < versions.env
. ./versions.env

mkdir -p build/wheels
local_torch="$(find ${PIP_FIND_LINKS:-/opt/wheels} -maxdepth 1 -name "torch-$TORCH_VERSION+cpu-*.whl" 2>/dev/null | head -n1 || true)"
if [ "$FLAVOR" = cpu ] && [ -n "$local_torch" ]; then
  ln -f "$local_torch" build/wheels/ 2>/dev/null || cp -f "$local_torch" build/wheels/
  build_args+=(--build-arg "TORCH_INDEX_URL=")
  log "PyTorch from the local wheel $(basename "$local_torch")"
fi

secret_args=()
PIP_CA="${PIP_CA-/etc/ssl/certs/ca-certificates.crt}"
[ -n "$PIP_CA" ] && [ -s "$PIP_CA" ] && secret_args=(--secret "id=pip_ca,src=$PIP_CA")

if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  tool=(env DOCKER_BUILDKIT=1 docker build)
else
  . scripts/podman-env.sh
  tool=(buildah bud --isolation chroot --layers --format docker)
  [ "$FLAVOR" = cpu ] && tool+=(--pull=never)
fi
cmd=("${tool[@]}" "${build_args[@]}" "${secret_args[@]}" -t "$IMAGE" -f Dockerfile .)

if [ "${DRY_RUN:-0}" = 1 ]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
if [ "$FLAVOR" = cpu ] && [ "${tool[0]}" = buildah ]; then
  podman image exists "docker.io/library/$CPU_BASE_IMAGE" || scripts/make-base-image.sh
fi
log "building $IMAGE ($FLAVOR) with ${tool[*]:0:2}"
start=$(date +%s)
"${cmd[@]}"
elapsed=$(( $(date +%s) - start ))
if [ "${tool[0]}" = buildah ]; then size=$(podman image inspect --format '{{.Size}}' "$IMAGE"); else size=$(docker image inspect --format '{{.Size}}' "$IMAGE"); fi
size_gb=$(awk -v s="$size" 'BEGIN { printf "%.2f", s / 1e9 }')
budget="${IMAGE_SIZE_BUDGET_GB:-$([ "$FLAVOR" = cpu ] && echo 7 || echo 16)}"
log "built $IMAGE in ${elapsed} s (budgets, CPU flavor on 2 cores: fresh 2400 s, after a change to our own code 120 s)"
log "size ${size_gb} GB (budget ${budget} GB; docs/image.md)"
awk -v s="$size_gb" -v b="$budget" 'BEGIN { exit !(s <= b) }' || { log "error: image is over its size budget"; exit 1; }
