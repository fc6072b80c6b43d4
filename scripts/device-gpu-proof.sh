#!/usr/bin/env bash
# The GPU proof on a lent GPU machine that cannot run our image: what can be proved there, with the
# image's own Horovod sources, patches and trainers (docs/performance.md, "GPU proof").
#
# The lent machine (the workplace's `device` tool) has python3 with PyPI's torch (CUDA build), nvcc,
# cmake and ninja, but no TensorFlow, no MPI launcher, no network, and takes 64 MiB of files per call.
# So this script:
#   prepare              (here, with network) downloads the horovod sdist and applies our patches
#                        (docker/patches/*.patch and docker/patches/gpu/*.patch, as docker/build-horovod.sh
#                        does), downloads the DALI wheel of versions.env, writes the digits and photos job
#                        trees (dtc_local.job_tree), and splits it all into parts of at most 60 MiB:
#                        .gpuproof-1/, .gpuproof-2/, ... (git ignores them; carry one per device call).
#   stage                (there, once per part) moves the carried parts to $WORK.
#   build                (there) starts the Horovod builds in the background (setsid): PyTorch with NCCL
#                        operations (HOROVOD_GPU_OPERATIONS=NCCL, linked against the NCCL that torch
#                        loads) and Gloo, one per entry of HOROVOD_ARCHS (default: the GPU's compute
#                        capability). No TensorFlow there; no MPI.
#   run                  (there) waits for the builds, installs Horovod and DALI into $WORK/site, and runs
#                        0. PROOF_STEPS: the preflight's modules with each Horovod build
#                           (bench/gpu/preflight_proof.py) and a stalled NCCL collective's Flight Recorder
#                           dump (tests/gpu/in_image/test_flight_recorder.py); with gpu-check in PROOF_STEPS, the
#                           image's gpu-check command (dtc_entrypoint.preflight.gpu_check: the full probe and its
#                           ResNet-50 throughput check), its report and preflight.json in $OUT;
#                        1. Horovod's build flags and an allreduce on the GPU (exact values);
#                        2. the built-in PyTorch trainers on the GPU: one process with no distribution,
#                           Horovod (one rank, as Horovod runs without a launcher) and DDP (torchrun, one
#                           process), each with `precision` on, on the digits and on the photos with
#                           ResNet-50 at 224 px;
#                        3. the GPU suite's B1 (ResNet-50), B2 (DALI against a DataLoader), B3 (Horovod's
#                           overhead), B5 (ResNet-50 through the built-in trainers against a bare loop) and
#                           B6 (the trainer with torch.compile): bench/gpu/suite.py --parts $SUITE_PARTS.
#                        and writes $OUT/gpu-proof.jsonl (one result per step, as it goes), the suite's
#                        $OUT/gpu-results.json and gpu-suite.log, and $OUT/gpu-proof-logs.tar.gz (every log).
# One GPU allows one rank per framework: NCCL refuses two ranks on one GPU, so multi-rank collectives
# and B4 (busbw over several GPUs) are not proved there.
#
# Env: WORK (default /tmp/gpuproof), PYTHON (default python3), CUDA_ARCH (default: the GPU's, e.g. 90),
# QUICK=1 (run: one epoch per job, the suite's --quick; to rehearse `run` on a CPU machine);
# PROOF_STEPS (run: preflight,flight-recorder by default: bench/gpu/preflight_proof.py with each Horovod build,
# PREFLIGHT_TIMEOUT_S; tests/gpu/in_image/test_flight_recorder.py, FR_TIMEOUT_S; gpu-check: GPU_CHECK_TIMEOUT_S,
# IMAGE_CUDA, default 12.8), HOROVOD_ARCHS (build: one Horovod build per entry, e.g. "90 80": the GPU's and one
# without it, or "75,80,86,89,90": one build for that list; default the GPU's);
# SUITE_PARTS (run: default B1,B2,B3,B5; 0: no suite), SUITE_TIMEOUT_S (run: the suite's limit, default 480), B5_TRAINERS (run: default single,horovod,ddp), TRAINER_JOBS (run: whose
# trainer jobs run, default single,horovod,ddp; 0: none, the suite only); HOROVOD=0 (build and run: no
# Horovod build, check or trainer: the defaults of TRAINER_JOBS and B5_TRAINERS drop horovod, and
# SUITE_PARTS's drops B3, Horovod's overhead; saves the build's 2 minutes when device time is short);
# prepare: HOST_PYTHON (default .venv/bin/python), DALI_ARCHIVE (a dali.tar.zst made before, to skip
# the 10-minute compression). prepare needs Debian's zstd and unzip, which `make setup` does not
# install: no test runs this script (it needs a lent GPU machine).
set -uo pipefail
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${WORK:-/tmp/gpuproof}"
PYTHON="${PYTHON:-python3}"
PART_MB=60     # per device call: 64 MiB with the working tree (2.5 MiB in 2026-11)
CHUNK_MB=59    # DALI's 204 MiB in 4 calls: the base, its requirements and the last chunk go first

