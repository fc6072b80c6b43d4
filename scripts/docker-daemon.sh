#!/usr/bin/env bash
# Debian's Docker engine (docker.io 20.10, installed by scripts/setup-host.sh) on this project's
# own socket and data root, beside podman: nothing that looks for Docker's default socket
# (/var/run/docker.sock) finds it, so `make image`, `make train` and `make cluster` keep using
# buildah and podman unless DOCKER_HOST names this socket. It manages no firewall rules
# (--iptables=false) and makes no default bridge, so podman's CNI networks and their rules are
# untouched; builds use the host's network (scripts/build-image.sh passes --network host) and
# compose projects their own internal networks. Debian's CLI, /usr/bin/docker, builds with
# BuildKit itself; a newer CLI without the buildx plugin cannot (docs/image.md, Docker).
#
# Usage: scripts/docker-daemon.sh start   (idempotent; waits for the API, up to 60 s)
#        scripts/docker-daemon.sh stop
#        scripts/docker-daemon.sh env     (prints DOCKER_HOST=... DOCKER=... for `export`)
# Env: DTC_DOCKER_SOCKET (default /run/dtc-docker/docker.sock), DTC_DOCKER_DATA_ROOT (default
# /var/lib/dtc-docker). The daemon's log: /run/dtc-docker/dockerd.log.
set -euo pipefail
SOCKET="${DTC_DOCKER_SOCKET:-/run/dtc-docker/docker.sock}"
DATA_ROOT="${DTC_DOCKER_DATA_ROOT:-/var/lib/dtc-docker}"
RUN_DIR="$(dirname "$SOCKET")"
CLI=/usr/bin/docker
log() { printf '[docker-daemon] %s\n' "$*" >&2; }

answers() { DOCKER_HOST="unix://$SOCKET" "$CLI" info >/dev/null 2>&1; }

case "${1:-}" in
  start)
    if [ ! -x /usr/sbin/dockerd ] || [ ! -x "$CLI" ]; then
      log "error: docker.io is not installed (make setup installs it)"; exit 1
    fi
    if answers; then exit 0; fi
    mkdir -p "$RUN_DIR" "$DATA_ROOT"
    nohup /usr/sbin/dockerd --host "unix://$SOCKET" --data-root "$DATA_ROOT" --exec-root "$RUN_DIR/exec" \
      --pidfile "$RUN_DIR/dockerd.pid" --iptables=false --ip-masq=false --bridge=none \
      > "$RUN_DIR/dockerd.log" 2>&1 < /dev/null &
    for _ in $(seq 120); do
      if answers; then log "Docker engine up on unix://$SOCKET (data root $DATA_ROOT)"; exit 0; fi
      sleep 0.5
    done
    log "error: dockerd did not answer within 60 s; its log ($RUN_DIR/dockerd.log) ends:"
    tail -n 20 "$RUN_DIR/dockerd.log" >&2 || true
    exit 1
    ;;
  stop)
    if [ -s "$RUN_DIR/dockerd.pid" ]; then kill "$(cat "$RUN_DIR/dockerd.pid")" 2>/dev/null || true; fi
    ;;
  env)
    printf 'DOCKER_HOST=unix://%s DOCKER=%s\n' "$SOCKET" "$CLI"
    ;;
  *)
    log "usage: scripts/docker-daemon.sh start|stop|env"; exit 2
    ;;
esac
