#!/usr/bin/env bash
# Installs the pinned Python stack into $PYTHON's environment: packaging tools, numpy, protobuf, ml_dtypes,
# TensorFlow + tf-keras, PyTorch, sagemaker-training (its gethostname C extension compiled here with
# the hardening flags: lib.sh, built_wheel),
# scikit-learn (ships the digits data set), Pillow, TensorBoard and matplotlib (the trainers' event files
# and report plots), pytest (the image's own sanity suite), and the companion libraries users' scripts
# import (torchvision, torchaudio on the GPU flavor, scipy, pandas, h5py, OpenCV, boto3, mlflow with
# sagemaker-mlflow, ...: versions.env).
#
# CPU flavor: PyTorch's CPU build, `torch==$TORCH_VERSION+cpu`. TORCH_INDEX_URL names the index
# that has it: `auto` (the image's default) is PyTorch's CPU index; leave it empty where pip's
# find-links already hold the wheel (this project's CI machines have it on disk).
#
# GPU flavor: `torch==$TORCH_GPU_VERSION` from PyPI (2.10.0, CUDA 12.8), whose nvidia-*-cu12
# wheels are the one copy of every CUDA library in the image; `tensorflow` without its and-cuda
# extra (that extra asks for NCCL >= 2.27.7, torch 2.10 pins 2.27.5; everything else it asks for,
# torch brings, except the nvcc wheel's ptxas for XLA, installed here). A newer torch from
# PyTorch's own CUDA 12 index: TORCH_GPU_VERSION=2.13.0+cu129
# TORCH_INDEX_URL=https://download.pytorch.org/whl/cu129 (docs/versions.md). Ends by checking
# that every CUDA wheel installed is of CUDA_MAJOR (cu12 and cu13 wheels overwrite each other's
# files), and by replacing the copies of CUPTI that triton bundles for its profiler with links
# to the nvidia-cuda-cupti-cu12 files they are byte-identical to (one copy of every CUDA library
# in the image; files that differ are left alone).
#
# TensorFlow: `tensorflow` (not `tensorflow-cpu`) because tf-keras depends on `tensorflow`;
# installing both would put two copies of TF in one site-packages.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

log "packaging tools"
pip_install "pip==$PIP_VERSION" "setuptools==$SETUPTOOLS_VERSION" "wheel==$WHEEL_VERSION"

index_args=()
torch_index="$(torch_index_url)"
[ -n "$torch_index" ] && index_args=(--extra-index-url "$torch_index")
if [ "$FLAVOR" = gpu ]; then
  framework_reqs=("torch==$TORCH_GPU_VERSION" "tensorflow==$TENSORFLOW_VERSION"
                  "nvidia-cuda-nvcc-cu$CUDA_MAJOR==$TF_NVCC_CU12_VERSION"
                  "torchvision==$TORCHVISION_GPU_VERSION" "torchaudio==$TORCHAUDIO_GPU_VERSION")
else
  framework_reqs=("torch==$TORCH_VERSION+cpu" "tensorflow==$TENSORFLOW_VERSION")
  # Without PyTorch's CPU index, torchvision is PyPI's build, patched: install_patched_torchvision.
  if [ -n "$torch_index" ]; then framework_reqs+=("torchvision==$TORCHVISION_VERSION+cpu"); fi
fi
# What users' own scripts import on the images they would otherwise use (versions.env, Companion libraries).
companion_reqs=("scipy==$SCIPY_VERSION" "pandas==$PANDAS_VERSION" "h5py==$H5PY_VERSION"
                "opencv-python-headless==$OPENCV_PYTHON_HEADLESS_VERSION" "boto3==$BOTO3_VERSION"
                "filelock==$FILELOCK_VERSION" "tqdm==$TQDM_VERSION" "pyyaml==$PYYAML_VERSION"
                "mlflow==$MLFLOW_VERSION" "sagemaker-mlflow==$SAGEMAKER_MLFLOW_VERSION")

# sagemaker-training is an sdist: its wheel, compiled here, is found first (pip prefers a wheel).
# A --find-links given here would replace PIP_FIND_LINKS's, so those are given again.
find_links=(--find-links "$(built_wheel "$(sagemaker_training_entry)" "sagemaker-training==$SAGEMAKER_TRAINING_VERSION")")
for link in ${PIP_FIND_LINKS:-}; do find_links+=(--find-links "$link"); done

