#!/usr/bin/env bash
# Builds the image from ./Dockerfile: with `docker` where a daemon answers, else with buildah
# (podman's builder; no daemon needed). The pins come from versions.env inside the build (the
# Dockerfile copies it), so no pin is a build argument: with Docker this is README's plain
# `docker build --network host --build-arg FLAVOR=... .` plus labels and the CA secret, which
# BuildKit keeps out of its cache keys, so either command reuses the other's layers
# (tests/image/test_delivery.py runs README's commands after this script's build).
#
# Env: FLAVOR (cpu|gpu, default cpu), IMAGE (tag, default dtc:$FLAVOR), DRY_RUN=1 (print the
# resolved build and exit), PIP_CA (a CA bundle pip needs behind a TLS-intercepting proxy; passed
# as a build secret, never stored; default: this machine's bundle when it exists),
# IMAGE_SIZE_BUDGET_GB and IMAGE_BUILD_BUDGET_S (the build fails above them; defaults per flavor,
# justified in docs/image.md), IMAGE_BUILD_FREE_GB (the free disk a fresh build needs where the
# images live, blobs in /var/tmp on the same disk: the build refuses to start with less, in
# seconds, instead of failing an hour in; defaults per flavor, measured in docs/image.md; with
# TMPDIR=/dev/shm and the memory for the largest layer, the disk peak is that layer smaller),
# INSTALL_EFA (gpu), BUILD_REPORT (a JSON file to write the build's flavor, time, size and budgets to),
# DOCKER (the Docker CLI, default `docker`; it must build with BuildKit: Debian's docker.io 20.10,
# or a newer one with the buildx plugin), DOCKER_HOST (which daemon), DTC_BUILDER_CACHE (where buildah's
# builder output is kept for the next build, default ~/.cache/dtc/builder-output; below).
# Writes, beside the image, build/image-files/<IMAGE, ':' and '/' as '_'>/sbom.cdx.json and
# requirements.lock: the image's SBOM (docker/sbom.py) and the lock its environment was installed from.
#
# Disk (measured in docs/image.md): buildah writes a layer three times while committing it (the
# build container's files, a temporary blob in TMPDIR, default /var/tmp, and the stored layer);
# the largest layer is the runtime stage's virtual environment (5 GB cpu, 11 GB gpu), installed
# from the builder stage's lock, which keeps no copy of it. `--force-rm` removes a build's
# containers even when it fails (each holds a copy of the layers it was writing); after a build
# this script removes the image the tag named before, with the layers no other image uses. It
# prunes nothing else: a stage's last layer is an untagged image with no child, which
# `podman image prune` would take, and the next build would run that stage's last step again.
# Both flavors build on debian:bookworm-slim, made locally (scripts/make-base-image.sh) when no
# registry can be reached. A CPU torch wheel in pip's find-links (this project's CI machines have
# one) is handed to the build instead of PyTorch's index, which those machines cannot reach, and
# the wheels the host setup compiled from the same inputs are handed over too (Horovod's:
# docker/build-horovod.sh, HOROVOD_WHEEL_SEED; mpi4py's, sagemaker-training's and the DALI
# plugin's: docker/lib.sh, built_wheel, DTC_WHEEL_SEED), so the CPU image does not compile them again.
# It adds the OCI annotations version, revision, source, licenses and base.name: the first three
# from pyproject.toml and git (DTC_VERSION, GIT_SHA, SOURCE_URL override them; SOURCE_URL defaults
# to CodeBuild's source, then the clone's origin, then the clone's own path).
set -euo pipefail
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO_DIR"
FLAVOR="${FLAVOR:-cpu}"
IMAGE="${IMAGE:-dtc:$FLAVOR}"
log() { printf '[build-image] %s\n' "$*" >&2; }
case "$FLAVOR" in
  cpu) size_budget_gb=7;  time_budget_s=2400; free_needed_gb=30 ;;
  gpu) size_budget_gb=13; time_budget_s=3600; free_needed_gb=50 ;;
  *) log "error: FLAVOR must be cpu or gpu, got '$FLAVOR'"; exit 2 ;;
