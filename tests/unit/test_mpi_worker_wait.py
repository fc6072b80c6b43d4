"""An MPI worker host's last wait (dtc_entrypoint.mpi_hosts.wait_for_master_to_exit): it leaves
when the master's server closes, when its time is up, or when it is stopped, and never later."""

import os
import signal
import socket
import threading
import time

from dtc_entrypoint import mpi_hosts


def listening() -> socket.socket:
    """A server on a free local port that accepts (and closes) connections until it is closed."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                server.accept()[0].close()
            except OSError:   # closed
                return

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_the_worker_leaves_once_the_master_closes():
    server = listening()
    port = server.getsockname()[1]
    threading.Timer(1.0, server.close).start()
    started = time.monotonic()
    assert mpi_hosts.wait_for_master_to_exit("127.0.0.1", 30, port=port, poll_s=0.2) is True
    assert 1.0 <= time.monotonic() - started < 5


def test_a_master_that_closed_before_the_wait_began_ends_it_at_its_first_check():
    """The caller saw the master answer just before (mpi_job); its container may exit before the
    wait's first connection. Before 2026-12-04 such a master was never seen up by the wait itself,
    which then lasted its whole timeout (the pattern the torchrun exit barrier hit, df808f2)."""
    server = socket.create_server(("127.0.0.1", 0))   # no accepting thread: closed means refusing
    port = server.getsockname()[1]
    server.close()
    started = time.monotonic()
    assert mpi_hosts.wait_for_master_to_exit("127.0.0.1", 30, port=port, poll_s=0.2) is True
    assert time.monotonic() - started < 5


def test_the_worker_leaves_after_its_wait_while_the_master_stays_up():
    server = listening()
    started = time.monotonic()
    assert mpi_hosts.wait_for_master_to_exit("127.0.0.1", 1.5, port=server.getsockname()[1], poll_s=0.2) is False
    assert 1.5 <= time.monotonic() - started < 5
    server.close()


def test_a_stop_ends_the_wait_at_once_and_the_handlers_come_back():
    server = listening()
    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    started = time.monotonic()
    assert mpi_hosts.wait_for_master_to_exit("127.0.0.1", 30, port=server.getsockname()[1], poll_s=0.2) is False
    assert time.monotonic() - started < 3
    assert signal.getsignal(signal.SIGTERM) is before
    server.close()
