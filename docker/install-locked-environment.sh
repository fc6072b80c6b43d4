#!/usr/bin/env bash
# Runtime stage: creates the image's virtual environment ($VENV) from the builder stage's lock,
# with no compiler: `pip install --no-deps --require-hashes -r requirements.lock`, every
# distribution at the builder's exact version and wheel (pip refuses a wheel whose sha256 is not
# the lock's), binary wheels only, the ones the builder compiled (Horovod, mpi4py, the
# DALI TensorFlow plugin, sagemaker-training's extension) from the lock's own directory, the
# rest from pip's cache (the build's cache mount) or the index. Then the GPU flavor's CUPTI links
# (lib.sh), `pip check`, and Horovod's build check (lib.sh, horovod_built): the environment equals
# the builder's.
#
# Usage: install-locked-environment.sh DIR   (DIR holds requirements.lock and the local wheels:
# docker/lock-environment.py wrote them in the builder stage)
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
dir="${1:?usage: install-locked-environment.sh DIR (with requirements.lock)}"
[ -s "$dir/requirements.lock" ] || die "$dir/requirements.lock is missing: the builder stage writes it (docker/lock-environment.py)"
: "${VENV:?VENV must name the environment to create}"
"python$PYTHON_VERSION" -m venv "$VENV"
PYTHON="$VENV/bin/python"
log "$(grep -c -v -e '^#' -e '^-' "$dir/requirements.lock") distributions from $dir/requirements.lock"
pip_install --no-deps --require-hashes -r "$dir/requirements.lock"
if [ "$FLAVOR" = gpu ]; then link_triton_cupti_copies; fi
"$PYTHON" -m pip check
log "environment ready at $VENV: Horovod with $(horovod_built)"