esac
size_budget_gb="${IMAGE_SIZE_BUDGET_GB:-$size_budget_gb}"
time_budget_s="${IMAGE_BUILD_BUDGET_S:-$time_budget_s}"
free_needed_gb="${IMAGE_BUILD_FREE_GB:-$free_needed_gb}"

build_args=(--build-arg "FLAVOR=$FLAVOR")
[ -z "${INSTALL_EFA:-}" ] || build_args+=(--build-arg "INSTALL_EFA=$INSTALL_EFA")
# shellcheck source=../versions.env
. ./versions.env
git_sha="${GIT_SHA:-${CODEBUILD_RESOLVED_SOURCE_VERSION:-$(git rev-parse HEAD 2>/dev/null || true)}}"
source_url="${SOURCE_URL:-${CODEBUILD_SOURCE_REPO_URL:-$(git remote get-url origin 2>/dev/null || echo "file://$REPO_DIR")}}"
version="${DTC_VERSION:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)}"
# As --label, not as build arguments of a LABEL instruction: buildah takes a LABEL step from its
# cache whatever the arguments' values are, and a new commit would keep the old revision.
build_args+=(--label "org.opencontainers.image.version=$version" --label "org.opencontainers.image.revision=$git_sha"
             --label "org.opencontainers.image.source=$source_url" --label "org.opencontainers.image.licenses=Apache-2.0"
             --label "org.opencontainers.image.base.name=$BASE_IMAGE")

# (in build/wheels, where the build's TORCH_INDEX_URL=auto takes it instead of PyTorch's index: docker/lib.sh)
local_torch="$(find "${PIP_FIND_LINKS:-/opt/wheels}" -maxdepth 1 -name "torch-$TORCH_VERSION+cpu-*.whl" 2>/dev/null | head -n1 || true)"
[ "$FLAVOR" = cpu ] || local_torch=""
host_python="${VENV:-$REPO_DIR/.venv}/bin/python"
horovod_entry=""
if [ -x "$host_python" ]; then
  cached="$(FLAVOR="$FLAVOR" PYTHON="$host_python" docker/build-horovod.sh --print-entry)"
  [ -z "$cached" ] || [ -z "$(ls "$cached"/horovod-*.whl 2>/dev/null)" ] || horovod_entry="$cached"
  # shellcheck disable=SC2016  # expanded by the inner bash
  built_entries="$(FLAVOR="$FLAVOR" PYTHON="$host_python" bash -c \
    'source docker/lib.sh && echo "$DTC_WHEEL_CACHE" && mpi4py_entry && sagemaker_training_entry && dali_tf_plugin_entry')"
fi

