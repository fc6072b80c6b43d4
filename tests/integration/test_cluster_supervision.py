"""The local cluster's supervision (`dtc_local.cluster.supervise_hosts`) over real processes:
once one host has failed the others get a grace period and are then stopped, hosts that end on
their own are left alone, and hosts still running at the timeout are stopped and reported as 124."""

import subprocess
import sys
import time

import pytest

from dtc_local import cluster


def _sleeper(code: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import sys, time; time.sleep({seconds}); sys.exit({code})"])


def test_once_a_host_fails_the_others_are_stopped_after_the_grace_period():
    procs = {"algo-1": _sleeper(0, 600), "algo-2": _sleeper(7, 0.2), "algo-3": _sleeper(0, 600)}
    stopped = []

    def stop(host):
        stopped.append(host)
        procs[host].terminate()

    start = time.monotonic()
    codes = cluster.supervise_hosts(procs, timeout_s=300, peer_grace_s=1.0, stop=stop, poll_s=0.1)
    assert codes == {"algo-1": -15, "algo-2": 7, "algo-3": -15}
    assert sorted(stopped) == ["algo-1", "algo-3"] and time.monotonic() - start < 20


def test_hosts_that_end_on_their_own_are_not_stopped():
    procs = {"algo-1": _sleeper(0, 0.5), "algo-2": _sleeper(0, 0.1)}
    codes = cluster.supervise_hosts(procs, timeout_s=60, peer_grace_s=0.1, stop=lambda h: pytest.fail(h), poll_s=0.05)
    assert codes == {"algo-1": 0, "algo-2": 0}


def test_hosts_still_running_at_the_timeout_are_stopped_and_reported_as_124():
    procs = {"algo-1": _sleeper(0, 600)}
    codes = cluster.supervise_hosts(procs, timeout_s=0.5, peer_grace_s=30, stop=lambda h: procs[h].kill(), poll_s=0.05)
    assert codes == {"algo-1": 124}