log() { echo "[gpu-proof] $*" >&2; }
die() { log "error: $*"; exit 1; }

prepare() {
  local prefix="$REPO_DIR/.gpuproof" host_python="${HOST_PYTHON:-$REPO_DIR/.venv/bin/python}"
  # shellcheck source=/dev/null
  set -a && source "$REPO_DIR/versions.env" && set +a
  local tmp; tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' RETURN
  version_of() { "$host_python" -c 'import importlib.metadata, sys; print(importlib.metadata.version(sys.argv[1]))' "$1"; }
  log "downloading the horovod $HOROVOD_VERSION sdist and nvidia-dali-$DALI_CUDA_SUFFIX $DALI_VERSION"
  "$host_python" -m pip download -q --no-deps --no-binary=:all: -d "$tmp" "horovod==$HOROVOD_VERSION" \
    || die "sdist download"
  "$host_python" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --python-version 3.12 -d "$tmp" "nvidia-dali-$DALI_CUDA_SUFFIX==$DALI_VERSION" || die "DALI download"
  # Horovod's setup_requires (cffi) for the build there, which cannot reach PyPI
  "$host_python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform any -d "$tmp/stage/build-wheels" "cffi==$CFFI_VERSION" \
    "pycparser==$(version_of pycparser)" \
    || die "cffi download"
  mkdir -p "$tmp/stage/src" "$tmp/stage/trees"
  tar -xzf "$tmp/horovod-$HOROVOD_VERSION.tar.gz" -C "$tmp/stage/src"
  for p in "$REPO_DIR"/docker/patches/*.patch "$REPO_DIR"/docker/patches/gpu/*.patch; do
    log "applying $(basename "$p")"
    patch -d "$tmp/stage/src/horovod-$HOROVOD_VERSION" -p1 --forward --quiet < "$p" || die "patch $p"
  done
  for data in digits photos; do
    "$host_python" -m dtc_local.job_tree "$tmp/stage/trees/$data" "--$data" --program builtin:pytorch >/dev/null
  done
  tar -C "$tmp/stage" -czf "$tmp/base.tar.gz" src trees build-wheels
  # DALI for the machine's Python only (3.12), recompressed: zstd -19 takes the wheel from 424 to 214 MB.
  mkdir -p "$tmp/dali" && (cd "$tmp/dali" && unzip -q "$tmp"/nvidia_dali_*.whl \
    && find . -name '*cpython-3*' ! -name '*cpython-312-*' -delete)
  if [ -n "${DALI_ARCHIVE:-}" ]; then cp "$DALI_ARCHIVE" "$tmp/dali.tar.zst"   # one made before
  else
    log "compressing DALI (zstd -19; about 10 minutes on 2 cores)"
    tar -C "$tmp/dali" -cf - . | zstd -q -T0 -19 --long=27 -o "$tmp/dali.tar.zst"
  fi
  # DALI's requirements that the machine lacks, at the versions the host setup installed from our pins;
  # JPEG decoding needs nvImageCodec and nvJPEG (the other codecs' wheels are left out)
  local deps=() name
  for name in astunparse gast makefun libcst nvtx optree nvidia-nvimgcodec-cu12 nvidia-nvjpeg-cu12; do
    deps+=("$name==$(version_of "$name")")
  done
  "$host_python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any -d "$tmp/wheels" "${deps[@]}" \
    || die "download of ${deps[*]}"
  mkdir -p "$tmp/deps" && for wheel in "$tmp"/wheels/*.whl; do unzip -q -o "$wheel" -d "$tmp/deps"; done
  find "$tmp/deps" -name '*cpython-3*' ! -name '*cpython-312*' -delete
  rm -f "$tmp/deps/nvidia/__init__.py"   # a namespace package, as torch's nvidia/ is: both must be found
  tar -C "$tmp/deps" -cf - . | zstd -q -T0 -15 --long=27 -o "$tmp/dali-deps.tar.zst"
  split -b "${CHUNK_MB}M" -d -a 1 "$tmp/dali.tar.zst" "$tmp/dali.tar.zst."
  split -b "${CHUNK_MB}M" -d -a 1 "$tmp/dali-deps.tar.zst" "$tmp/dali-deps.tar.zst."
  # parts of at most PART_MB: the base (Horovod's source, the job trees) first, so the build can start
  # while DALI's chunks travel; each part is filled smallest chunk first
  local i=1 used=0 file size
  rm -rf "$prefix"-[0-9]* && mkdir -p "$prefix-1"
  for file in "$tmp/base.tar.gz" $(ls -Sr "$tmp"/dali.tar.zst.[0-9] "$tmp"/dali-deps.tar.zst.[0-9]); do
    size=$(( $(stat -c %s "$file") / 1048576 + 1 ))
    if [ $((used + size)) -gt "$PART_MB" ]; then i=$((i + 1)) used=0 && mkdir -p "$prefix-$i"; fi
    mv "$file" "$prefix-$i/" && used=$((used + size))
  done
  log "wrote $i parts: $prefix-1 .. $prefix-$i (carry one per device call, then: stage; build after the first)"
}

stage() {
  mkdir -p "$WORK/parts"
  local moved=0
  for part in "$REPO_DIR"/.gpuproof-*/*; do
    [ -e "$part" ] || continue
    cp "$part" "$WORK/parts/" && moved=$((moved + 1))
  done
  log "staged $moved part(s); $WORK/parts holds: $(find "$WORK/parts" -type f -printf '%f ')"
}

