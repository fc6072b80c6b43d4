#!/usr/bin/env bash
# Builds, checks and pushes the image to Amazon ECR, one step per call, so that buildspec.yml
# (CodeBuild) and `make push` (a workstation; it runs buildspec.yml with dtc_local.buildspec) do
# exactly the same thing. Steps, in order:
#
#   repository  the ECR repository's URI, creating the repository if missing
#               (aws ecr describe-repositories / create-repository, scan on push)
#   login       aws ecr get-login-password | <engine> login --username AWS --password-stdin <registry>
#               (the AWS CLI's `ecr get-login` was removed in v2); then refuses a commit whose
#               immutable tag (below) the registry already has, before anything is built
#   build       scripts/build-image.sh for every flavor in FLAVORS (the pins of versions.env, read
#               inside the build); fails above the flavor's size budget (docs/image.md)
#   test        the in-image suite (tests/image/in_image) in every flavor, before anything is pushed
#   push        for every flavor: an immutable tag, <flavor>-<git sha, 12 hex> (refused when the
#               registry already has it: a pushed tag is never overwritten), and a descriptive tag
#               from the image's labels, <flavor>-tf<TF>-pt<PyTorch>-py<Python>[-cu<CUDA>]
#               (moves to the newest build); writes $RELEASE_DIR/images.json (every URI) and
#               $RELEASE_DIR/image-uri.txt (the first flavor's immutable URI: the artifact). Then
#               the image's SBOM and lock (copied out of it: scripts/image-files.sh) as artifacts
#               ($RELEASE_DIR/sbom-<flavor>.cdx.json, requirements-<flavor>.lock), what changed in
#               the lock since the flavor's previous release, printed and kept as
#               $RELEASE_DIR/lock-changes-<flavor>.txt (entrypoint/dtc_local/lock_diff.py), and both
#               files pushed as a two-file image (FROM scratch) tagged <immutable tag>-files and
#               <flavor>-files-latest, where the next release reads the previous lock (it pulls that
#               image, reads it and removes it from the engine's store again)
#
# Env: REGION (default $AWS_REGION, then $AWS_DEFAULT_REGION), REPOSITORY (default dtc),
# FLAVORS (space-separated; default cpu), GIT_SHA (default $CODEBUILD_RESOLVED_SOURCE_VERSION,
# then `git rev-parse HEAD`), RELEASE_DIR (default build/release), PUSH_REGISTRY (push to this
# registry instead of the repository's ECR registry, keeping the repository name: a mirror, or
# a local registry to rehearse with; tests/image/test_delivery.py), and what the AWS CLI reads
# (credentials, AWS_ENDPOINT_URL). The container engine is docker where a daemon answers (DOCKER,
# DOCKER_HOST), else podman (scripts/container.sh).
set -euo pipefail
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO_DIR"
log() { printf '[release] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

REGION="${REGION:-${AWS_REGION:-${AWS_DEFAULT_REGION:-}}}"
REPOSITORY="${REPOSITORY:-dtc}"
FLAVORS="${FLAVORS:-cpu}"
RELEASE_DIR="${RELEASE_DIR:-build/release}"
engine=scripts/container.sh
mkdir -p "$RELEASE_DIR"

need_region() {
  [ -n "$REGION" ] || die "no AWS region: set REGION (make push REGION=us-east-1) or AWS_REGION"
}

for flavor in $FLAVORS; do
  case "$flavor" in cpu|gpu) ;; *) die "FLAVORS must list cpu and/or gpu, got '$flavor'" ;; esac
done

# The repository URI written by the `repository` step, with PUSH_REGISTRY's host if set.
push_repository() {
  [ -s "$RELEASE_DIR/repository-uri" ] || die "no $RELEASE_DIR/repository-uri: run the repository step first"
  local uri
  uri="$(cat "$RELEASE_DIR/repository-uri")"
  if [ -n "${PUSH_REGISTRY:-}" ]; then uri="$PUSH_REGISTRY/${uri#*/}"; fi
  printf '%s\n' "$uri"
}