# What the build gets from this machine, in build/wheels (the only part of build/ in the context, and
# the only part of the context the builder step mounts; .gitkeep, tracked, keeps it in a clone).
stage_wheels() {
  rm -rf build/wheels && mkdir -p build/wheels && : > build/wheels/.gitkeep
  if [ -n "$local_torch" ]; then
    ln -f "$local_torch" build/wheels/ 2>/dev/null || cp -f "$local_torch" build/wheels/
    log "PyTorch from the local wheel $(basename "$local_torch")"
  fi
  if [ -n "$horovod_entry" ]; then
    mkdir -p "build/wheels/horovod/$(basename "$horovod_entry")"
    cp -l "$horovod_entry"/horovod-*.whl "build/wheels/horovod/$(basename "$horovod_entry")/" 2>/dev/null \
      || cp "$horovod_entry"/horovod-*.whl "build/wheels/horovod/$(basename "$horovod_entry")/"
    log "Horovod from the host setup's wheel $(basename "$horovod_entry") (same inputs, not compiled again)"
  fi
  rm -rf build/builder && mkdir -p build/builder && : > build/builder/.gitkeep
  if [ -s "$builder_cache/$FLAVOR/builder-key" ]; then
    cp -l "$builder_cache/$FLAVOR"/* build/builder/ 2>/dev/null || cp "$builder_cache/$FLAVOR"/* build/builder/
    log "the builder output of buildah's last $FLAVOR build (key $(cat build/builder/builder-key)) in build/builder/:" \
        "the builder stage takes it where its inputs give the same key"
  fi
  [ -n "${built_entries:-}" ] || return 0
  local cache entry
  cache="$(head -n1 <<< "$built_entries")"
  while read -r entry; do
    if compgen -G "$cache/$entry/*.whl" > /dev/null; then
      mkdir -p "build/wheels/built/$entry"
      cp -l "$cache/$entry"/*.whl "build/wheels/built/$entry/" 2>/dev/null || cp "$cache/$entry"/*.whl "build/wheels/built/$entry/"
      log "${entry%-*-*} from the host setup's wheel $entry (same inputs, not compiled again)"
    fi
  done < <(tail -n +2 <<< "$built_entries")
}

# buildah's builder output (the lock, the constraint file, the wheels it compiled, the key of its
# inputs: docker/builder-key.sh), kept after each buildah build and handed to the next build in
# build/builder/: Docker's build of the same inputs takes it instead of resolving, compiling and
# locking the same environment again (606 s on a new machine, docs/development.md).
builder_cache="${DTC_BUILDER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dtc/builder-output}"
export_builder_output() {
  local iid ctr tmp
  iid="$(mktemp)"
  "${tool[@]}" "${build_args[@]}" "${secret_args[@]}" --target builder --iidfile "$iid" -f Dockerfile . \
    > /dev/null 2>&1 9>&- || { log "warning: the builder stage was not found in the layer cache; nothing handed over"; return 0; }
  mkdir -p "$builder_cache"
  tmp="$(mktemp -d "$builder_cache/.tmp.XXXXXX")" && chmod 755 "$tmp"
  ctr="$(podman create --pull=never "$(cat "$iid")" true)"
  podman cp "$ctr:/opt/dtc/wheels/." "$tmp/" || true
  podman rm "$ctr" > /dev/null
  rm -f "$iid"
  if [ -s "$tmp/builder-key" ]; then
    rm -rf "${builder_cache:?}/$FLAVOR" && mv "$tmp" "$builder_cache/$FLAVOR"
    log "builder output (key $(cat "$builder_cache/$FLAVOR/builder-key")) kept in $builder_cache/$FLAVOR for the next build"
  else
    rm -rf "$tmp"; log "warning: the builder stage's output has no builder-key; nothing handed over"
  fi
}

secret_args=()
PIP_CA="${PIP_CA-/etc/ssl/certs/ca-certificates.crt}"
[ -n "$PIP_CA" ] && [ -s "$PIP_CA" ] && secret_args=(--secret "id=pip_ca,src=$PIP_CA")

docker="${DOCKER:-docker}"
if command -v "$docker" >/dev/null && "$docker" info >/dev/null 2>&1; then
  # RUN steps on the host's network, as buildah's chroot isolation has them (a daemon may have no
  # default bridge: scripts/docker-daemon.sh)
  tool=(env DOCKER_BUILDKIT=1 "$docker" build --network host)
else
  . scripts/podman-env.sh
  tool=(buildah bud --isolation chroot --layers --force-rm --format docker --pull=never)
fi
cmd=("${tool[@]}" "${build_args[@]}" "${secret_args[@]}" -t "$IMAGE" -f Dockerfile .)

if [ "${DRY_RUN:-0}" = 1 ]; then
  printf '%q ' "${cmd[@]}"; echo
  exit 0
fi
# A build's layers, the copy of the virtual environment into the runtime stage and its commit
# (written once as a temporary file, then as the layer) need free_needed_gb where the images and
# the temporary files live; with less, a build fails late with "no space left on device".
check_free_space() {
  local dir free_gb
  for dir in "$@"; do
    free_gb="$(df -P -BG "$dir" | awk 'NR == 2 {print $4 + 0}')"
    if [ "$free_gb" -lt "$free_needed_gb" ]; then
      log "error: building the $FLAVOR image needs about ${free_needed_gb} GB free in $dir, which has ${free_gb} GB:"
      log "  free space (podman image prune -a removes unused images and their layer cache; 'podman images'"
      log "  lists what is held), or set IMAGE_BUILD_FREE_GB to build anyway (docs/image.md: disk)"
      exit 3
    fi
  done
}
engine="$docker"
[ "${tool[0]}" = buildah ] && engine=podman
replaced="$("$engine" image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
if [ "${tool[0]}" = buildah ]; then
  check_free_space "$(podman info --format '{{.Store.GraphRoot}}')"
  podman image exists "docker.io/library/$BASE_IMAGE" || scripts/make-base-image.sh
else
  check_free_space "$("$docker" info --format '{{.DockerRootDir}}')"
  if ! "$docker" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then   # no registry: podman's local base
    . scripts/podman-env.sh
    podman image exists "docker.io/library/$BASE_IMAGE" || scripts/make-base-image.sh
    log "loading the base image $BASE_IMAGE from podman's store into Docker's"
    podman save "docker.io/library/$BASE_IMAGE" | "$docker" load
  fi
fi
# One build at a time per checkout: build/wheels is the context's staging area, and the tests start
# builds from several workers at once (make train and make cluster with Docker, the buildspec).
mkdir -p build
exec 9>> build/build-image.lock
if ! flock -n 9; then
  log "waiting for the build already running in this checkout: $(cat build/build-image.owner 2>/dev/null || echo unknown)"
  flock 9
fi
echo "$IMAGE ($FLAVOR), process $$, started $(date -u +%Y-%m-%dT%H:%M:%SZ)" > build/build-image.owner
stage_wheels
log "building $IMAGE ($FLAVOR) with ${tool[*]:0:2}"
start=$(date +%s)
# The lock's descriptor (9) is closed for the build: buildah's RUN steps would inherit it, and a
# killed build's leftover step would hold the lock with no build running.
if [ "${tool[0]}" = buildah ]; then
  # buildah warns of every ARG given no value: the pins, which versions.env gives inside the build
  "${cmd[@]}" 9>&- 2> >(grep --line-buffered -v 'level=warning msg="missing \\".*\\" build argument' >&2 9>&-)
  export_builder_output
else
  "${cmd[@]}" 9>&-
fi
elapsed=$(( $(date +%s) - start ))
size=$("$engine" image inspect --format '{{.Size}}' "$IMAGE")
built="$("$engine" image inspect --format '{{.Id}}' "$IMAGE")"
if [ -n "$replaced" ] && [ "$replaced" != "$built" ] && "$engine" image rm "$replaced" >/dev/null 2>&1; then
  log "removed ${replaced:0:12}, the image $IMAGE named before this build, with the layers no other image uses"
fi
size_gb=$(awk -v s="$size" 'BEGIN { printf "%.2f", s / 1e9 }')
log "built $IMAGE in ${elapsed} s (budget ${time_budget_s} s; a rebuild after a change to our own code takes about 1 to 2 minutes)"
log "size ${size_gb} GB (budget ${size_budget_gb} GB; docs/image.md)"
if [ -n "${BUILD_REPORT:-}" ]; then
  mkdir -p "$(dirname "$BUILD_REPORT")"
  printf '{"image": "%s", "flavor": "%s", "date": "%s", "build_s": %d, "build_budget_s": %d, "size_gb": %s, "size_budget_gb": %s}\n' \
    "$IMAGE" "$FLAVOR" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$elapsed" "$time_budget_s" "$size_gb" "$size_budget_gb" > "$BUILD_REPORT"
fi
# The image's SBOM and lock beside it, for the user (make push publishes them, from the image it pushes).
files_dir="build/image-files/$(tr ':/' '__' <<< "$IMAGE")"
scripts/image-files.sh "$IMAGE" "$files_dir"
log "SBOM and lock of $IMAGE: $files_dir/sbom.cdx.json, $files_dir/requirements.lock"
awk -v s="$size_gb" -v b="$size_budget_gb" 'BEGIN { exit !(s <= b) }' || { log "error: image is over its size budget"; exit 1; }
[ "$elapsed" -le "$time_budget_s" ] || { log "error: the build took longer than its budget"; exit 1; }
