#!/usr/bin/env bash
# Installs OpenMPI $OPENMPI_VERSION (4.1.x) and an `mpirun` wrapper.
#
# Why 4.1.x: sagemaker-training's MPI runner waits for ORTE's `orted` and passes ORTE-era MCA flags;
# OpenMPI 5 has neither (image-build.md pitfall 9). Debian bookworm's package (4.1.4), for both
# flavors and the host setup. It is not CUDA-aware, and needs not be: with
# HOROVOD_GPU_OPERATIONS=NCCL every collective on GPU tensors goes through NCCL, MPI carries only
# Horovod's control messages and CPU tensors (docs/versions.md).
# OPENMPI_DEV=0 installs only what runs jobs (no headers, no mpicc, hence no compiler).
# The wrapper at $BIN_DIR/mpirun adds --allow-run-as-root (containers run as root, as in AWS's
# DLC images) and defaults binding/mapping to none/slot (the DLC's openmpi-mca-params.conf);
# a caller's own OMPI_MCA_* values win. On a host with no GPU (no /dev/nvidia<N> in the container)
# it sets OMPI_MCA_mpi_yield_when_idle=1, as train's launch plan does with -mca for its own mpirun
# (dtc_entrypoint/launch_mpi.py): every other mpirun, SageMaker SDK v3's MPI() driver's and a user's
# own, gets ranks that yield their core while they wait in MPI instead of spinning on it (OpenMPI
# yields by default only with more ranks than slots; docs/performance.md); mpirun passes the
# variable to every rank, on every host. A caller's variable or `-mca mpi_yield_when_idle` wins.
# It replaces a network interface named on its command line
# that the container lacks (SDK v3's MPI driver: ethwe) with one it has, with a warning. And it
# gives the SageMaker SDK's MPI() driver the ranks it asked for: that driver (sagemaker-train,
# container_drivers/distributed_drivers/mpi_utils.py, get_mpirun_command; the SDK v2 ModelTrainer's
# copy too) passes `--host h1:N,h2:N,... -np N -mca plm_rsh_num_concurrent <hosts>`, its processes
# per host as mpirun's global -np, so a job on several hosts would get one host's worth of ranks,
# all on the first host. On exactly that command line (every host N slots, -np N, the driver's
# plm_rsh_num_concurrent equal to the host count, more than one host) -np becomes N x hosts, with
# a warning naming the SDK's bug; any other command line keeps its -np.
#
# Env: BIN_DIR (default /usr/local/bin), OPENMPI_DEV (1), SKIP_APT=1 to only (re)write the wrapper.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
BIN_DIR="${BIN_DIR:-/usr/local/bin}"

if [ "${SKIP_APT:-0}" != 1 ]; then
  log "installing OpenMPI $OPENMPI_DEB_VERSION from Debian"
  pkgs=("openmpi-bin=$OPENMPI_DEB_VERSION" "libopenmpi3=$OPENMPI_DEB_VERSION")
  [ "${OPENMPI_DEV:-1}" = 1 ] && pkgs+=("libopenmpi-dev=$OPENMPI_DEB_VERSION")
  apt_install "${pkgs[@]}"
fi

real_mpirun="$(readlink -f /usr/bin/mpirun)"
[ -x "$real_mpirun" ] || die "no OpenMPI mpirun at /usr/bin/mpirun"
mkdir -p "$BIN_DIR"
cat > "$BIN_DIR/mpirun" <<'WRAPPER'
#!/bin/sh
# mpirun wrapper written by docker/install-openmpi.sh: runs as root, binding none, mapping by slot,
# ranks that yield while they wait on a host with no GPU, and replaces a network interface that
# this container does not have, named in
# `-mca btl_tcp_if_include|oob_tcp_if_include NAME` or `-x NCCL_SOCKET_IFNAME=NAME` (SageMaker SDK
# v3's MPI driver names `ethwe`, which only SageMaker's own hosts have), with one it has: eth0,
# else the first interface that is up (what train's launchers do: dtc_entrypoint.fabric); and
# turns the SageMaker SDK MPI() driver's `-np <processes per host>` into every host's processes
# (docker/install-openmpi.sh says when).
: "${OMPI_MCA_hwloc_base_binding_policy:=none}"
: "${OMPI_MCA_rmaps_base_mapping_policy:=slot}"
export OMPI_MCA_hwloc_base_binding_policy OMPI_MCA_rmaps_base_mapping_policy
# no GPU here: ranks waiting in MPI yield their core (docker/install-openmpi.sh says why)
if ! ls /dev/nvidia[0-9]* > /dev/null 2>&1; then
  : "${OMPI_MCA_mpi_yield_when_idle:=1}"
  export OMPI_MCA_mpi_yield_when_idle