label() {  # label IMAGE KEY
  "$engine" image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1"
}

tag_exists() {  # tag_exists REPOSITORY_URI TAG: 0 when it exists, 1 when not; dies when it cannot tell
  if [ "$("$engine" --which)" = docker ]; then
    local insecure=() out
    # a registry on the loopback is plain HTTP, as Docker's daemon allows (a local rehearsal's)
    case "${1%%/*}" in 127.*|localhost|localhost:*) insecure=(--insecure) ;; esac
    if out="$("${DOCKER:-docker}" manifest inspect "${insecure[@]}" "$1:$2" 2>&1)"; then return 0; fi
    case "$out" in *"no such manifest"*|*"manifest unknown"*|*NAME_UNKNOWN*|*"not found"*) return 1 ;; esac
    die "cannot tell whether $1:$2 is in the registry, so it is not pushed (docker manifest inspect: $out)"
  else
    # podman 4.3 prints a NAME/TAG table whatever --format says
    "$engine" search --list-tags --limit 100000 "$1" 2>/dev/null | awk 'NR > 1 {print $2}' | grep -qxF -- "$2"
  fi
}

# The SBOM and lock of dtc:FLAVOR into the release: artifacts, the lock's changes since the previous
# release (the registry's FLAVOR-files-latest), and the two files as an image of their own.
publish_files() {  # publish_files REPOSITORY_URI FLAVOR TAG REVISION
  local target="$1" flavor="$2" tag="$3" revision="$4" files work id previous
  work="$(mktemp -d)"
  files="$work/files"
  scripts/image-files.sh "dtc:$flavor" "$files" || die "dtc:$flavor has no /opt/dtc/sbom.cdx.json or requirements.lock"
  cp "$files/sbom.cdx.json" "$RELEASE_DIR/sbom-$flavor.cdx.json"
  cp "$files/requirements.lock" "$RELEASE_DIR/requirements-$flavor.lock"
  if tag_exists "$target" "$flavor-files-latest"; then
    "$engine" pull -q "$target:$flavor-files-latest" > /dev/null
    id="$("$engine" create "$target:$flavor-files-latest" none)"
    "$engine" cp "$id:/requirements.lock" "$work/previous.lock"
    "$engine" rm "$id" > /dev/null
    previous="$(label "$target:$flavor-files-latest" org.opencontainers.image.revision)"
    # read, not kept: the tag moves to this release's files below, which would leave the previous
    # release's image in the engine's store with no name, one more at every release
    "$engine" rmi "$target:$flavor-files-latest" > /dev/null \
      || log "warning: $target:$flavor-files-latest stays in the engine's store (rmi failed)"
    log "requirements.lock of $flavor, changes since the previous release ($previous):"
    python3 entrypoint/dtc_local/lock_diff.py "$work/previous.lock" "$files/requirements.lock" \
      | tee "$RELEASE_DIR/lock-changes-$flavor.txt" | sed 's/^/[release]   /' >&2
  else
    log "first release of $flavor in $target: no previous lock to compare with"
    echo "first release of $flavor in $target" > "$RELEASE_DIR/lock-changes-$flavor.txt"
  fi
  printf 'FROM scratch\nCOPY sbom.cdx.json requirements.lock /\n' > "$work/Containerfile"
  "$engine" build -q --label "org.opencontainers.image.revision=$revision" -t "$target:$tag-files" \
    -f "$work/Containerfile" "$files" > /dev/null
  "$engine" tag "$target:$tag-files" "$target:$flavor-files-latest"
  for name in "$tag-files" "$flavor-files-latest"; do
    log "pushing $target:$name (SBOM and lock)"
    "$engine" push "$target:$name"
  done
  rm -rf "$work"
}

refuse_pushed() {  # refuse_pushed REPOSITORY_URI TAG: dies when the registry has the tag already
  if tag_exists "$1" "$2"; then
    die "$1:$2 is already in the registry and is never overwritten: push from a new commit (or set GIT_SHA)"
  fi
}

