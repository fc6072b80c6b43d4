#!/usr/bin/env bash
# Installs the OpenSSH client (mpirun's launcher for remote hosts) and, with SSHD=1, the server
# that multi-host MPI reaches on port 22. The server's configuration for the image (host keys,
# key-only root login) is the image's job and lives with the Dockerfile.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
pkgs=(openssh-client)
[ "${SSHD:-0}" = 1 ] && pkgs+=(openssh-server)
log "installing ${pkgs[*]}"
apt_install "${pkgs[@]}"
