#!/usr/bin/env bash
# Builds mpi4py from source against the OpenMPI on PATH (mpicc), so that it and Horovod share one
# libmpi, with the hardening flags (lib.sh: built_wheel, kept per inputs). sagemaker-training's MPI
# command is `python -m mpi4py` (deep-learning-containers#1968).
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
command -v mpicc >/dev/null || die "mpicc not found; run docker/install-openmpi.sh first"
log "mpi4py $MPI4PY_VERSION against $(command -v mpicc)"
dir="$(MPICC="$(command -v mpicc)" built_wheel "$(mpi4py_entry)" "mpi4py==$MPI4PY_VERSION")"
pip_install --no-deps --force-reinstall "$dir"/mpi4py-*.whl
"$PYTHON" -c 'from mpi4py import MPI; v = MPI.Get_library_version(); assert "Open MPI" in v, v; print(v.splitlines()[0])'
