# syntax=docker/dockerfile:1.7
# dtc: the distributed-training image for Amazon SageMaker. One file, two flavors:
#   docker build --build-arg FLAVOR=cpu -t dtc:cpu .      (Debian bookworm, PyTorch CPU build)
#   docker build --build-arg FLAVOR=gpu -t dtc:gpu .      (nvidia/cuda devel -> runtime, NCCL)
# Every version is in versions.env; scripts/build-image.sh passes each as a build argument, and
# the defaults below equal versions.env (tests/test_dockerfile.py checks).
# Builder stage: compiles Horovod, mpi4py, the DALI TF plugin and sagemaker-training's extension
# with the docker/ scripts the host setup runs too. Runtime stage: no compilers; it copies the
# virtual environment and installs this project's own code last, so a code change rebuilds in
# seconds. Build secrets/caches (pip CA, pip and Horovod caches) are mounts, never layers.

ARG FLAVOR=cpu
ARG CPU_BASE_IMAGE=debian:bookworm-slim
ARG GPU_BUILDER_IMAGE=nvidia/cuda:12.9.1-cudnn-devel-ubuntu22.04
ARG GPU_RUNTIME_IMAGE=nvidia/cuda:12.9.1-cudnn-runtime-ubuntu22.04

FROM ${CPU_BASE_IMAGE} AS builder-cpu
FROM ${GPU_BUILDER_IMAGE} AS builder-gpu
FROM ${CPU_BASE_IMAGE} AS runtime-cpu
FROM ${GPU_RUNTIME_IMAGE} AS runtime-gpu

# ------------------------------------------------------------------------------------ builder
# hadolint ignore=DL3006
FROM builder-${FLAVOR} AS builder
ARG FLAVOR
ARG PYTHON_VERSION=3.11
ARG TENSORFLOW_VERSION=2.21.0
ARG TORCH_VERSION=2.13.0
ARG HOROVOD_VERSION=0.28.1
ARG TORCH_INDEX_URL=auto
ARG HOROVOD_BUILD_JOBS=
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV FLAVOR=${FLAVOR} VENV=/opt/dtc/venv PYTHON=/opt/dtc/venv/bin/python PATH=/opt/dtc/venv/bin:${PATH} \
    PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive
WORKDIR /opt/dtc/src
COPY versions.env ./
COPY docker/ ./docker/
RUN ./docker/install-system-packages.sh builder && mkdir -p /opt/openmpi \
 && "python${PYTHON_VERSION}" -m venv "${VENV}"
# GPU builds link against the CUDA driver stubs (no driver on build machines); the runtime stage
# never sees them (image-build.md pitfall 13).
RUN if [ "${FLAVOR}" = gpu ]; then ln -sf /usr/local/cuda/lib64/stubs/libcuda.so /usr/local/cuda/lib64/stubs/libcuda.so.1; fi
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip --mount=type=bind,target=/ctx \
    if [ -d /ctx/build/wheels ]; then export PIP_FIND_LINKS=/ctx/build/wheels; fi \
 && ./docker/install-python-packages.sh
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    ./docker/install-mpi4py.sh
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip --mount=type=cache,target=/root/.cache/dtc \
    LIBRARY_PATH=/usr/local/cuda/lib64/stubs ./docker/build-horovod.sh
RUN --mount=type=secret,id=pip_ca --mount=type=cache,target=/root/.cache/pip \
    ./docker/install-dali.sh && "${PYTHON}" -m pip check

# ------------------------------------------------------------------------------------ runtime
# hadolint ignore=DL3006
FROM runtime-${FLAVOR} AS runtime
ARG FLAVOR
ARG PYTHON_VERSION=3.11
ARG TENSORFLOW_VERSION=2.21.0
ARG TORCH_VERSION=2.13.0
ARG HOROVOD_VERSION=0.28.1
ARG CUDA_VERSION=12.9.1
ARG INSTALL_EFA=false
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
LABEL org.opencontainers.image.title="dtc" \
      org.opencontainers.image.description="Distributed-training container for Amazon SageMaker: TensorFlow and PyTorch with Horovod" \
      ai.dtc.flavor="${FLAVOR}" ai.dtc.python="${PYTHON_VERSION}" ai.dtc.tensorflow="${TENSORFLOW_VERSION}" \
      ai.dtc.pytorch="${TORCH_VERSION}" ai.dtc.horovod="${HOROVOD_VERSION}" ai.dtc.cuda="${CUDA_VERSION}"
ENV FLAVOR=${FLAVOR} VENV=/opt/dtc/venv PYTHON=/opt/dtc/venv/bin/python PATH=/opt/dtc/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 DEBIAN_FRONTEND=noninteractive \
    TF_USE_LEGACY_KERAS=1 NVIDIA_DRIVER_CAPABILITIES=compute,utility
WORKDIR /opt/dtc/src
COPY versions.env ./
COPY docker/ ./docker/
COPY --from=builder /opt/openmpi /opt/openmpi
RUN ./docker/install-system-packages.sh runtime && ./docker/configure-sshd.sh && ./docker/install-efa.sh
COPY docker/nccl.conf /etc/nccl.conf
COPY --from=builder /opt/dtc/venv /opt/dtc/venv
# This project's own code: the last layers, so changing it rebuilds only these.
COPY pyproject.toml README.md ./
COPY entrypoint/ ./entrypoint/
COPY train/ ./train/
RUN "${PYTHON}" -m pip install --quiet --no-deps --no-build-isolation --no-cache-dir . \
 && rm -rf build ./*.egg-info && mkdir -p /opt/ml/code \
 && install -m 0755 docker/entry.sh /usr/local/bin/dtc-entry
WORKDIR /
EXPOSE 22
ENTRYPOINT ["/usr/local/bin/dtc-entry"]
CMD ["bash"]
