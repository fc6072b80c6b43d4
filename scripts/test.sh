#!/usr/bin/env bash
# `make test` (what CI's .ci/run calls): every phase, each timed, a table of the times at the end
# with the machine's busy core-seconds and its speed before the tiers, before the cluster tier and
# after them (also build/test-phases.json), and the exit code of the first phase that failed. Every
# test tier runs even when an earlier one failed, so one run shows everything that is broken.
#
#   setup        scripts/setup-host.sh when its inputs changed (make setup)
#   image        the CPU image (make image)
#   gpu-image    the GPU image, only when its build inputs differ from tests/fixtures/gpu-verified.json
#                (scripts/gpu_inputs.py); its checks then run in the cluster tier (DTC_GPU_IMAGE)
#   docker-image the CPU image again, built by Docker's engine (scripts/docker-daemon.sh: BuildKit, the
#                build secret) where it runs; the Docker tests (tests/cluster/test_docker.py, the
#                buildspec's Docker half) use it, and skip, saying why, where the engine does not run.
#                It ends with a line in the file DTC_DOCKER_IMAGE_FILE names ("built <image>",
#                "none <why>" or "failed <why>"; helpers.docker_image), which those tests wait for
#   lint         ruff and shellcheck (make lint)
#   unit         tests/unit: no process started
#   integration  tests/integration: real train, mpirun and torchrun on this host
#   cluster      tests/cluster and tests/image: containers, two-host clusters, the built images
#   gpu          tests/gpu: skipped without an NVIDIA GPU
#
# The images are built in the background while lint, unit and integration run (they need no
# image; the build is mostly downloads and layer commits): podman's first, then Docker's. The
# cluster tier starts once podman's are built (their log printed then) and integration is done;
# Docker's build goes on beside it where it has not ended, and the tests that need it then run
# last and wait for it.
#
# Env: TEST_PHASES (default all of the above; e.g. "lint unit" for a quick run), PYTEST_ARGS
# (added to every pytest run), INTEGRATION_WORKERS / CLUSTER_WORKERS (pytest-xdist processes per
# tier; 1 runs a tier serially), IMAGE and GPU_IMAGE (tags), MAKE, PYTHON.
set -uo pipefail
REPO_DIR="$(cd "$(dirname "$0")/.." && pwd)"
cd "$REPO_DIR" || exit 1
MAKE="${MAKE:-make}"
PYTHON="${PYTHON:-$REPO_DIR/.venv/bin/python}"
IMAGE="${IMAGE:-dtc:cpu}" GPU_IMAGE="${GPU_IMAGE:-dtc:gpu}"
PHASES=" ${TEST_PHASES:-setup image docker-image gpu-image lint unit integration cluster gpu} "
INTEGRATION_WORKERS="${INTEGRATION_WORKERS:-2}" CLUSTER_WORKERS="${CLUSTER_WORKERS:-3}"
read -r -a pytest_args <<< "${PYTEST_ARGS:-}"
state="$(mktemp -d)"            # rows (phase seconds exit free-GB), the GPU image's name once built
trap 'rm -rf "$state"' EXIT
mkdir -p build
rm -f build/junit-*.xml

wants() { [[ "$PHASES" == *" $1 "* ]]; }
free_gb() { df -P -BG "$REPO_DIR" | awk 'NR == 2 {print $4 + 0}'; }   # where the images and tests' files live
free_at_start_gb="$(free_gb)"
# The machine's busy CPU time so far, in core-seconds (/proc/stat's first line: every state but
# idle and iowait; machine-wide, so the containers' processes count too).
busy_core_s() { awk -v hz="$(getconf CLK_TCK)" 'NR == 1 {print int(($2+$3+$4+$7+$8+$9) / hz); exit}' /proc/stat; }
busy_at_start="$(busy_core_s)"
# The machine's speed where a tier runs (bench/machine_speed.py: A8's bare loop on one core, about
# 10 s): on the idle machine before the tiers and after them, and between the integration and the
# cluster tiers where both run (beside Docker's build where it has not ended: the loop takes one
# core). This project's shared machines have run the same jobs at half speed for hours, and a run's
# speed has fallen between its start and its end (docs/development.md, 2026-12-07): the sample
# between the tiers tells which of the two ran slow.
speed() {   # speed WHEN (before | before_cluster | after): appends "WHEN images/s" (or "WHEN n/a") to $state/speed
  local out rate=n/a
  if out="$(timeout 120 "$PYTHON" bench/machine_speed.py 2> "$state/speed.err")"; then
    rate="$("$PYTHON" -c 'import json, sys; print(json.loads(sys.argv[1])["bare_loop_images_per_s"])' "$out")"
  else
    echo "the machine's speed was not measured (bench/machine_speed.py failed or ran past 120 s): $(tail -c 300 "$state/speed.err")" >&2
  fi
  echo "$1 $rate" >> "$state/speed"
}
measure_speed=0
if wants integration || wants cluster; then measure_speed=1; fi

