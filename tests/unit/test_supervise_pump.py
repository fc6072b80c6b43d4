"""supervise's output pump and stall arithmetic, in this process (pipes, no child)."""

import collections
import os
import threading
import time

from dtc_entrypoint import supervise


class _ClosedPipe:
    def write(self, _data):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


def test_the_pump_drains_a_stream_whose_sink_is_gone_and_keeps_its_tail():
    """train's own stdout closed (its reader gone) must not block the training processes on a
    full pipe: the pump drops the sink and reads on."""
    read_fd, write_fd = os.pipe()
    progress = supervise._Progress()
    progress.last = 0.0
    tail = collections.deque(maxlen=5)
    pump = threading.Thread(target=supervise._pump, args=(os.fdopen(read_fd, "rb"), _ClosedPipe(), tail, progress))
    pump.start()
    payload = b"".join(b"line %d\n" % i for i in range(20000))   # more than a pipe holds (64 KiB)
    os.write(write_fd, payload)
    os.close(write_fd)
    pump.join(timeout=10)
    assert not pump.is_alive()
    assert list(tail) == [f"line {i}" for i in range(19995, 20000)]
    assert progress.last > 0


def test_idle_time_is_the_later_of_output_and_the_heartbeat_files_touch(tmp_path):
    beat = tmp_path / "beat"
    rule = supervise.StallRule(6, 0, str(beat), on_stall=lambda idle_s, tail: "")
    now = time.monotonic()
    assert rule.idle_s(now - 30, now) == 30   # no heartbeat file yet
    beat.touch()
    os.utime(beat, (time.time() - 5, time.time() - 5))
    assert 4.5 < rule.idle_s(now - 30, now) < 6
    assert rule.idle_s(now - 2, now) == 2


def test_lines_the_rule_calls_quiet_are_kept_but_are_not_progress():
    """Horovod's repeated stall warnings (report.horovod_stall_line) reach the log and the tail,
    but do not count as progress; a partial line counts only once it is complete."""
    from dtc_entrypoint import report

    read_fd, write_fd = os.pipe()
    progress = supervise._Progress(report.horovod_stall_line)
    progress.last = 0.0
    tail = collections.deque(maxlen=10)
    pump = threading.Thread(target=supervise._pump, args=(os.fdopen(read_fd, "rb"), None, tail, progress))
    pump.start()
    os.write(write_fd, b"[1,0]<stderr>:[2026-11-28 08:56:03.818153: W stall_inspector.cc:107] One or more tensors were "
                       b"submitted ... waiting for remainder of ranks for more than 10 seconds.\n"
                       b"[1,0]<stderr>:Missing ranks:\n[1,0]<stderr>:3: [allreduce.stop_requested]\n[1,0]<stderr>:epo")
    time.sleep(0.3)
    assert progress.last == 0.0 and len(tail) == 3
    os.write(write_fd, b"ch=2/10\n")
    os.close(write_fd)
    pump.join(timeout=10)
    assert progress.last > 0 and tail[-1] == "[1,0]<stderr>:epoch=2/10"
