"""The socket transport's gate: every connection up to its whole hello, on one thread, never blocking on one.

Why: keyless floods (silent, slow or junk connections) are to be held as gRPC holds them, so connections not past
their hello cost no thread: one gate thread accepts and reads every TLS handshake and hello without blocking (a
selector: no connection's silence holds up another's accept or hello). Each pending connection has
``hello_timeout_s`` (1.5 s) from its accept for its handshake and whole hello, an absolute deadline (a peer
dripping bytes is closed as a silent one); at most ``max_pending_per_peer`` (128) per peer address and
``max_pending`` (256) in all wait, and a connection over either bound evicts the oldest pending one (of its own
address, or of the address holding the most), never itself: a flood recycles its own connections, and a CU, which
sends its hello at once, gets through even from the flood's own address (200 connections held open and reopened
on loopback: every step served, ``tests/fl/dataplane/test_dataplane_flood.py``); a hello prefix over 4 KiB is
refused before the body is read. A connection whose hello is whole (or refused on its prefix) leaves the gate's
books and goes, socket and all, to the listener's ``on_hello``, which admits or refuses it (:mod:`.socket_server`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sized
from dataclasses import dataclass

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.socket_wire import HELLO_MAX_BYTES, LENGTH, PeerClosed, hello_identity
from collapipe_flwr.fl.dataplane.wire import decode_header

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 1.5  # from accept to a whole hello (TLS handshake included); a CU sends it at once
MAX_PENDING = 256  # connections waiting for their hello, in all (each an fd and a few bytes, no thread)
MAX_PENDING_PER_PEER = 128  # of them from one peer address
BACKLOG = 512  # the kernel's accept queue (capped by net.core.somaxconn): room for a burst while the gate is busy
ACCEPT_BATCH = 64  # connections accepted per turn of the gate, between reads of the pending hellos
GATE_TICK_S = 0.25  # the gate's longest sleep (it also wakes for every accept, hello byte and expiry)

Who = tuple[int, int, str] | None  # (t, n, key) a hello presented; None: no well-formed hello


@dataclass
class GateBounds:
    """How long a connection may take to its whole hello, and how many may wait for it (in all and per peer
    address). Read at every accept, so a change applies to the connections accepted after it."""

    hello_timeout_s: float = HELLO_TIMEOUT_S
    max_pending: int = MAX_PENDING
    max_pending_per_peer: int = MAX_PENDING_PER_PEER

    def __post_init__(self) -> None:
        if not self.hello_timeout_s > 0 or int(self.max_pending) < 1 or int(self.max_pending_per_peer) < 1:
            raise DataPlaneError(
                f"hello_timeout_s={self.hello_timeout_s}, max_pending={self.max_pending} and max_pending_per_peer="
                f"{self.max_pending_per_peer} must be > 0"
            )
        self.hello_timeout_s = float(self.hello_timeout_s)
        self.max_pending, self.max_pending_per_peer = int(self.max_pending), int(self.max_pending_per_peer)


class _Pending:
    """A connection not past its hello yet: the gate reads its TLS handshake and hello without blocking, into
    ``buf`` (the 8-byte length prefix, then the hello itself), until ``deadline``."""

    __slots__ = ("buf", "deadline", "handshaken", "peer", "sock", "want", "writing")

    def __init__(self, sock: socket.socket, peer: str, deadline: float) -> None:
        self.sock, self.peer, self.deadline = sock, peer, deadline
        self.handshaken = False  # TLS: the handshake is done (the socket wrapped once its first bytes arrived)
        self.writing = False  # the TLS handshake waits to write: the gate also watches for room to send
        self.buf = bytearray()
        self.want = LENGTH.size  # bytes of prefix + hello expected so far (grows once the prefix is in)


class HelloGate:
    """Accepts on a listening socket and reads each pending connection's TLS handshake (with ``tls``) and hello
    without blocking, within ``bounds``; a connection whose hello is whole goes to ``on_hello(sock, who)`` (in the
    gate thread; it owns the socket from then on), and each eviction is reported to ``on_evict()``."""

    def __init__(
        self,
        bounds: GateBounds,
        tls: ssl.SSLContext | None,
        on_hello: Callable[[socket.socket, Who], None],
        on_evict: Callable[[], None],
    ) -> None:
        self.bounds = bounds
        self._tls, self._on_hello, self._on_evict = tls, on_hello, on_evict
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        # the gate thread's own (no lock): pending connections, oldest first, in all and per peer address
        self._pending: dict[_Pending, None] = {}
        self._by_peer: dict[str, dict[_Pending, None]] = {}
        self._selector: selectors.BaseSelector | None = None
        self.evicted = 0  # pending connections closed to make room for newer ones (a counter for tests and logs)
        self.timed_out = 0  # pending connections closed for sending no whole hello within hello_timeout_s

    @property
    def pending(self) -> Sized:
        """The connections waiting for their hello now (a live view, for tests and logs)."""
        return self._pending.keys()

    def start(self, listening: socket.socket) -> None:
        """Run the gate thread on ``listening`` (bound and listening); the gate closes it when it stops."""
        listening.setblocking(False)
        self._stopping.clear()
        self._selector = selectors.DefaultSelector()
        self._selector.register(listening, selectors.EVENT_READ, None)
        self._sock = listening
        self._thread = threading.Thread(target=self._run_gate, name="decoder-host-accept", daemon=True)
        self._thread.start()

    def stop(self) -> bool:
        """Stop accepting, close the pending connections and the listening socket; False when not running."""
        sock, self._sock = self._sock, None
        if sock is None:
            return False
        self._stopping.set()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes the gate's select (it closes the socket and the pending ones)
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        return True

    def _run_gate(self) -> None:
        selector, listening = self._selector, self._sock
        assert selector is not None and listening is not None, "start() sets them before the gate runs"
        try:
            while not self._stopping.is_set():
                now = time.monotonic()
                oldest = next(iter(self._pending), None)
                timeout = GATE_TICK_S if oldest is None else min(GATE_TICK_S, max(0.0, oldest.deadline - now))
                accept = False
                for key, _ in selector.select(timeout):
                    if key.data is None:
                        accept = True
                    else:
                        self._advance(key.data)
                if self._stopping.is_set():
                    return
                if accept:  # after the hellos that arrived: a new connection never evicts one ready to be read
                    try:
                        self._accept_some(listening)
                    except Exception as err:  # noqa: BLE001 - the gate must outlive any one connection's surprise
                        log.warning("data-plane accept failed: %r", err)
                        time.sleep(GATE_TICK_S / 5)
                self._expire(time.monotonic())
        finally:
            for pending in list(self._pending):
                self._drop(pending)
            selector.close()
            listening.close()

    def _accept_some(self, listening: socket.socket) -> None:
        """Accept what waits (up to :data:`ACCEPT_BATCH`), evicting the oldest pending connections over the
        bounds."""
        for _ in range(ACCEPT_BATCH):
            try:
                raw, address = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                if err.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of descriptors: free one (the oldest pending) for the next try; none: wait a little
                    oldest = next(iter(self._pending), None)
                    if oldest is not None:
                        self._evict(oldest)
                    else:
                        time.sleep(GATE_TICK_S / 5)
                    return
                if self._stopping.is_set() or err.errno in (errno.EBADF, errno.EINVAL):
                    return  # the listening socket was shut down (stop)
                continue  # ECONNABORTED and the like: that connection is gone, not the listener
            self._admit_pending(raw, str(address[0]))

    def _admit_pending(self, raw: socket.socket, peer: str) -> None:
        mine = self._by_peer.get(peer)
        if mine is not None and len(mine) >= self.bounds.max_pending_per_peer:
            self._evict(next(iter(mine)))
        elif len(self._pending) >= self.bounds.max_pending:
            biggest = max(self._by_peer.values(), key=len)  # the address holding the most pays, not the others
            self._evict(next(iter(biggest)))
        raw.setblocking(False)
        pending = _Pending(raw, peer, time.monotonic() + self.bounds.hello_timeout_s)
        assert self._selector is not None
        try:
            self._selector.register(raw, selectors.EVENT_READ, pending)
        except (OSError, ValueError):
            raw.close()
            return
        self._pending[pending] = None
        self._by_peer.setdefault(peer, {})[pending] = None
        self._advance(pending)  # what arrived with the connection is read now, before later ones may evict it

    def _expire(self, now: float) -> None:
        """Close the pending connections whose hello_timeout_s ran out (the oldest come first)."""
        while self._pending:
            oldest = next(iter(self._pending))
            if oldest.deadline > now:
                return
            self.timed_out += 1
            self._drop(oldest)

    def _evict(self, pending: _Pending) -> None:
        self.evicted += 1
        self._on_evict()
        self._drop(pending)

    def _forget(self, pending: _Pending) -> None:
        """Take ``pending`` out of the gate's books (its socket stays open)."""
        assert self._selector is not None
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(pending.sock)
        self._pending.pop(pending, None)
        mine = self._by_peer.get(pending.peer)
        if mine is not None:
            mine.pop(pending, None)
            if not mine:
                del self._by_peer[pending.peer]

    def _drop(self, pending: _Pending) -> None:
        self._forget(pending)
        with contextlib.suppress(OSError):
            pending.sock.close()

    def _advance(self, pending: _Pending) -> None:
        """Read what ``pending`` sent so far (handshake, prefix, hello) without blocking; once its hello is whole,
        hand it over. Whatever goes wrong with one connection ends that one, never the gate."""
        try:
            self._read_hello(pending)
        except Exception as err:  # noqa: BLE001 - a surprise from one peer must not stop the accepting
            log.warning("data-plane connection dropped before its hello: %r", err)
            self._drop(pending)

    def _read_hello(self, pending: _Pending) -> None:
        try:
            if self._tls is not None and not pending.handshaken:
                self._handshake(pending)
            while len(pending.buf) < pending.want:
                chunk = pending.sock.recv(pending.want - len(pending.buf))
                if not chunk:
                    self._drop(pending)  # the peer closed before its hello was whole
                    return
                pending.buf += chunk
                if len(pending.buf) == LENGTH.size:
                    (length,) = LENGTH.unpack(pending.buf)
                    if length > HELLO_MAX_BYTES:  # refused on the prefix, before a byte of the body is read
                        self._hand_over(pending, None)
                        return
                    pending.want = LENGTH.size + length
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError) as waiting:
            writing = isinstance(waiting, ssl.SSLWantWriteError)
            if writing != pending.writing:  # watch for room to send only while the handshake waits for it
                pending.writing = writing
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
                assert self._selector is not None
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._selector.modify(pending.sock, events, pending)
            return
        except OSError as err:  # a reset, a failed TLS handshake
            log.debug("data-plane connection ended before its hello: %s", err)
            self._drop(pending)
            return
        try:
            who = hello_identity(decode_header(memoryview(pending.buf)[LENGTH.size :]))
        except DataPlaneError:
            who = None
        self._hand_over(pending, who)

    def _handshake(self, pending: _Pending) -> None:
        """Advance the TLS handshake (raises SSLWantRead/WriteError while it waits). The socket is wrapped only
        once bytes arrived, so a silent connection costs no TLS state; the wrapper takes over the descriptor, so
        the selector is told of it."""
        assert self._tls is not None and self._selector is not None
        if not isinstance(pending.sock, ssl.SSLSocket):
            if not pending.sock.recv(1, socket.MSG_PEEK):  # BlockingIOError while nothing arrived
                raise PeerClosed(clean=True)
            self._selector.unregister(pending.sock)
            pending.sock = self._tls.wrap_socket(pending.sock, server_side=True, do_handshake_on_connect=False)
            self._selector.register(pending.sock, selectors.EVENT_READ, pending)
        pending.sock.do_handshake()
        pending.handshaken = True

    def _hand_over(self, pending: _Pending, who: Who) -> None:
        """Out of the gate's books, to ``on_hello``: the connection that presented ``who`` (None: no hello)."""
        self._forget(pending)
        self._on_hello(pending.sock, who)
