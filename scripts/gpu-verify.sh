#!/usr/bin/env bash
# Builds the GPU flavor and checks everything about it that needs no GPU (tests/image/test_gpu_image.py:
# the in-image suite, labels, the main job of both frameworks against the CPU image, a two-host
# cluster), then records what was verified in tests/fixtures/gpu-verified.json: the hash of the
# GPU build's inputs (scripts/gpu_inputs.py), the build's time and size against their budgets,
# and the checks' result. Commit that file: `make test` rebuilds and rechecks the GPU image only
# when the inputs differ from it.
#
# Env: IMAGE (the CPU image to compare with, default dtc:cpu), GPU_IMAGE (default dtc:gpu),
# PYTHON (the host venv's python), PYTEST_ARGS.
set -euo pipefail
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO_DIR"
PYTHON="${PYTHON:-$REPO_DIR/.venv/bin/python}"
IMAGE="${IMAGE:-dtc:cpu}" GPU_IMAGE="${GPU_IMAGE:-dtc:gpu}"
FLAVOR=gpu IMAGE="$GPU_IMAGE" BUILD_REPORT=build/gpu-build.json scripts/build-image.sh
mkdir -p build
set +e
read -r -a extra <<< "${PYTEST_ARGS:-}"
DTC_IMAGE="$IMAGE" DTC_GPU_IMAGE="$GPU_IMAGE" "$PYTHON" -m pytest tests/image/test_gpu_image.py "${extra[@]}" \
  | tee build/gpu-checks.log
code=${PIPESTATUS[0]}
set -e
[ "$code" = 0 ] || { echo "[gpu-verify] the GPU image's checks failed; nothing recorded" >&2; exit "$code"; }
summary="$(grep -E '^=+ .*(passed|failed).* =+$' build/gpu-checks.log | tail -n1 | sed -E 's/^=+ (.*) =+$/\1/')"
python3 scripts/gpu_inputs.py record --build-report build/gpu-build.json --checks "$summary"
