# shellcheck shell=bash
# Sourced by scripts/build-image.sh, scripts/container.sh, scripts/setup-host.sh and make cluster:
# points podman and buildah at a containers.conf with the settings this project's CI machines
# need (runc, and ulimits within the machine's hard limits) and
# the network backend setup installs (CNI; the local cluster needs no DNS plugin), and an events
# log that is not rotated within a run: podman 4.3 rotates it at 1 MB by default, after which an
# events stream replays the events the log kept (containers/podman#17665, fixed in podman 4.5),
# which failed an SDK job (tests/cluster/test_sdk_local.py); a make test adds about 1 MB to it
# (/run/libpod/events/events.log, 2026-12-06). Written under build/ on every use, so a changed
# setting reaches machines that had an older file.
CONTAINERS_CONF="${CONTAINERS_CONF:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/build/containers.conf}"
mkdir -p "$(dirname "$CONTAINERS_CONF")"
printf '[containers]\ndefault_ulimits = ["nofile=%s:%s", "nproc=32768:32768"]\n[engine]\nruntime = "runc"\nevents_logfile_max_size = "1g"\n[network]\nnetwork_backend = "cni"\n' \
  "$(ulimit -Hn)" "$(ulimit -Hn)" > "$CONTAINERS_CONF.$$"
mv -f "$CONTAINERS_CONF.$$" "$CONTAINERS_CONF"
export CONTAINERS_CONF