fi

# NAME[,NAME...] when one of them exists here (or the value is not a list of plain names:
# subnets, NCCL's ^ and = forms), else the fallback interface.
existing_interface() {
  case "$1" in *[!A-Za-z0-9_.,-]*|"") printf '%s' "$1"; return ;; esac
  for name in $(printf '%s' "$1" | tr ',' ' '); do
    if [ -e "/sys/class/net/$name" ]; then printf '%s' "$1"; return; fi
  done
  fallback=""
  if [ -e /sys/class/net/eth0 ]; then fallback=eth0; else
    for dir in /sys/class/net/*; do
      name="${dir##*/}"
      if [ "$name" != lo ] && [ "$(cat "$dir/operstate" 2>/dev/null)" = up ]; then fallback="$name"; break; fi
    done
  fi
  if [ -z "$fallback" ]; then printf '%s' "$1"; return; fi
  echo "mpirun: network interface '$1' does not exist in this container; using '$fallback' instead" >&2
  printf '%s' "$fallback"
}

# The SDK MPI() driver's command line: --host h1:N,...,hK:N (K > 1), -np N and
# `-mca plm_rsh_num_concurrent K`; sets np_total to N x K then, else leaves it empty.
np_total="" hosts="" np="" concurrent="" before="" previous=""
for arg do
  case "$previous" in --host|-host|-H) hosts="$arg" ;; -np|--np|-n) np="$arg" ;; esac
  case "$before:$previous" in -mca:plm_rsh_num_concurrent|--mca:plm_rsh_num_concurrent) concurrent="$arg" ;; esac
  before="$previous" previous="$arg"
done
case "$np:$concurrent" in *[!0-9:]*|:*|*:) ;; *)
  count=0 same=1
  for entry in $(printf '%s' "$hosts" | tr ',' ' '); do
    count=$((count + 1))
    case "$entry" in *:*) slots="${entry##*:}" ;; *) slots=1 ;; esac
    [ "$slots" = "$np" ] || same=""
  done
  if [ "$count" -gt 1 ] && [ "$count" = "$concurrent" ] && [ -n "$same" ]; then
    np_total=$((np * count))
    echo "mpirun: -np $np with --host $hosts is the SageMaker SDK MPI() driver passing its processes per host as the global process count (sagemaker-train mpi_utils.get_mpirun_command); running $np_total processes, $np on each of the $count hosts" >&2
  fi ;;
esac

previous="" rewrite=""
for arg do
  shift
  if [ -n "$rewrite" ]; then arg="$(existing_interface "$arg")"; rewrite=""; fi
  case "$previous" in -np|--np|-n) if [ -n "$np_total" ]; then arg="$np_total"; fi ;; esac
  case "$previous:$arg" in
    -mca:btl_tcp_if_include|-mca:oob_tcp_if_include|--mca:btl_tcp_if_include|--mca:oob_tcp_if_include) rewrite=1 ;;
    -x:NCCL_SOCKET_IFNAME=*) arg="NCCL_SOCKET_IFNAME=$(existing_interface "${arg#*=}")" ;;
  esac
  previous="$arg"
  set -- "$@" "$arg"
done
WRAPPER
printf 'exec %s --allow-run-as-root "$@"\n' "$real_mpirun" >> "$BIN_DIR/mpirun"
chmod 0755 "$BIN_DIR/mpirun"

found="$(ompi_info --parsable | sed -n "s/^ompi:version:full://p")"
[ "$found" = "$OPENMPI_VERSION" ] || die "ompi_info reports OpenMPI '$found', versions.env pins $OPENMPI_VERSION"
command -v orted >/dev/null || die "orted not on PATH; sagemaker-training's MPI workers wait for it"
log "OpenMPI $found ready; wrapper at $BIN_DIR/mpirun -> $real_mpirun"
