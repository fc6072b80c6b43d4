# Sourced by scripts/build-image.sh and scripts/container.sh: points podman and buildah at a
# containers.conf with the settings this project's CI machines need (runc, and ulimits within
# the machine's hard limits; image-feasibility.md section 2). Writes it once, under build/.
CONTAINERS_CONF="${CONTAINERS_CONF:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/containers.conf}"
if [ ! -f "$CONTAINERS_CONF" ]; then
  mkdir -p "$(dirname "$CONTAINERS_CONF")"
  printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=32768:32768"]\n[engine]\nruntime = "runc"\n' \
    "$(ulimit -Hn)" "$(ulimit -Hn)" > "$CONTAINERS_CONF"
fi
export CONTAINERS_CONF
