"""A torchrun or MultiWorkerMirrored host's presence (peers.Presence) and the others' watch of it: a host whose training
failed says why for a few seconds before its port closes, so that the other hosts' failure files
carry its cause instead of "host ... stopped answering" (issue #41, item 0)."""

import os
import threading
import time

from dtc_entrypoint import peers, report
from helpers import free_port


def test_a_running_presence_answers_nothing_and_a_failed_one_its_line_until_it_closes():
    port = free_port()
    presence = peers.Presence(port)
    try:
        assert peers.failure_notice("127.0.0.1", port) == ""
        line = "rank 3 on host algo-2 was killed by SIGABRT (exit code 134)"
        failing = threading.Thread(target=presence.fail, args=(line + "\n", 1.0))
        failing.start()
        time.sleep(0.2)
        assert peers.failure_notice("127.0.0.1", port) == line
        failing.join(timeout=5)
        assert not failing.is_alive()
        assert peers.failure_notice("127.0.0.1", port) is None   # closed after its linger
    finally:
        presence.shutdown()   # a second shutdown is harmless


def test_the_watch_returns_a_failed_hosts_line_at_once_and_a_closed_host_after_its_checks():
    failed_port, running_port = free_port(), free_port()
    failed, running = peers.Presence(failed_port), peers.Presence(running_port)
    try:
        threading.Thread(target=failed.fail, args=("CUDA error: out of memory", 10.0), daemon=True).start()
        time.sleep(0.2)
        started = time.monotonic()
        gone = peers.watch_until_one_closes([("127.0.0.1", running_port), ("127.0.0.1", failed_port)],
                                            poll_s=0.2, notices=True)
        assert gone == peers.Gone("127.0.0.1", failed_port, "CUDA error: out of memory")
        assert time.monotonic() - started < 2

        # without notices (sshd, TensorFlow servers) the same port is only up, until it closes
        threading.Timer(0.5, running.shutdown).start()
        gone = peers.watch_until_one_closes([("127.0.0.1", running_port)], closed_checks=2, poll_s=0.2)
        assert gone == peers.Gone("127.0.0.1", running_port, None)
    finally:
        failed.shutdown()
        running.shutdown()


def test_a_presence_seen_before_the_watch_that_closes_before_its_first_poll_is_reported():
    """cli._hold_until_the_master_ends: a worker host asks the master's presence once, then
    watches it; under torchrun both hosts leave the exit barrier together, and the master's
    presence may close between the two (make gpu-verify, 2026-12-03: two examples' worker hosts
    waited until the cluster's 900 s timeout). Seen up by the caller, its close ends the watch."""
    port = free_port()
    presence = peers.Presence(port)
    endpoint = ("127.0.0.1", port)
    try:
        assert peers.failure_notice(*endpoint) == ""   # the caller's check: the master still runs
        presence.shutdown()                             # and ends before the watch's first poll
        started = time.monotonic()
        gone = peers.watch_until_one_closes([endpoint], closed_checks=1, poll_s=0.2, notices=True,
                                            seen_up=[endpoint], stop=lambda: time.monotonic() > started + 5)
        assert gone == peers.Gone("127.0.0.1", port, None)   # reported, not stopped (stop gives None)
        # what the watch did before: an endpoint it never saw up itself is not reported, until stopped
        stop_at = time.monotonic() + 1.0
        assert peers.watch_until_one_closes([endpoint], closed_checks=1, poll_s=0.2, notices=True,
                                            stop=lambda: time.monotonic() > stop_at) is None
    finally:
        presence.shutdown()


def test_a_watch_of_notices_only_ignores_a_host_that_ends_and_returns_its_line_when_it_fails():
    """MultiWorkerMirrored (cli._peer_watch): a worker host may end long before the chief has
    written the model, so its presence closing is not a loss; its failure line still comes."""
    ended_port, failing_port = free_port(), free_port()
    ended, failing = peers.Presence(ended_port), peers.Presence(failing_port)
    endpoints = [("127.0.0.1", ended_port), ("127.0.0.1", failing_port)]
    try:
        threading.Timer(0.3, ended.shutdown).start()
        threading.Timer(2.0, failing.say, args=("stalled 20 s: rank 1 on algo-2 is in train.py:9 (load)",)).start()
        started = time.monotonic()
        gone = peers.watch_until_one_closes(endpoints, closed_checks=2, poll_s=0.2, notices=True, closes=False)
        assert gone == peers.Gone("127.0.0.1", failing_port, "stalled 20 s: rank 1 on algo-2 is in train.py:9 (load)")
        assert 1.8 < time.monotonic() - started < 4   # not the closed host's 0.4 s of checks

        failing.shutdown()   # both closed: nothing to report, until stopped
        stop_at = time.monotonic() + 1.5
        assert peers.watch_until_one_closes(endpoints, closed_checks=2, poll_s=0.2, notices=True, closes=False,
                                            stop=lambda: time.monotonic() > stop_at) is None
    finally:
        ended.shutdown()
        failing.shutdown()


def test_the_files_a_presence_offers_are_copied_by_another_host_and_nothing_before(tmp_path):
    """A stalled host offers its ranks' stacks (Presence.offer) before it says its line; the
    master copies them into its own forensics (fetch_files). A notice client is not sent them."""
    port = free_port()
    presence = peers.Presence(port)
    try:
        assert peers.fetch_files("127.0.0.1", port, str(tmp_path / "early")) == []   # nothing offered yet
        stacks = tmp_path / "stacks"
        stacks.mkdir()
        dumps = {"rank2-algo-2-pid41.txt": "Thread 0x1 (most recent call first):\n", "process-algo-2-pid40.txt": "x\n"}
        for name, text in dumps.items():
            (stacks / name).write_text(text)
        presence.offer(sorted(str(path) for path in stacks.iterdir()))
        presence.say("stalled 20 s: rank 2 on algo-2 is in train.py:9 (load)")
        assert peers.failure_notice("127.0.0.1", port) == "stalled 20 s: rank 2 on algo-2 is in train.py:9 (load)"
        copied = peers.fetch_files("127.0.0.1", port, str(tmp_path / "master"))
        assert sorted(os.path.basename(path) for path in copied) == sorted(dumps)
        assert {name: (tmp_path / "master" / name).read_text() for name in dumps} == dumps
    finally:
        presence.shutdown()
    assert peers.fetch_files("127.0.0.1", port, str(tmp_path / "late"), timeout_s=1) == []   # closed


def test_a_peers_line_is_named_by_its_host_once():
    assert report.peer_failed("algo-2", "rank 3 on host algo-2 was killed by SIGKILL") == \
        "host algo-2 failed: rank 3 on host algo-2 was killed by SIGKILL"
    relayed = "host algo-2 failed: rank 3 on host algo-2 was killed by SIGKILL"
    assert report.peer_failed("algo-3", relayed) == relayed
    assert report.LOST_HOST.match(report.lost_host("algo-2", "its train (algo-2:2226) stopped answering")).group(1) \
        == "algo-2"
