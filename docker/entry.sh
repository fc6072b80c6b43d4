#!/bin/bash
# The image's ENTRYPOINT (exec form). `train` (what SageMaker runs) starts the dtc entrypoint;
# anything else is exec'd, so `docker run IMAGE bash` works. Both paths end in `exec`, so the
# command becomes PID 1 and receives SIGTERM itself (train forwards it to the training processes).

# CUDA forward compatibility: when the host's driver is older than the CUDA in this image, the
# compat libraries must come first on the library path. Done here, inline, before `exec`: run as a
# child script (as AWS's start_cuda_compat.sh is) the export would be lost (image-build.md 9.12).
if [ -d /usr/local/cuda/compat ] && [ -r /proc/driver/nvidia/version ]; then
  driver="$(sed -n 's/.*Kernel Module *\([0-9.]*\).*/\1/p' /proc/driver/nvidia/version | head -n1)"
  compat="$(ls /usr/local/cuda/compat/libcuda.so.*.* 2>/dev/null | sed 's/.*libcuda\.so\.//' | sort -V | tail -n1)"
  if [ -n "$driver" ] && [ -n "$compat" ] \
     && [ "$(printf '%s\n%s\n' "$driver" "$compat" | sort -V | head -n1)" = "$driver" ] && [ "$driver" != "$compat" ]; then
    export LD_LIBRARY_PATH="/usr/local/cuda/compat${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi

if [ "${1:-}" = train ]; then
  shift
  exec /opt/dtc/venv/bin/python -m dtc_entrypoint "$@"
fi
exec "$@"