pytest_tier() {   # pytest_tier NAME WORKERS PATH...: one tier, its slowest tests listed, its JUnit XML kept
  local name="$1" workers="$2"; shift 2
  local parallel=()
  [ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadgroup)
  local docker_file="" docker_built="" status image_built rebuilds=()
  if wants docker-image; then docker_file="$state/docker-image"; fi
  # Docker's build already ended with its image: named, so its tests neither wait nor go last
  # (tests/conftest.py); the file, for a build still running or one that failed or never ran.
  if [ -n "$docker_file" ] && [ -s "$docker_file" ]; then
    read -r status image_built < "$docker_file"
    [ "$status" = built ] && docker_built="$image_built"
  fi
  # The builds of the cluster and GPU tiers (the buildspec's, make's image prerequisite) rebuild
  # what this run's image phases built, from the same checkout: every step comes from the layer
  # cache and they write next to nothing, so build-image.sh's refusal below 30 GB free, which is
  # for a build the cache does not hold, is not theirs. CI's run of 02ed35b (2026-12-02) had its
  # buildspec test's third build refused so (exit 3), the first two having passed the same check.
  case "$name" in cluster|gpu) wants image && rebuilds=("IMAGE_BUILD_FREE_GB=${IMAGE_BUILD_FREE_GB:-1}") ;; esac
  DTC_IMAGE="$IMAGE" DTC_GPU_IMAGE="$(cat "$state/gpu-image" 2>/dev/null)" \
    DTC_DOCKER_IMAGE="$docker_built" DTC_DOCKER_IMAGE_FILE="$docker_file" env "${rebuilds[@]}" \
    "$PYTHON" -m pytest "$@" "${parallel[@]}" --durations=15 --junitxml="build/junit-$name.xml" "${pytest_args[@]}"
}

phase() {   # phase NAME: runs it, appends "NAME SECONDS EXIT FREE_GB" to the rows; returns its exit code
  local name="$1" start code
  start=$(date +%s)
  printf '\n===== phase %s =====\n' "$name"
  case "$name" in
    setup) "$MAKE" --no-print-directory setup ;;
    image) "$MAKE" --no-print-directory image IMAGE="$IMAGE" ;;
    docker-image)
      if ! scripts/docker-daemon.sh start; then
        echo "no Docker engine here: the Docker tests will skip"
        docker_result "none the Docker engine does not run on this machine (scripts/docker-daemon.sh start failed)"
      else
        # shellcheck disable=SC2046  # DOCKER_HOST=... DOCKER=..., no spaces
        if env $(scripts/docker-daemon.sh env) IMAGE="$IMAGE" BUILD_REPORT=build/docker-build.json \
             scripts/build-image.sh; then docker_result "built $IMAGE"
        else docker_result "failed scripts/build-image.sh with Docker's engine failed (build/images.log)"; false; fi
      fi ;;
    gpu-image)
      if python3 scripts/gpu_inputs.py check; then true
      else FLAVOR=gpu IMAGE="$GPU_IMAGE" scripts/build-image.sh && echo "$GPU_IMAGE" > "$state/gpu-image"; fi ;;
    lint) "$MAKE" --no-print-directory lint ;;
    unit) pytest_tier unit 1 tests/unit ;;
    integration) pytest_tier integration "$INTEGRATION_WORKERS" tests/integration ;;
    # tests/image first: its delivery and benchmark tests are the longest, and xdist hands out
    # tests in the order given
    cluster) pytest_tier cluster "$CLUSTER_WORKERS" tests/image tests/cluster ;;
    gpu) pytest_tier gpu 1 tests/gpu ;;
    *) echo "unknown phase '$name' in TEST_PHASES" >&2; false ;;
  esac
  code=$?
  echo "$name $(( $(date +%s) - start )) $code $(free_gb)" >> "$state/rows"
  return "$code"
}

docker_result() {   # docker_result "built IMAGE" | "none WHY" | "failed WHY": what helpers.docker_image reads
  printf '%s\n' "$1" > "$state/docker-image.tmp" && mv "$state/docker-image.tmp" "$state/docker-image"
}

images() {   # podman's image phases asked for, then Docker's; writes $state/podman-images (their exit code)
  local name code=0
  for name in image gpu-image; do
    if wants "$name"; then phase "$name" || { code=$?; break; }; fi
  done
  echo "$code" > "$state/podman-images"
  if wants docker-image; then
    if [ "$code" = 0 ]; then phase docker-image || code=$?
    else docker_result "none the podman image build failed first"; fi
  fi
  return "$code"
}

