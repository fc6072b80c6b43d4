"""The preflight on a local two-host cluster, in the CPU image: the hosts check each other (an
all-reduce over both with exact values, its busbw, each host's compute and link), a host made slow
for real (its container limited to 5 % of a CPU) is named, and a host whose check fails stops
every host before the program, all naming it. (The rules themselves: tests/unit/test_preflight.py;
on one host: tests/integration/test_preflight.py.)"""

import json
import re
import time

import pytest

from helpers import HOSTS, IMAGES, copy_programs, read_json, run_cluster

pytestmark = [pytest.mark.image,
              pytest.mark.skipif(not IMAGES["cpu"],
                                 reason="DTC_IMAGE is not set (make test builds the image and sets it)")]

OLD_DRIVER = {"image_cuda": "12.8", "driver_version": "470.256.02", "driver_cuda": "11.4",
              "gpus": [{"index": 0, "pci_bus_id": "00000000:00:1E.0", "name": "Tesla T4", "compute_capability": "7.5",
                        "ok": True, "allocated_mb": 256}]}


def job_file(tmp_path, **spec) -> str:
    source = copy_programs(tmp_path / "source", "echo_argv.py")
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"distribution": "mpi", "program": "echo_argv.py", "source_dir": str(source),
                                "environment": {"DTC_PREFLIGHT": "quick"}, **spec}))
    return str(path)


# algo-2's CPU limit: far enough below what algo-1 gets on a busy test machine that the straggler
# rule (under half the other hosts' median) holds. The probe's CPU figure is one core's rate
# (probe.cpu_gflops), so algo-1 reads its container's share of a core x about 95 GFLOP/s, and
# algo-2 its quota: beside 10 busy containers on 2 cores (2026-12-08) algo-1 read 16 to 18 and
# algo-2 4.5 to 5.3 at 0.05 CPU (0.26x to 0.34x), 2.1 to 3.5 at 0.03 (0.12x to 0.23x). Until
# 9af527d the figure used torch's two threads, which mostly measured OpenMP's threads waiting on
# each other: beside 6 busy containers algo-1 read 4.1 to 5.6 against algo-2's 1.6 to 2.7 at 0.05
# (0.39x to 0.48x); in CI's failed run of 9af527d algo-1 read 2.51 and algo-2 2.69; at 0.1 CPU
# 7.9 against 4.9 (0.62x, 2026-11-29). So slow a
# host needs longer than the local cluster's 60 s for the others' preflight reports and its MPI
# daemon's start (dtc_local.cluster.LOCAL_TIMEOUTS_S): at 0.03 CPU beside 4 busy processes its report
# came after 60 s three times in three (2026-11-29). A real cluster's defaults are 600 s.
THROTTLED_CPUS = 0.03
THROTTLED_WAITS_S = {"DTC_PREFLIGHT_WAIT_S": "600", "DTC_MPI_WORKER_START_TIMEOUT_S": "600"}


def test_two_hosts_check_each_other_and_the_throttled_host_is_named(tmp_path):
    start = time.monotonic()
    done, result = run_cluster(tmp_path / "job", "--job-file",
                               job_file(tmp_path, host_cpus={"algo-2": THROTTLED_CPUS},
                                        environment={"DTC_PREFLIGHT": "quick", **THROTTLED_WAITS_S}), timeout_s=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0 and result["exit_code"] == 0, log[-5000:]
    records = {host: read_json(tmp_path / "job" / host / "output" / "data" / "preflight.json") for host in HOSTS}
    gflops = {host: summary["facts"].get("compute_gflops") for host, summary in records["algo-1"]["summaries"].items()}
    for host, record in records.items():
        assert record["host"] == host and record["hosts"] == list(HOSTS) and record["verdict"] == "warn", \
            (gflops, record["job_findings"])
        passed = [f for f in record["job_findings"] if f["check"] == "allreduce-hosts"]
        assert [f["status"] for f in passed] == ["pass"] and "exact" in passed[0]["message"]
        assert record["allreduce"]["ranks"] == 2 and record["allreduce"]["busbw_gbps"] > 0
        stragglers = [f for f in record["job_findings"] if f["check"] == "straggler"]
        assert stragglers and {f["host"] for f in stragglers} == {"algo-2"}, stragglers
        assert any(f["message"].startswith("host algo-2 computes at ") for f in stragglers), stragglers
        assert re.search(rf"\[{host}\].*preflight \(quick\) on 2 host\(s\): warn in [0-9.]+ s", log)
    assert records["algo-1"]["job_findings"] == records["algo-2"]["job_findings"]   # one account, on every host
    for host in HOSTS:   # the program ran after it
        assert (tmp_path / "job" / host / "output" / "data").exists()
    seconds = {host: (r["summaries"][host]["seconds"], r["seconds"]) for host, r in records.items()}
    print(f"preflight (own checks s, whole s) per host: {seconds}; GFLOP/s per host: {gflops}; "
          f"cluster {time.monotonic() - start:.0f} s")


def test_a_host_that_fails_its_preflight_stops_every_host_naming_it(tmp_path):
    start = time.monotonic()
    spec = {"host_environment": {"algo-2": {"DTC_PREFLIGHT_FACTS": json.dumps(OLD_DRIVER)}}}
    done, result = run_cluster(tmp_path / "job", "--job-file", job_file(tmp_path, **spec), timeout_s=600)
    seconds = time.monotonic() - start
    log = done.stdout + done.stderr
    assert {h: result["hosts"][h]["exit_code"] for h in HOSTS} == {"algo-1": 4, "algo-2": 4}, log[-5000:]
    for host in HOSTS:
        first = (tmp_path / "job" / host / "output" / "failure").read_text().splitlines()[0]
        assert first.startswith("preflight failed on host algo-2: the GPU driver 470.256.02 supports CUDA 11.4, older "
                                "than this image's CUDA 12.8, which needs driver 525.60.13 or later"), first
        assert not list((tmp_path / "job" / host / "output" / "data").glob("argv-*.json"))   # nothing ran
    assert seconds < 300, seconds
