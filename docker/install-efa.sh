#!/usr/bin/env bash
# GPU flavor, INSTALL_EFA=true: AWS's EFA installer ($EFA_INSTALLER_VERSION), which brings the
# aws-ofi-nccl plugin NCCL needs to use EFA on p4d/p5 instances (and AWS's own libfabric build).
# Neither Debian nor PyPI has the plugin; Debian's libfabric with its EFA provider is in the GPU
# image without this. Needs efa-installer.amazonaws.com (this project's build machines cannot
# reach it). Kernel modules and limits are the host's business (--skip-kmod --skip-limit-conf).
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
[ "${INSTALL_EFA:-false}" = true ] || { log "EFA not requested (INSTALL_EFA=${INSTALL_EFA:-false})"; exit 0; }
[ "$FLAVOR" = gpu ] || die "INSTALL_EFA=true needs FLAVOR=gpu"
apt_install curl ca-certificates
work="$(mktemp -d)"
curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-$EFA_INSTALLER_VERSION.tar.gz" | tar -xz -C "$work"
(cd "$work/aws-efa-installer" && ./efa_installer.sh -y -g -d --skip-kmod --skip-limit-conf --no-verify)
rm -rf "$work" /var/lib/apt/lists/*
