#!/bin/bash
# The image's ENTRYPOINT (exec form). `train` (what SageMaker runs) starts the dtc entrypoint;
# anything else is exec'd, so `docker run IMAGE bash` works. Both paths end in `exec`, so the
# command becomes PID 1 and receives SIGTERM itself (train forwards it to the training processes).

# GPU: Horovod's PyTorch ops dlopen the unversioned "libcuda.so" (horovod/torch/cuda_util.cc).
# The NVIDIA container toolkit injects the driver's libcuda.so.1; only its newer releases add the
# unversioned link. When the driver is there and the link is not, make one in a private directory
# and put that first on the library path (inherited by every rank; mpirun forwards it). Done
# here, inline, before `exec`: a child script's export would be lost (image-build.md 9.12).
if [ -z "${DTC_NO_LIBCUDA_LINK:-}" ] && ! ldconfig -p | grep -q 'libcuda\.so '; then
  driver="$(ldconfig -p | sed -n 's/.*libcuda\.so\.1 .*=> \(.*\)/\1/p' | head -n1)"
  [ -n "$driver" ] || [ ! -e /usr/lib/x86_64-linux-gnu/libcuda.so.1 ] || driver=/usr/lib/x86_64-linux-gnu/libcuda.so.1
  if [ -n "$driver" ]; then
    mkdir -p /run/dtc/libcuda && ln -sf "$driver" /run/dtc/libcuda/libcuda.so
    export LD_LIBRARY_PATH="/run/dtc/libcuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi

# No command (the image has no CMD): inside a training job, where SageMaker (or a local mode)
# has written /opt/ml/input/config/resourceconfig.json, that means `train` (SageMaker SDK v3's
# local container mode starts the image without one when the job has no source_code);
# elsewhere (`docker run -it IMAGE`) an interactive shell.
if [ $# -eq 0 ]; then
  if [ -f "${SAGEMAKER_BASE_DIR:-/opt/ml}/input/config/resourceconfig.json" ]; then
    set -- train
  else
    set -- bash
  fi
fi

if [ "${1:-}" = train ]; then
  shift
  exec /opt/dtc/venv/bin/python -m dtc_entrypoint "$@"
fi
exec "$@"
