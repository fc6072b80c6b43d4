"""Reaching the job's other hosts: resolving their names, waiting for a port to open,
noticing when it closes, a host's ``Presence`` (its failure line, the files it offers), and the
master's end notice (``send_end_notice``, ``EndNoticeListener``)."""

import io
import logging
import os
import socket
import socketserver
import tarfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from .errors import PeerError

log = logging.getLogger(__name__)

POLL_S = 1.0
WATCH_POLL_S = 2.0   # how often watch_until_one_closes asks each host


def resolve(host: str) -> str | None:
    """The host's first IPv4/IPv6 address, or ``None`` when the name does not resolve now."""
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except (socket.gaierror, UnicodeError):
        return None


def wait_for_names(hosts: Sequence[str], timeout_s: float, clock: Callable[[], float] = time.monotonic,
                   poll_s: float = POLL_S) -> dict[str, str]:
    """Waits until every host name resolves (``DTC_HOST_RESOLVE_TIMEOUT_S``); returns host -> address.

    SageMaker's DNS can lag an instance's start by a few seconds (sagemaker-training retries its
    look-ups for the same reason), so names are retried until ``timeout_s``.

    Raises:
        PeerError: naming the hosts whose names still do not resolve.
    """
    deadline = clock() + timeout_s
    addresses: dict[str, str] = {}
    while True:
        for host in hosts:
            if host not in addresses and (address := resolve(host)) is not None:
                addresses[host] = address
        pending = [h for h in hosts if h not in addresses]
        if not pending:
            return addresses
        if clock() > deadline:
            raise PeerError(
                f"host {', '.join(pending)} could not be resolved by name within {timeout_s:.0f} s: every host of "
                "the job must resolve the others' names (resourceconfig.json hosts); on a local cluster give each "
                "container --add-host entries for every host, or raise DTC_HOST_RESOLVE_TIMEOUT_S")
        time.sleep(poll_s)