setup_code=0
if wants setup; then phase setup || { setup_code=$?; echo "setup failed: nothing else can run" >&2; }; fi
if [ "$setup_code" = 0 ]; then
  if [ "$measure_speed" = 1 ]; then speed before; fi
  builder=""
  if wants image || wants docker-image || wants gpu-image; then
    images > build/images.log 2>&1 &
    builder=$!
    echo "building the images in the background (log: build/images.log)"
  fi
  for name in lint unit integration; do
    if wants "$name"; then phase "$name"; fi
  done
  printed=0
  if [ -n "$builder" ]; then
    # podman's images: the cluster tier needs them (Docker's build may go on beside it)
    while [ ! -s "$state/podman-images" ] && kill -0 "$builder" 2>/dev/null; do sleep 5; done
    images_code="$(cat "$state/podman-images" 2>/dev/null || echo 1)"
    printf '\n===== the image build so far (build/images.log) =====\n'
    printed="$(wc -c < build/images.log)"
    cat build/images.log
    if [ "$images_code" != 0 ]; then echo "the image build failed: the cluster tier cannot run" >&2; fi
  fi
  if [ "${images_code:-0}" = 0 ]; then
    if wants integration && wants cluster; then speed before_cluster; fi
    # gpu first: without a GPU it is all skips, and a run's last pytest summary should count tests
    for name in gpu cluster; do
      if wants "$name"; then phase "$name"; fi
    done
  fi
  if [ -n "$builder" ]; then
    wait "$builder"
    printf '\n===== the rest of the image build (build/images.log) =====\n'
    tail -c +"$((printed + 1))" build/images.log
  fi
  if [ "$measure_speed" = 1 ]; then speed after; fi
fi

first_failure=0
printf '\n===== time per phase (%s; image, gpu-image and docker-image ran in the background: beside lint, unit and integration, and docker-image beside the cluster tier too) =====\n' \
  "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
printf '%-12s %8s %8s  %-4s  %s\n' phase seconds minutes exit "GB free after (${free_at_start_gb} at the start)"
json="["
while read -r name seconds code free; do
  printf '%-12s %8d %8.1f  %-4s  %s\n' "$name" "$seconds" "$(awk -v s="$seconds" 'BEGIN { print s / 60 }')" "$code" "$free"
  json+="{\"phase\": \"$name\", \"seconds\": $seconds, \"exit_code\": $code, \"free_gb_after\": $free},"
  if [ "$code" != 0 ] && [ "$first_failure" = 0 ]; then first_failure=$code; fi
done < <(cat "$state/rows" 2>/dev/null)
printf '%-12s %8d %8.1f\n' "wall clock" "$SECONDS" "$(awk -v s="$SECONDS" 'BEGIN { print s / 60 }')"
core_s=$(( $(busy_core_s) - busy_at_start ))
cores="$(nproc)"
busy_pct="$(awk -v c="$core_s" -v s="$SECONDS" -v n="$cores" 'BEGIN { printf "%d", (s > 0 ? 100 * c / (s * n) : 0) }')"
printf 'the machine: %d core-seconds busy in those %d s, %s %% of its %d cores (/proc/stat)\n' \
  "$core_s" "$SECONDS" "$busy_pct" "$cores"
speed_text="" speed_json=""
while read -r when rate; do
  case "$when" in before) phrase="before the tiers" ;; before_cluster) phrase="before the cluster tier" ;; *) phrase="after them" ;; esac
  speed_text+="$rate $phrase, "
  speed_json+="\"$when\": $([ "$rate" = n/a ] && echo null || echo "$rate"), "
done < <(cat "$state/speed" 2>/dev/null)
if [ -n "$speed_text" ]; then
  printf "its speed (bench/machine_speed.py: A8's bare loop on one core, training images/s): %s\n" \
    "${speed_text%, }"
fi
printf '{"phases": %s], "wall_clock_s": %d, "busy_core_s": %d, "cores": %d, "bare_loop_images_per_s": {%s}}\n' \
  "${json%,}" "$SECONDS" "$core_s" "$cores" "${speed_json%, }" > build/test-phases.json
# The failed tests of every tier by name (a log cut in its middle still names them), then every
# tier's counts in one closing line, in pytest's own summary format (a reader of the log that
# takes its last pytest summary line gets the whole run, not the last tier's).
python3 - "$SECONDS" build/junit-*.xml <<'PY'
import datetime
import os
import sys
import xml.etree.ElementTree as ET
counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
failed = []   # (tier, test id, the first line of its message): named here, where a cut log still shows them
for path in (p for p in sys.argv[2:] if os.path.exists(p)):   # the glob itself when no tier ran
    tier = os.path.basename(path)[len("junit-"):-len(".xml")]
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
        for case in suite.iter("testcase"):
            for outcome in (case.find("failure"), case.find("error")):
                if outcome is not None:
                    message = (outcome.get("message") or "").strip().splitlines() or [""]
                    failed.append((tier, f"{case.get('classname')}::{case.get('name')}", message[0][:300]))
if failed:
    print("\nwhat failed, every tier:")
    for tier, test, message in failed:
        print(f"FAILED [{tier}] {test}: {message}")
passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
parts = [f"{n} {word}" for n, word in ((counts["failures"], "failed"), (passed, "passed"),
                                       (counts["skipped"], "skipped"), (counts["errors"], "errors")) if n]
seconds = int(sys.argv[1])
line = f" {', '.join(parts) or 'no tests ran'} in {seconds}.00s ({datetime.timedelta(seconds=seconds)}) "
print("\nall tiers together:\n" + line.center(80, "="))
PY
exit "$first_failure"
