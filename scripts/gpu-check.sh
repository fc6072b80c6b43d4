#!/usr/bin/env bash
# Every GPU runtime check, on a machine with NVIDIA GPUs, with a dated report: first the image's own
# `gpu-check` (the preflight in full mode and ResNet-50's images/s through the built-in trainer:
# docs/preflight.md; its report build/gpu-check-<date>.md), then tests/gpu/test_gpu.py against the GPU
# image (default dtc:gpu; `make image FLAVOR=gpu` builds it); writes build/gpu-report-<date>.md
# (machine, driver, GPUs, image, each check's result) next to build/gpu-report-<date>.xml (JUnit).
# On a machine without a GPU (nvidia-smi lists none) it checks nothing, says so, and exits 3: a run
# that proved nothing never passes for one that did.
#
# Env: GPU_IMAGE (default dtc:gpu), PYTHON (the host venv's python), PYTEST_ARGS.
set -uo pipefail
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO_DIR" || exit 1
PYTHON="${PYTHON:-$REPO_DIR/.venv/bin/python}"
GPU_IMAGE="${GPU_IMAGE:-dtc:gpu}"
stamp="$(date -u +%Y-%m-%dT%H%M%SZ)"
report="build/gpu-report-$stamp.md" junit="build/gpu-report-$stamp.xml"
mkdir -p build
gpus="$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true)"
if [ -z "$gpus" ]; then
  echo "[gpu-check] error: no NVIDIA GPU is visible here (nvidia-smi lists none): nothing was checked." >&2
  echo "[gpu-check] Run it on a machine with NVIDIA GPUs and their driver (docs/image.md, Checks)." >&2
  exit 3
fi
scripts/container.sh run --rm --all-gpus --shm-size 8g -v "$REPO_DIR/build:/out" "$GPU_IMAGE" gpu-check --out /out \
  | tee "build/gpu-check-image-$stamp.log"
image_code=${PIPESTATUS[0]}
read -r -a extra <<< "${PYTEST_ARGS:-}"
DTC_GPU_IMAGE="$GPU_IMAGE" "$PYTHON" -m pytest tests/gpu/test_gpu.py -v -rs --junitxml="$junit" "${extra[@]}" \
  | tee "build/gpu-check-$stamp.log"
code=${PIPESTATUS[0]}
{
  echo "# GPU runtime checks, $stamp"
  echo
  echo "- machine: $(uname -n), $(nproc) cores, $(uname -r)"
  echo "- image: $GPU_IMAGE"
  echo "- GPUs (index, name, driver, memory):"
  while read -r gpu; do echo "  - $gpu"; done <<<"$gpus"
  echo "- the image's gpu-check: exit $image_code (its report: build/gpu-check-*.md, log build/gpu-check-image-$stamp.log)"
  echo "- result: $(grep -E '^=+ .* in [0-9.]+s' "build/gpu-check-$stamp.log" | tail -n1 | sed -E 's/^=+ (.*) =+$/\1/')"
  echo
  echo "| check | result |"
  echo "|---|---|"
  grep -E '^tests/gpu/test_gpu.py::\S+ (PASSED|FAILED|SKIPPED|ERROR)' "build/gpu-check-$stamp.log" \
    | sed -E 's/^tests\/test_gpu.py::(\S+) (PASSED|FAILED|SKIPPED|ERROR).*/| \1 | \2 |/'
} > "$report"
echo "[gpu-check] report: $report"
[ "$image_code" = 0 ] || exit "$image_code"
exit "$code"