unpack() {   # Horovod's source and the job trees
  [ -d "$WORK/stage/src" ] && return 0
  mkdir -p "$WORK/stage"
  tar -C "$WORK/stage" -xzf "$WORK/parts/base.tar.gz" || die "no base.tar.gz staged"
}

build() {
  if [ "${HOROVOD:-1}" = 0 ]; then   # run: no Horovod check, jobs or B5 trainer
    mkdir -p "$WORK" && echo 'rc=skipped (HOROVOD=0)' > "$WORK/build.done" && log "Horovod not built (HOROVOD=0)"
    return 0
  fi
  unpack
  local src; src="$(ls -d "$WORK"/stage/src/horovod-*)"
  local nccl; nccl="$("$PYTHON" -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])')"
  # the linker wants the unversioned name; a private NCCL home leaves torch's package untouched
  mkdir -p "$WORK/nccl/lib" && ln -sfn "$nccl/include" "$WORK/nccl/include" \
    && ln -sf "$nccl/lib/libnccl.so.2" "$WORK/nccl/lib/libnccl.so.2" && ln -sf libnccl.so.2 "$WORK/nccl/lib/libnccl.so"
  local gpu_arch; gpu_arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d .)"
  local cuda_home; cuda_home="$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")"
  "$PYTHON" -m pip install -q --no-index --no-deps --target "$WORK/build-site" "$WORK"/stage/build-wheels/*.whl \
    || die "cffi for the build"
  # The machine's GCC 13 no longer includes <cstdint> and <string> through other headers (GCC 13's porting
  # notes), which Horovod 0.28.1's common/ sources rely on; forced here, for this compiler only. The image
  # builds with Debian bookworm's GCC 12 and needs no such flag.
  local cxxflags="-include cstdint -include string -include stdexcept"
  # HOROVOD_ARCHS: one build per entry, each its own copy of the source, side by side (the first is the one
  # the trainers and the suite use; a build without the GPU's arch is the preflight's refusal case)
  local archs jobs
  read -r -a archs <<< "${HOROVOD_ARCHS:-${CUDA_ARCH:-$gpu_arch}}"
  # a list's commas become dashes in the paths: the linker splits -Wl,-rpath,... at commas (seen: a build in
  # src-75,80,86,89,90 failed to link); Horovod gets the list with commas
  archs=("${archs[@]//,/-}")
  jobs=$(( $(nproc) / ${#archs[@]} ))
  echo "${archs[*]}" > "$WORK/build.archs"
  for arch in "${archs[@]}"; do
    cp -a "$src" "$WORK/src-$arch"
    log "building Horovod for sm_$arch from $src against torch $("$PYTHON" -c 'import torch; print(torch.__version__)'), NCCL at $nccl"
    # shellcheck disable=SC2016  # $ORIGIN is for the dynamic linker
    setsid env PYTHONPATH="$WORK/build-site" CXXFLAGS="$cxxflags" \
      HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1 \
      HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED HOROVOD_NCCL_HOME="$WORK/nccl" \
      HOROVOD_CUDA_HOME="$cuda_home" CUDA_HOME="$cuda_home" CUDACXX="$cuda_home/bin/nvcc" PATH="$cuda_home/bin:$PATH" \
      HOROVOD_BUILD_CUDA_CC_LIST="${arch//-/,}" \
      CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$jobs" \
      LDFLAGS='-Wl,-rpath,$ORIGIN/../../torch/lib:$ORIGIN/../../nvidia/nccl/lib' \
      bash -c "start=\$(date +%s); '$PYTHON' -m pip wheel -v --no-deps --no-build-isolation -w '$WORK/dist-$arch' \
        '$WORK/src-$arch' > '$WORK/build-$arch.log' 2>&1; echo \"rc=\$? seconds=\$(( \$(date +%s) - start ))\" \
        > '$WORK/build-$arch.done'" < /dev/null > /dev/null 2>&1 &
  done
  log "builds started in the background: $WORK/build-<arch>.log, build-<arch>.done when each ends"
}

zstd_cat() {   # FILE: its decompressed bytes; pyarrow's zstd codec where the zstd program is missing
  if command -v zstd >/dev/null; then zstd -dc "$1"
  else "$PYTHON" -c 'import shutil, sys, pyarrow
shutil.copyfileobj(pyarrow.input_stream(sys.argv[1], compression="zstd"), sys.stdout.buffer, 1 << 24)' "$1"
  fi
}

run() {
  # results.jsonl grows step by step in $OUT: a run stopped at its limit still returns what it did
  local out="${OUT:?OUT: where the results go}" logs="$WORK/logs" site="$WORK/site"
  local results="$out/gpu-proof.jsonl"
  mkdir -p "$logs" "$site" && : > "$results"
  unpack
  export PYTHONUNBUFFERED=1
  log "waiting for the Horovod builds"
  local archs=() horovod_jobs=horovod,
  if [ "${HOROVOD:-1}" = 0 ]; then horovod_jobs=""
  else
    read -r -a archs < "$WORK/build.archs"
    for arch in "${archs[@]}"; do
      for _ in $(seq 420); do [ -e "$WORK/build-$arch.done" ] && break; sleep 1; done
      cp "$WORK/build-$arch.log" "$logs/horovod-build-$arch.log" 2>/dev/null
      echo "{\"step\": \"horovod-build-$arch\", \"result\": \"$(cat "$WORK/build-$arch.done" 2>/dev/null || echo timeout)\"}" \
        >> "$results"
      # the first build goes with the trainers; each also alone under $WORK/horovod-<arch> for the preflight
      "$PYTHON" -m pip install -q --no-deps --no-compile --target "$WORK/horovod-$arch" "$WORK/dist-$arch"/horovod-*.whl \
        > "$logs/horovod-install-$arch.log" 2>&1 || log "horovod install for sm_$arch failed"
    done
    cp -a "$WORK/horovod-${archs[0]}"/. "$site"/
  fi
  if [ ! -d "$site/nvidia/dali" ]; then
    for archive in dali dali-deps; do
      cat "$WORK/parts/$archive.tar.zst".[0-9] > "$WORK/$archive.tar.zst"
      zstd_cat "$WORK/$archive.tar.zst" | tar -C "$site" -xf - || log "unpacking $archive failed"
      rm -f "$WORK/$archive.tar.zst"
    done
  fi
  export PYTHONPATH="$site:$REPO_DIR/train:$REPO_DIR/entrypoint:$REPO_DIR/bench"
  { nvidia-smi; "$PYTHON" -c 'import torch, sys; print(sys.version); print("torch", torch.__version__, torch.version.cuda)'
    nvcc --version; } > "$logs/machine.txt" 2>&1

  if [ -n "$horovod_jobs" ] && [[ ",${PROOF_STEPS:-preflight,flight-recorder}," == *,preflight,* ]]; then
    local builds=()
    for arch in "${archs[@]}"; do builds+=(--horovod "$arch=$WORK/horovod-$arch"); done
    log "preflight proof with Horovod built for ${archs[*]}"
    timeout "${PREFLIGHT_TIMEOUT_S:-600}" "$PYTHON" "$REPO_DIR/bench/gpu/preflight_proof.py" "${builds[@]}" \
      --out "$results" > "$logs/preflight-proof.log" 2>&1
    echo "{\"step\": \"preflight-proof\", \"rc\": $?}" >> "$results"
  fi
  if [[ ",${PROOF_STEPS:-preflight,flight-recorder}," == *,gpu-check,* ]]; then
    # the image's gpu-check command itself (its console script's module), outside the image (its report says
    # so): the image's CUDA version given as the image's ENV gives it (the driver check compares against it);
    # its full probe with every component this machine has (no TensorFlow) and its ResNet-50 bf16 throughput
    # check through the trainer
    log "gpu-check (the image's command, outside the image)"
    mkdir -p "$WORK/gpu-check"
    DTC_CUDA_VERSION="${IMAGE_CUDA:-12.8}" timeout "${GPU_CHECK_TIMEOUT_S:-300}" \
      "$PYTHON" -m dtc_entrypoint.preflight.gpu_check --out "$WORK/gpu-check" > "$logs/gpu-check.log" 2>&1
    echo "{\"step\": \"gpu-check\", \"rc\": $?}" >> "$results"
    cp "$WORK"/gpu-check/gpu-check-*.md "$out/" 2>/dev/null
    cp "$WORK/gpu-check/preflight.json" "$out/gpu-check-preflight.json" 2>/dev/null
  fi
  if [[ ",${PROOF_STEPS:-preflight,flight-recorder}," == *,flight-recorder,* ]]; then
    log "Flight Recorder dump of a stalled NCCL collective"
    mkdir -p "$WORK/fr" && cp "$REPO_DIR/tests/gpu/in_image/test_flight_recorder.py" "$WORK/fr/"
    (cd "$WORK/fr" && timeout "${FR_TIMEOUT_S:-150}" "$PYTHON" -m pytest -c /dev/null -v -s -p no:cacheprovider test_flight_recorder.py) \
      > "$logs/flight-recorder.log" 2>&1
    echo "{\"step\": \"flight-recorder\", \"rc\": $?}" >> "$results"
    cp "$logs/flight-recorder.log" "$out/" 2>/dev/null
  fi

  [ -z "$horovod_jobs" ] || "$PYTHON" - <<'EOF' > "$logs/horovod-check.log" 2>&1
import json, torch, horovod, horovod.torch as hvd
hvd.init()
torch.cuda.set_device(hvd.local_rank())
x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
total = hvd.allreduce(x, op=hvd.Sum, name="sum")
average = hvd.allreduce(x * 3, op=hvd.Average, name="average")
gathered = hvd.allgather(x[:4].clone(), name="gather")
record = {"step": "horovod-check", "horovod": horovod.__version__, "size": hvd.size(), "nccl_built": hvd.nccl_built(),
          "gloo_built": hvd.gloo_built(), "cuda_built": hvd.cuda_built(), "mpi_built": hvd.mpi_built(),
          "allreduce_sum_exact": bool(torch.equal(total, x * hvd.size())),
          "allreduce_average_exact": bool(torch.equal(average, x * 3)),
          "allgather_exact": bool(torch.equal(gathered, x[:4].repeat(hvd.size()))), "device": str(total.device)}
print(json.dumps(record))
EOF
  [ -z "$horovod_jobs" ] || tail -n1 "$logs/horovod-check.log" | grep '^{' >> "$results" \
    || echo '{"step": "horovod-check", "result": "failed"}' >> "$results"

  trainer_job() {   # name tree launcher-and-trainer args...
    local name="$1" tree="$2"; shift 2
    rm -rf "$WORK/jobs/$name" && mkdir -p "$WORK/jobs" && cp -a "$WORK/stage/trees/$tree" "$WORK/jobs/$name"
    local start; start=$(date +%s%N)
    SAGEMAKER_BASE_DIR="$WORK/jobs/$name" timeout 150 "$@" > "$logs/$name.log" 2>&1
    local rc=$? seconds; seconds="$(( ($(date +%s%N) - start) / 1000000000 ))"
    cp "$WORK/jobs/$name/output/data/report/summary.md" "$logs/$name-summary.md" 2>/dev/null
    "$PYTHON" - "$name" "$rc" "$seconds" "$logs/$name.log" "$WORK/jobs/$name" <<'EOF' >> "$results"
import json, os, re, sys
name, rc, seconds, log, job = sys.argv[1:]
text = open(log, errors="replace").read()
# the trainers' metric line (dtc_train.common.METRIC_LINE)
epochs = re.findall(r"epoch=(\d+)/\d+ .*?val_accuracy=([0-9.]+)", text)
rates = re.findall(r"epoch=\d+/\d+ .*?samples_per_second=([0-9.]+)", text)
print(json.dumps({"step": name, "rc": int(rc), "wall_s": round(float(seconds), 1),
                  "val_accuracy": [float(a) for _, a in epochs], "samples_per_second": [float(r) for r in rates],
                  "model_files": sorted(os.listdir(os.path.join(job, "model"))) if os.path.isdir(os.path.join(job, "model"))
                  else [],
                  "placement": [l for l in text.splitlines() if "rank 0/" in l or "one process on" in l][:1]}))
EOF
    log "$name: rc=$rc in ${seconds}s"
  }
  local torchrun=("$PYTHON" -m torch.distributed.run --standalone --nproc_per_node 1)
  # QUICK=1: one epoch each, photos at 32 px, the suite's --quick (a rehearsal of this script on a CPU)
  local digits_epochs=12 photos_epochs=8 image_size=224 quick=()
  [ -z "${QUICK:-}" ] || { digits_epochs=1 photos_epochs=1 image_size=32 quick=(--quick); }
  local digits=(--epochs "$digits_epochs")
  local photos=(--model resnet50 --image-size "$image_size" --batch-size 32 --learning-rate 0.02
                --epochs "$photos_epochs" --warmup-epochs 1 --lr-schedule cosine)
  local jobs=",${TRAINER_JOBS:-single,${horovod_jobs}ddp}," parts="${SUITE_PARTS:-B1,B2,${horovod_jobs:+B3,}B5}"
  wanted() { [[ "$jobs" == *",$1,"* ]]; }
  local single=("$PYTHON" -m dtc_train.pytorch_single) horovod=("$PYTHON" -m dtc_train.pytorch_horovod)
  local ddp=("${torchrun[@]}" -m dtc_train.pytorch_ddp)
  wanted single && trainer_job single-digits-fp16 digits "${single[@]}" "${digits[@]}" --precision fp16
  wanted horovod && trainer_job horovod-digits-bf16 digits "${horovod[@]}" "${digits[@]}" --precision bf16
  wanted ddp && trainer_job ddp-digits-fp16 digits "${ddp[@]}" "${digits[@]}" --precision fp16
  if [ "$parts" != 0 ]; then
    log "GPU suite $parts"
    # at most 8 files come back from $OUT: the suite's results and its log, B5's logs in the tarball
    timeout "${SUITE_TIMEOUT_S:-480}" "$PYTHON" "$REPO_DIR/bench/gpu/suite.py" --out "$WORK/bench" --parts "$parts" \
      --b5-trainers "${B5_TRAINERS:-single,${horovod_jobs}ddp}" "${quick[@]}" \
      > "$logs/gpu-suite.log" 2>&1
    echo "{\"step\": \"gpu-suite\", \"rc\": $?}" >> "$results"
    cp "$WORK/bench/gpu-results.json" "$logs/gpu-suite.log" "$out/" 2>/dev/null
    cp "$WORK"/bench/b5-*.log "$logs/" 2>/dev/null
  fi
  wanted single && trainer_job single-photos-resnet50-bf16 photos "${single[@]}" "${photos[@]}" --precision bf16
  wanted ddp && trainer_job ddp-photos-resnet50-bf16 photos "${ddp[@]}" "${photos[@]}" --precision bf16
  wanted horovod && trainer_job horovod-photos-resnet50-fp16 photos "${horovod[@]}" "${photos[@]}" --precision fp16

  tar -C "$WORK" -czf "$out/gpu-proof-logs.tar.gz" logs
  cat "$results"
}

case "${1:-}" in
  prepare) prepare ;;
  stage) stage ;;
  build) build ;;
  run) run ;;
  *) echo "usage: $0 prepare | stage | build | run" >&2; exit 2 ;;
esac
