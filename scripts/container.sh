#!/usr/bin/env bash
# `docker` where a daemon answers, else `podman` with the settings this project's CI machines
# need (runc, and ulimits within the machine's hard limits; image-feasibility.md section 2).
# Usage: scripts/container.sh run --rm -v "$PWD/build/job/opt/ml:/opt/ml" dtc:cpu train
set -euo pipefail
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  exec docker "$@"
fi
conf="${CONTAINERS_CONF:-$(cd "$(dirname "$0")/.." && pwd)/build/containers.conf}"
mkdir -p "$(dirname "$conf")"
[ -f "$conf" ] || printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=32768:32768"]\n[engine]\nruntime = "runc"\n' \
  "$(ulimit -Hn)" "$(ulimit -Hn)" > "$conf"
export CONTAINERS_CONF="$conf"
exec podman "$@"
