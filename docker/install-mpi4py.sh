#!/usr/bin/env bash
# Builds mpi4py from source against the OpenMPI on PATH (mpicc), so that it and Horovod share one
# libmpi. sagemaker-training's MPI command is `python -m mpi4py` (deep-learning-containers#1968).
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
command -v mpicc >/dev/null || die "mpicc not found; run docker/install-openmpi.sh first"
log "mpi4py $MPI4PY_VERSION against $(command -v mpicc)"
MPICC="$(command -v mpicc)" pip_install --no-binary=mpi4py "mpi4py==$MPI4PY_VERSION"
"$PYTHON" -c 'from mpi4py import MPI; v = MPI.Get_library_version(); assert "Open MPI" in v, v; print(v.splitlines()[0])'