def accepts(host: str, port: int, timeout_s: float = 2.0) -> bool:
    """Whether ``host:port`` accepts a TCP connection now (a name that does not resolve: no)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_ports(hosts: Sequence[str], port: int, timeout_s: float, what: str, hint: str,
                   clock: Callable[[], float] = time.monotonic, poll_s: float = POLL_S) -> None:
    """Waits until every host accepts TCP connections on ``port``.

    Args:
        what: the service, for the error (``ssh``).
        hint: what to change, for the error (the timeout's variable).

    Raises:
        PeerError: naming the hosts still unreachable after ``timeout_s`` seconds.
    """
    deadline = clock() + timeout_s
    pending = list(hosts)
    while pending:
        pending = [h for h in pending if not accepts(h, port)]
        if pending and clock() > deadline:
            raise PeerError(
                f"host {', '.join(pending)} could not be reached: it did not accept {what} on port {port} "
                f"within {timeout_s:.0f} s; check the security group allows traffic between the job's hosts, or {hint}")
        if pending:
            time.sleep(poll_s)


def wait_until_closed(host: str, port: int, closed_checks: int = 3, poll_s: float = 2.0) -> None:
    """Returns once ``host:port`` has refused ``closed_checks`` consecutive connections
    (``closed_checks * poll_s`` seconds after the peer stopped serving)."""
    refused = 0
    while refused < closed_checks:
        refused = 0 if accepts(host, port) else refused + 1
        time.sleep(poll_s if refused < closed_checks else 0)


class Gone(NamedTuple):
    """An endpoint ``watch_until_one_closes`` reports: closed, or (``notice``) a ``Presence``
    that said why its host's training failed."""

    host: str
    port: int
    notice: str | None = None


def watch_until_one_closes(endpoints: Sequence[tuple[str, int]], closed_checks: int = 3, poll_s: float = WATCH_POLL_S,
                           stop: Callable[[], bool] = lambda: False, notices: bool = False,
                           closes: bool = True, seen_up: Sequence[tuple[str, int]] = ()) -> Gone | None:
    """Waits until one of ``endpoints`` (host, port), having accepted connections, refuses
    ``closed_checks`` consecutive ones (about ``closed_checks * poll_s`` seconds after its server
    went away) and returns it; returns ``None`` once ``stop()`` is true. An endpoint that never
    came up is not reported (the program that needs it says so itself); ``seen_up`` names those
    the caller has already seen answer, so that one that closes before this watch's first
    connection is reported too, not waited for until ``stop()``. With ``notices`` (the
    endpoints are ``Presence`` servers), one whose host's training failed is returned at once
    with its failure line (``Gone.notice``); with ``closes=False`` only such a notice is
    reported, never a closed endpoint (hosts that may end at different times)."""
    seen_up = set(seen_up)
    refused = {endpoint: 0 for endpoint in endpoints}
    while not stop():
        for endpoint in endpoints:
            said = failure_notice(*endpoint, timeout_s=poll_s) if notices else None
            if said:
                return Gone(*endpoint, said)
            up = (said is not None) if notices else accepts(*endpoint, timeout_s=poll_s)   # one connection a poll
            if up:
                seen_up.add(endpoint)
                refused[endpoint] = 0
            elif endpoint in seen_up:
                refused[endpoint] += 1
                if closes and refused[endpoint] >= closed_checks:
                    return Gone(*endpoint)
        time.sleep(poll_s)
    return None


def failure_notice(host: str, port: int, timeout_s: float = 2.0) -> str | None:
    """What the ``Presence`` on ``host:port`` says: its host's failure line once its training
    failed (``Presence.fail``), ``""`` while it runs, ``None`` when it does not accept a
    connection (or answers nothing within ``timeout_s`` seconds)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as connection:
            connection.sendall(_ASK_NOTICE)
            line = connection.makefile("rb").readline(_NOTICE_MAX_BYTES)
    except OSError:
        return None
    text = line.decode("utf-8", "replace").strip()
    return text.removeprefix(_FAILED) if text.startswith(_FAILED) else ""


def send_end_notice(addresses: Sequence[str], exit_code: int, timeout_s: float = 5.0) -> list[str]:
    """Tells each ``host:port`` (an ``EndNoticeListener``) that the master's command ended with
    ``exit_code`` (one line of ASCII digits). Returns the addresses that could not be told."""
    missed = []
    for address in addresses:
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout_s) as connection:
                connection.sendall(f"{exit_code}\n".encode())
        except OSError as error:
            log.warning("could not tell %s that training ended: %s", address, error)
            missed.append(address)
    return missed


class _NoticeServer(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


_FAILED = "failed: "
_NOTICE_MAX_BYTES = 2048
# what a Presence's client asks first, one line
_ASK_NOTICE = b"notice\n"
_ASK_FILES = b"files\n"
_FILES_MAX_BYTES = 64 * 1024 * 1024


def fetch_files(host: str, port: int, into: str, timeout_s: float = 10.0) -> list[str]:
    """Copies the files the ``Presence`` on ``host:port`` offers (``Presence.offer``) into the
    folder ``into``. Returns their paths there; ``[]`` when it offers none, does not answer, or
    sends what is not a tar archive (at most 64 MiB are read)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as connection:
            connection.sendall(_ASK_FILES)
            data = connection.makefile("rb").read(_FILES_MAX_BYTES)
    except OSError as error:
        log.warning("could not copy the files %s offers: %s", host, error)
        return []
    if not data:
        return []
    try:
        paths = []
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            os.makedirs(into, exist_ok=True)
            for member in archive.getmembers():
                name = os.path.basename(member.name)
                if not member.isfile() or name != member.name or name.startswith("."):   # plain files only
                    continue
                with archive.extractfile(member) as source, open(os.path.join(into, name), "wb") as target:
                    target.write(source.read())
                paths.append(os.path.join(into, name))
    except (tarfile.TarError, OSError, EOFError) as error:
        log.warning("the files %s offers could not be read: %s", host, error)
        return []
    return paths


class Presence:
    """``train``'s presence on ``port`` (all addresses, a background thread), for the other hosts'
    ``watch_until_one_closes(..., notices=True)``: while training runs, each connection is
    answered with nothing and closed; after ``fail(line)`` each one reads ``failed: <line>``, so
    that the other hosts' failure files carry this host's cause instead of "stopped answering".
    A client asks first, in one line: ``notice`` (``failure_notice``) or ``files``
    (``fetch_files``: the files ``offer`` gave, as a gzip'd tar archive; nothing before that)."""

    def __init__(self, port: int):
        presence = self
        self._notice = b""
        self._files = b""

        class Handler(socketserver.StreamRequestHandler):
            timeout = 5.0

            def handle(self):
                try:
                    asked = self.rfile.readline(32)
                    answer = presence._files if asked == _ASK_FILES else presence._notice
                    if asked and answer:
                        self.wfile.write(answer)
                except OSError:   # asked nothing in time, or left before the answer
                    return

        self._server = _NoticeServer(("", port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def say(self, line: str) -> None:
        """Answers every connection with ``failed: <line>`` from now on (a stall found here: the
        other hosts read their ranks' stacks and end, while this one waits for their account)."""
        self._notice = f"{_FAILED}{line.strip()}"[:_NOTICE_MAX_BYTES - 2].encode() + b"\n"

    def offer(self, paths: Sequence[str]) -> None:
        """Offers the files at ``paths`` (by their names, without folders) to the other hosts'
        ``fetch_files`` from now on: a stalled host's stacks, for the master's forensics."""
        packed = io.BytesIO()
        with tarfile.open(fileobj=packed, mode="w:gz") as archive:
            for path in paths:
                archive.add(path, arcname=os.path.basename(path), recursive=False)
        self._files = packed.getvalue()

    def fail(self, line: str, linger_s: float) -> None:
        """Answers every connection with ``line`` (this host's failure, its first line) for
        ``linger_s`` seconds (the watchers poll every 2 s), then stops serving."""
        self.say(line)
        time.sleep(linger_s)
        self.shutdown()

    def shutdown(self) -> None:
        """Stops serving: the other hosts see the port close."""
        self._server.shutdown()
        self._server.server_close()


class EndNoticeListener:
    """Listens on ``port`` (all addresses) in a background thread for ``send_end_notice`` and
    keeps the first exit code received."""

    def __init__(self, port: int):
        received = self._received = threading.Event()
        self.exit_code: int | None = None
        listener = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = 5.0

            def handle(self):
                line = self.rfile.readline(32).strip()
                if line.lstrip(b"-").isdigit() and not received.is_set():
                    listener.exit_code = int(line)
                    received.set()

        self._server = _NoticeServer(("", port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def wait(self, timeout_s: float) -> int | None:
        """The exit code the master sent, waiting up to ``timeout_s`` seconds; ``None`` if none came."""
        self._received.wait(timeout_s)
        return self.exit_code
