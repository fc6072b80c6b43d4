#!/usr/bin/env bash
# GPU flavor, builder stage only: assembles a CUDA 12 compiler toolkit at $CUDA_HOME
# (/usr/local/cuda) in NVIDIA's standard layout, from what this project's build machines reach
# (Debian's mirror and PyPI; not NVIDIA's registry or apt repository). The runtime stage never
# sees it: the frameworks load CUDA from their own nvidia-*-cu12 wheels.
#
#   bin/ nvcc, ptxas, fatbinary, nvlink, cudafe++, bin2c, cuobjdump, nvprune, crt/*.stub;
#   nvvm/bin/cicc, nvvm/libdevice   from Debian trixie non-free's nvidia-cuda-toolkit .deb
#                                   ($CUDA_TOOLKIT_DEB_VERSION, sha256-checked), unpacked, not
#                                   installed: its package dependencies are trixie's, its binaries
#                                   need only glibc >= 2.34 (bookworm has 2.36);
#   include/                        nvidia-cuda-runtime-cu12, -nvcc-cu12 (crt/) and -cccl-cu12
#                                   (thrust, cub, libcu++) wheels of the same CUDA 12.4;
#   lib64/libcudart.so*             the 12.4 runtime wheel;
#   lib64/libcudart_static.a        from the $CUDA_RUNTIME_CU12_VERSION runtime wheel (12.4's has
#                                   none); nvcc links it into CMake's compiler check, nothing of it
#                                   reaches Horovod's libraries (they link libcudart.so.12);
#   lib64/libcudadevrt.a            an empty archive: only for that check (nvlink 12.4 refuses
#                                   12.9's copy as "newer than toolkit"; no relocatable device code
#                                   is linked).
#
# nvcc 12.4 compiles for sm_70..sm_90 (HOROVOD_CUDA_CC_LIST) and accepts bookworm's g++ 12. Ends
# by compiling a kernel for the first and last architecture of that list and checking the result
# with cuobjdump. Recipe verified on this project's machines: ../shared/reference/gpu-flavor.md.
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"
CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
mirror="$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
mirror="${DEBIAN_MIRROR:-${mirror:-http://deb.debian.org/debian}}"
apt_install curl ca-certificates
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

deb="nvidia-cuda-toolkit_${CUDA_TOOLKIT_DEB_VERSION}_amd64.deb"
url="$mirror/pool/non-free/n/nvidia-cuda-toolkit/$deb"
log "nvcc from $url"
curl -fsSL -o "$work/toolkit.deb" "$url" \
  || die "cannot download $url; Debian replaces superseded versions in its pool: set CUDA_TOOLKIT_DEB_VERSION and CUDA_TOOLKIT_DEB_SHA256 in versions.env to trixie's current nvidia-cuda-toolkit (docs/versions.md)"
echo "$CUDA_TOOLKIT_DEB_SHA256  $work/toolkit.deb" | sha256sum -c --quiet - \
  || die "$deb does not match CUDA_TOOLKIT_DEB_SHA256"
dpkg-deb -x "$work/toolkit.deb" "$work/deb"

log "headers and libcudart from NVIDIA's CUDA $CUDA_BUILD_RUNTIME_CU12_VERSION wheels"
pip_install --no-deps --target "$work/wheels" "nvidia-cuda-runtime-cu12==$CUDA_BUILD_RUNTIME_CU12_VERSION" \
  "nvidia-cuda-nvcc-cu12==$CUDA_BUILD_NVCC_CU12_VERSION" "nvidia-cuda-cccl-cu12==$CUDA_BUILD_CCCL_CU12_VERSION"
pip_install --no-deps --target "$work/static" "nvidia-cuda-runtime-cu12==$CUDA_RUNTIME_CU12_VERSION"

tk="$work/deb/usr/lib/nvidia-cuda-toolkit"
mkdir -p "$CUDA_HOME"/{bin,nvvm/bin,nvvm/libdevice,include,lib64}
for tool in ptxas fatbinary nvlink cudafe++ bin2c cuobjdump nvprune; do
  install -m 0755 "$work/deb/usr/bin/$tool" "$CUDA_HOME/bin/"
done
install -m 0755 "$tk/bin/nvcc" "$CUDA_HOME/bin/nvcc"
cp -a "$tk/bin/crt" "$CUDA_HOME/bin/"
install -m 0755 "$tk/bin/cicc" "$CUDA_HOME/nvvm/bin/"
cp "$tk/libdevice/"* "$CUDA_HOME/nvvm/libdevice/"
# NVIDIA's standard profile: nvcc finds cicc, libdevice, headers and libraries relative to itself.
cat > "$CUDA_HOME/bin/nvcc.profile" <<'PROFILE'
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
PROFILE
cp -a "$work/wheels/nvidia/cuda_runtime/include/." "$work/wheels/nvidia/cuda_nvcc/include/." \
  "$work/wheels/nvidia/cuda_cccl/include/." "$CUDA_HOME/include/"
cp -a "$work/wheels/nvidia/cuda_runtime/lib/libcudart.so.12" "$CUDA_HOME/lib64/"
ln -sf libcudart.so.12 "$CUDA_HOME/lib64/libcudart.so"
cp "$work/static/nvidia/cuda_runtime/lib/libcudart_static.a" "$CUDA_HOME/lib64/"
ar rc "$CUDA_HOME/lib64/libcudadevrt.a"

version="$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')"
[ "${version%%.*}" = "$CUDA_MAJOR" ] || die "nvcc reports CUDA '$version', versions.env pins CUDA_MAJOR=$CUDA_MAJOR"
first="${HOROVOD_CUDA_CC_LIST%%,*}" last="${HOROVOD_CUDA_CC_LIST##*,}"
printf '__global__ void k(float *x) { x[threadIdx.x] *= 2.f; }\nint main() { return 0; }\n' > "$work/k.cu"
"$CUDA_HOME/bin/nvcc" -o "$work/k" "$work/k.cu" \
  -gencode "arch=compute_$first,code=sm_$first" -gencode "arch=compute_$last,code=sm_$last" \
  || die "nvcc $version cannot compile for sm_$first and sm_$last"
listed="$("$CUDA_HOME/bin/cuobjdump" --list-elf "$work/k")"
for cc in "$first" "$last"; do grep -q "sm_$cc" <<<"$listed" || die "cuobjdump lists no sm_$cc code: $listed"; done
log "CUDA $version compiler ready at $CUDA_HOME (checked: sm_$first and sm_$last)"
