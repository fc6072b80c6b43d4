#!/usr/bin/env bash
# `make test` (what CI's .ci/run calls): every phase in order, each timed, a table of the times at
# the end (also build/test-phases.json), and the exit code of the first phase that failed. Every
# test tier runs even when an earlier one failed, so one run shows everything that is broken.
#
#   setup        scripts/setup-host.sh when its inputs changed (make setup)
#   image        the CPU image (make image)
#   gpu-image    the GPU image, only when its build inputs differ from tests/fixtures/gpu-verified.json
#                (scripts/gpu_inputs.py); its checks then run in the image tier (DTC_GPU_IMAGE)
#   lint         ruff and shellcheck (make lint)
#   unit         tests/unit: no process started
#   integration  tests/integration: real train, mpirun and torchrun on this host
#   cluster      tests/cluster and tests/image: containers, two-host clusters, the built images
#   gpu          tests/gpu: skipped without an NVIDIA GPU
#
# Env: TEST_PHASES (default all of the above, in that order; e.g. "lint unit" for a quick run),
# PYTEST_ARGS (added to every pytest run), INTEGRATION_WORKERS / CLUSTER_WORKERS (pytest-xdist
# processes per tier; 1 runs the tier serially), IMAGE and GPU_IMAGE (tags), MAKE, PYTHON.
set -uo pipefail
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO_DIR" || exit 1
MAKE="${MAKE:-make}"
PYTHON="${PYTHON:-$REPO_DIR/.venv/bin/python}"
IMAGE="${IMAGE:-dtc:cpu}" GPU_IMAGE="${GPU_IMAGE:-dtc:gpu}"
PHASES="${TEST_PHASES:-setup image gpu-image lint unit integration cluster gpu}"
INTEGRATION_WORKERS="${INTEGRATION_WORKERS:-2}" CLUSTER_WORKERS="${CLUSTER_WORKERS:-2}"
read -r -a pytest_args <<< "${PYTEST_ARGS:-}"
gpu_image=""
first_failure=0
declare -a rows=()

pytest_tier() {   # pytest_tier WORKERS PATH...: one tier, with its slowest tests listed
  local workers="$1"; shift
  local parallel=()
  [ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadgroup)
  DTC_IMAGE="$IMAGE" DTC_GPU_IMAGE="$gpu_image" "$PYTHON" -m pytest "$@" "${parallel[@]}" --durations=15 \
    "${pytest_args[@]}"
}

run_phase() {
  local name="$1" start code
  start=$(date +%s)
  printf '\n===== phase %s =====\n' "$name"
  case "$name" in
    setup) "$MAKE" --no-print-directory setup ;;
    image) "$MAKE" --no-print-directory image IMAGE="$IMAGE" ;;
    gpu-image)
      if python3 scripts/gpu_inputs.py check; then true
      else FLAVOR=gpu IMAGE="$GPU_IMAGE" scripts/build-image.sh && gpu_image="$GPU_IMAGE"; fi ;;
    lint) "$MAKE" --no-print-directory lint ;;
    unit) pytest_tier 1 tests/unit ;;
    integration) pytest_tier "$INTEGRATION_WORKERS" tests/integration ;;
    cluster) pytest_tier "$CLUSTER_WORKERS" tests/cluster tests/image ;;
    gpu) pytest_tier 1 tests/gpu ;;
    *) echo "unknown phase '$name' in TEST_PHASES" >&2; false ;;
  esac
  code=$?
  rows+=("$name $(( $(date +%s) - start )) $code")
  if [ "$code" != 0 ] && [ "$first_failure" = 0 ]; then first_failure=$code; fi
  # without a machine set up or an image, the later phases cannot run
  if [ "$code" != 0 ] && { [ "$name" = setup ] || [ "$name" = image ]; }; then return 1; fi
}

for phase in $PHASES; do
  run_phase "$phase" || break
done

total=0
printf '\n===== time per phase (%s) =====\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
printf '%-12s %8s %8s  %s\n' phase seconds minutes exit
json="["
for row in "${rows[@]}"; do
  read -r name seconds code <<< "$row"
  total=$(( total + seconds ))
  printf '%-12s %8d %8.1f  %s\n' "$name" "$seconds" "$(awk -v s="$seconds" 'BEGIN { print s / 60 }')" "$code"
  json+="{\"phase\": \"$name\", \"seconds\": $seconds, \"exit_code\": $code},"
done
printf '%-12s %8d %8.1f\n' total "$total" "$(awk -v s="$total" 'BEGIN { print s / 60 }')"
mkdir -p build
printf '%s]\n' "${json%,}" > build/test-phases.json
exit "$first_failure"