git_sha() {
  local sha="${GIT_SHA:-${CODEBUILD_RESOLVED_SOURCE_VERSION:-}}"
  [ -n "$sha" ] || sha="$(git rev-parse HEAD 2>/dev/null)" || die "no git commit: set GIT_SHA"
  [[ "$sha" =~ ^[0-9a-f]{12,40}$ ]] || die "GIT_SHA must be a commit hash (12 to 40 hex digits), got '$sha'"
  printf '%s\n' "${sha:0:12}"
}

step="${1:-}"
case "$step" in
  repository)
    need_region
    uri="$(aws ecr describe-repositories --region "$REGION" --repository-names "$REPOSITORY" \
             --query 'repositories[0].repositoryUri' --output text 2>/dev/null)" || uri=""
    if [ -z "$uri" ] || [ "$uri" = None ]; then
      log "creating ECR repository $REPOSITORY in $REGION"
      uri="$(aws ecr create-repository --region "$REGION" --repository-name "$REPOSITORY" \
               --image-scanning-configuration scanOnPush=true \
               --query 'repository.repositoryUri' --output text)"
    fi
    printf '%s\n' "$uri" > "$RELEASE_DIR/repository-uri"
    log "repository $uri"
    ;;
  login)
    need_region
    registry="$(push_repository)"
    registry="${registry%%/*}"
    aws ecr get-login-password --region "$REGION" | "$engine" login --username AWS --password-stdin "$registry" >/dev/null
    log "logged in to $registry"
    # A commit already pushed is refused here, before an hour of build and test (push checks again)
    target="$(push_repository)"
    sha="$(git_sha)"
    for flavor in $FLAVORS; do refuse_pushed "$target" "$flavor-$sha"; done
    ;;
  build)
    for flavor in $FLAVORS; do
      FLAVOR="$flavor" IMAGE="dtc:$flavor" BUILD_REPORT="$RELEASE_DIR/build-$flavor.json" scripts/build-image.sh
    done
    ;;
  test)
    for flavor in $FLAVORS; do
      log "in-image suite in dtc:$flavor"
      "$engine" run --rm --network none -v "$REPO_DIR/tests/image/in_image:/tests:ro" "dtc:$flavor" \
        python -m pytest -q -rs -p no:cacheprovider /tests
    done
    ;;
  push)
    target="$(push_repository)"
    sha="$(git_sha)"
    entries=()
    for flavor in $FLAVORS; do
      image="dtc:$flavor"
      descriptive="$flavor-tf$(label "$image" ai.dtc.tensorflow)-pt$(label "$image" ai.dtc.pytorch)-py$(label "$image" ai.dtc.python)"
      cuda="$(label "$image" ai.dtc.cuda)"
      [ "$cuda" = none ] || descriptive="$descriptive-cu$cuda"
      immutable="$flavor-$sha"
      refuse_pushed "$target" "$immutable"
      for tag in "$immutable" "$descriptive"; do
        "$engine" tag "$image" "$target:$tag"
        log "pushing $target:$tag"
        "$engine" push "$target:$tag"
      done
      entries+=("{\"flavor\": \"$flavor\", \"uri\": \"$target:$immutable\", \"descriptive_uri\": \"$target:$descriptive\"}")
      publish_files "$target" "$flavor" "$immutable" "$(label "$image" org.opencontainers.image.revision)"
    done
    (IFS=,; printf '[%s]\n' "${entries[*]}") > "$RELEASE_DIR/images.json"
    printf '%s\n' "$target:$(echo "$FLAVORS" | awk '{print $1}')-$sha" > "$RELEASE_DIR/image-uri.txt"
    log "pushed; URIs in $RELEASE_DIR/images.json"
    ;;
  *)
    die "usage: scripts/release.sh repository|login|build|test|push (got '${step}')"
    ;;
esac