log "frameworks ($FLAVOR): ${framework_reqs[*]}"
pip_install "${index_args[@]}" "${find_links[@]}" \
  "numpy==$NUMPY_VERSION" "protobuf==$PROTOBUF_VERSION" "ml-dtypes==$ML_DTYPES_VERSION" "${framework_reqs[@]}" "tf-keras==$TF_KERAS_VERSION" \
  "sagemaker-training==$SAGEMAKER_TRAINING_VERSION" \
  "scikit-learn==$SCIKIT_LEARN_VERSION" "pillow==$PILLOW_VERSION" "tensorboard==$TENSORBOARD_VERSION" "matplotlib==$MATPLOTLIB_VERSION" "pytest==$PYTEST_VERSION" \
  "${companion_reqs[@]}" \
  || die "framework install failed; for PyTorch's $FLAVOR build set TORCH_INDEX_URL (see docs/versions.md)"

# CPU flavor without PyTorch's CPU index (TORCH_INDEX_URL empty: torch from a wheel on disk), where
# its +cpu torchvision cannot be had: PyPI's torchvision, a CUDA build whose compiled ops cannot load
# beside torch+cpu, with docker/patches/torchvision/ applied so that its import does not need them
# (models and transforms are Python; torchvision.ops.nms and the other compiled ops raise
# torchvision's own "Couldn't load custom C++ ops"). Repacked as a wheel with build tag 1 and kept
# under $TORCHVISION_WHEEL_CACHE/<version>-<patches' hash>/, where docker/lock-environment.py finds
# it byte for byte, so the image's runtime stage installs the same patched files.
TORCHVISION_WHEEL_CACHE="${TORCHVISION_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dtc/torchvision-wheels}"
install_patched_torchvision() {
  local key dir work tree p
  key="$(cat "$DOCKER_DIR"/patches/torchvision/*.patch | sha256sum | cut -c1-16)"
  dir="$TORCHVISION_WHEEL_CACHE/$TORCHVISION_VERSION-$key"
  if ! compgen -G "$dir/torchvision-$TORCHVISION_VERSION-1-*.whl" > /dev/null; then
    log "torchvision $TORCHVISION_VERSION: PyPI's build, patched (docker/patches/torchvision), into $dir"
    work="$(mktemp -d)"
    "$PYTHON" -m pip download --disable-pip-version-check --quiet --no-deps --only-binary=:all: \
      -d "$work" "torchvision==$TORCHVISION_VERSION"
    "$PYTHON" -m wheel unpack -d "$work/tree" "$work"/torchvision-*.whl > /dev/null
    tree="$work/tree/torchvision-$TORCHVISION_VERSION"
    for p in "$DOCKER_DIR"/patches/torchvision/*.patch; do patch -d "$tree" -p1 --forward --quiet < "$p"; done
    mkdir -p "$dir"
    "$PYTHON" -m wheel pack --build-number 1 -d "$dir" "$tree" > /dev/null
    rm -rf "$work"
  fi
  pip_install --no-deps "$dir/torchvision-$TORCHVISION_VERSION"-1-*.whl
  "$PYTHON" -c 'import torchvision.models' || die "torchvision does not import after its patches ($dir)"
}
if [ "$FLAVOR" = cpu ] && [ -z "$torch_index" ]; then install_patched_torchvision; fi

if [ "$FLAVOR" = gpu ]; then
  "$PYTHON" - "$CUDA_MAJOR" <<'PY' || die "CUDA wheels of another major than CUDA_MAJOR=$CUDA_MAJOR are installed"
import re, sys
from importlib import metadata
major, found = sys.argv[1], {}
for dist in metadata.distributions():
    name = dist.metadata["Name"].lower()
    if match := re.search(r"-cu(\d+)$", name):
        found[name] = match.group(1)
other = {name: m for name, m in found.items() if m != major}
print(f"other CUDA majors: {other}" if other else f"{len(found)} CUDA wheels, all cu{major}")
sys.exit(1 if other else 0)
PY
  link_triton_cupti_copies
fi
