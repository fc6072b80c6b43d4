#!/usr/bin/env bash
# Installs OpenMPI $OPENMPI_VERSION (4.1.x) and an `mpirun` wrapper.
#
# Why 4.1.x: sagemaker-training's MPI runner waits for ORTE's `orted` and passes ORTE-era MCA
# flags; OpenMPI 5 has neither (image-build.md pitfall 9).
# Where it comes from (OPENMPI_FROM):
#   deb     Debian bookworm's package (4.1.4), the CPU flavor and the host setup;
#   source  the release tarball, built with CUDA support into /opt/openmpi, for the GPU flavor,
#           whose Ubuntu base ships another 4.1.x (the DLC images build it the same way);
#   prebuilt  /opt/openmpi already copied from the image's builder stage (GPU runtime stage).
# OPENMPI_DEV=0 installs only what runs jobs (no headers, no mpicc, hence no compiler).
# The wrapper at $BIN_DIR/mpirun adds --allow-run-as-root (containers run as root, as in AWS's
# DLC images) and defaults binding/mapping to none/slot (the DLC's openmpi-mca-params.conf);
# a caller's own OMPI_MCA_* values win.
#
# Env: BIN_DIR (default /usr/local/bin), OPENMPI_FROM (deb), OPENMPI_DEV (1), SKIP_APT=1 to
# only (re)write the wrapper.
source "$(dirname "$0")/lib.sh"
BIN_DIR="${BIN_DIR:-/usr/local/bin}"
OPENMPI_FROM="${OPENMPI_FROM:-deb}"

if [ "${SKIP_APT:-0}" = 1 ]; then
  :
elif [ "$OPENMPI_FROM" = deb ]; then
  log "installing OpenMPI $OPENMPI_DEB_VERSION from Debian"
  pkgs=("openmpi-bin=$OPENMPI_DEB_VERSION" "libopenmpi3=$OPENMPI_DEB_VERSION")
  [ "${OPENMPI_DEV:-1}" = 1 ] && pkgs+=("libopenmpi-dev=$OPENMPI_DEB_VERSION")
  apt_install "${pkgs[@]}"
elif [ "$OPENMPI_FROM" = source ]; then
  log "building OpenMPI $OPENMPI_VERSION from source with CUDA support"
  apt_install curl ca-certificates bzip2 make g++ libhwloc-dev libevent-dev
  work="$(mktemp -d)"
  series="${OPENMPI_VERSION%.*}"
  curl -fsSL -o "$work/ompi.tar.bz2" "https://download.open-mpi.org/release/open-mpi/v$series/openmpi-$OPENMPI_VERSION.tar.bz2"
  echo "$OPENMPI_SOURCE_SHA256  $work/ompi.tar.bz2" | sha256sum -c -
  tar -xjf "$work/ompi.tar.bz2" -C "$work"
  (cd "$work/openmpi-$OPENMPI_VERSION" \
    && ./configure --prefix=/opt/openmpi --enable-orterun-prefix-by-default --with-cuda="${CUDA_HOME:-/usr/local/cuda}" \
         --with-hwloc=/usr --with-libevent=/usr > "$work/configure.log" \
    && make -j"$(nproc)" install > "$work/make.log")
  rm -rf "$work"
  for tool in mpirun orterun orted ompi_info mpicc mpicxx; do ln -sf "/opt/openmpi/bin/$tool" "/usr/bin/$tool"; done
  echo /opt/openmpi/lib > /etc/ld.so.conf.d/openmpi.conf && ldconfig
elif [ "$OPENMPI_FROM" = prebuilt ]; then   # /opt/openmpi copied from the builder stage
  for tool in mpirun orterun orted ompi_info; do ln -sf "/opt/openmpi/bin/$tool" "/usr/bin/$tool"; done
  echo /opt/openmpi/lib > /etc/ld.so.conf.d/openmpi.conf && ldconfig
else
  die "OPENMPI_FROM must be deb, source or prebuilt, got '$OPENMPI_FROM'"
fi

real_mpirun="$(readlink -f /usr/bin/mpirun)"
[ -x "$real_mpirun" ] || die "no OpenMPI mpirun at /usr/bin/mpirun"
mkdir -p "$BIN_DIR"
cat > "$BIN_DIR/mpirun" <<WRAPPER
#!/bin/sh
# mpirun wrapper written by docker/install-openmpi.sh: runs as root, binding none, mapping by slot.
: "\${OMPI_MCA_hwloc_base_binding_policy:=none}"
: "\${OMPI_MCA_rmaps_base_mapping_policy:=slot}"
export OMPI_MCA_hwloc_base_binding_policy OMPI_MCA_rmaps_base_mapping_policy
exec $real_mpirun --allow-run-as-root "\$@"
WRAPPER
chmod 0755 "$BIN_DIR/mpirun"

found="$(ompi_info --parsable | sed -n "s/^ompi:version:full://p")"
[ "$found" = "$OPENMPI_VERSION" ] || die "ompi_info reports OpenMPI '$found', versions.env pins $OPENMPI_VERSION"
command -v orted >/dev/null || die "orted not on PATH; sagemaker-training's MPI workers wait for it"
log "OpenMPI $found ready; wrapper at $BIN_DIR/mpirun -> $real_mpirun"
