"""The CU's gRPC transport (``dataplane.transport: grpc``): one bidirectional stream per :class:`GrpcConnection`.

Requests go out through a queue the stream consumes; the caller reads each reply off the stream itself (no
reader thread and second queue: one thread handoff less per step, ~0.1-1 ms on a loaded machine), and a
watchdog thread cancels the stream when a reply is not in within ``timeout_s``, so every wait is bounded.
The CU's key travels in the call's metadata (checked by the host's interceptor before any frame is read).
"""

from __future__ import annotations

import math
import queue
import threading
import time

import grpc

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.auth import call_metadata
from collapipe_flwr.fl.dataplane.protocol import FULL_METHOD
from collapipe_flwr.fl.dataplane.transport import channel_options
from collapipe_flwr.fl.dataplane.wire import Frame

_END = object()
# a stream that ended under a step (the host cancelled it, e.g. reaped it idle, or the link dropped): the step
# may be resent once on a fresh stream
_LOST = (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)


class GrpcConnection:
    """One open bidirectional stream: an outgoing queue gRPC consumes, replies read by the caller, and a
    watchdog that cancels the call once a reply is overdue (checked every min(1 s, timeout_s / 4))."""

    def __init__(self, call, metadata: tuple[tuple[str, str], ...], timeout_s: float, address: str) -> None:
        self.outgoing: queue.Queue = queue.Queue()
        self.responses = call(iter(self.outgoing.get, _END), metadata=metadata)
        self.timeout_s = timeout_s
        self.address = address
        self.expired = False  # the watchdog cancelled the call: a reply was overdue
        self.lost = False
        self._deadline = math.inf  # monotonic time by which the awaited reply is due (inf: none awaited)
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="decoder-client-watchdog", daemon=True)
        self._watchdog.start()

    def exchange(self, frame: Frame | bytes) -> bytes:
        """Send ``frame`` and return the next reply; every failure is a DataPlaneError."""
        self._deadline = time.monotonic() + self.timeout_s
        self.outgoing.put(frame.tobytes() if isinstance(frame, Frame) else frame)
        try:
            return next(self.responses)
        except StopIteration:
            self.lost = True
            raise DataPlaneError("the decoder host ended the stream; the round may be closed") from None
        except Exception as err:
            if self.expired:
                raise DataPlaneError(
                    f"no reply from the decoder host at {self.address} within timeout_s={self.timeout_s:g}; "
                    f"check the server or raise dataplane.timeout_s"
                ) from None
            self.lost = isinstance(err, grpc.RpcError) and getattr(err, "code", lambda: None)() in _LOST
            raise _as_dataplane_error(err, self.address) from None
        finally:
            self._deadline = math.inf

    def _watch(self) -> None:
        period = min(1.0, self.timeout_s / 4)
        while not self._stop.wait(period):
            if time.monotonic() > self._deadline:
                self.expired = True
                self.responses.cancel()
                return

    def ended(self) -> bool:
        return self.responses.done()

    def close(self, cancel: bool) -> None:
        """End the requests; ``cancel`` the call, or give the host up to 5 s to end it cleanly."""
        self._stop.set()
        self.outgoing.put(_END)
        if cancel:
            self.responses.cancel()
            return
        try:
            self.responses.result(timeout=5.0)
        except Exception:  # noqa: BLE001 - already failed, cancelled or slow: the channel's close ends it
            pass


class GrpcDialer:
    """One gRPC channel to the host (TLS when ``root_certificate`` is given), opening streams on it."""

    def __init__(self, address: str, root_certificate: str, max_message_mb: int, timeout_s: float) -> None:
        self.address, self.timeout_s = address, timeout_s
        if root_certificate:  # TLS: trust the server certificate (or its CA) the train message carried
            credentials = grpc.ssl_channel_credentials(root_certificates=root_certificate.encode("utf-8"))
            self._channel = grpc.secure_channel(address, credentials, options=channel_options(max_message_mb))
        else:
            self._channel = grpc.insecure_channel(address, options=channel_options(max_message_mb))
        self._call = self._channel.stream_stream(FULL_METHOD, request_serializer=None, response_deserializer=None)

    def open(self, round_: int, cluster: int, key: str) -> GrpcConnection:
        return GrpcConnection(self._call, call_metadata(round_, cluster, key), self.timeout_s, self.address)

    def close(self) -> None:
        self._channel.close()


def _as_dataplane_error(err: BaseException, address: str) -> DataPlaneError:
    if isinstance(err, DataPlaneError):
        return err
    if isinstance(err, grpc.RpcError) and hasattr(err, "code"):
        code = err.code()
        details = " ".join(str(err.details() or "").split())
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "concurrent" in details.lower():
            return DataPlaneError(
                f"the decoder host at {address} already serves its maximum number of CU streams ({details}); raise "
                "its max_streams"
            )
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return DataPlaneError(
                f"the decoder host at {address} refused an oversized step ({details}); raise dataplane.max_message_mb "
                "on the server or use more micro-batches / dataplane.compression=fp16"
            )
        if code == grpc.StatusCode.UNAVAILABLE:
            return DataPlaneError(
                f"cannot reach the decoder host at {address} ({details}); check dataplane.host / port and that the "
                "server is running"
            )
        if code == grpc.StatusCode.CANCELLED:
            return DataPlaneError(
                f"the decoder host at {address} cancelled the stream ({details}); the round was probably closed"
            )
        return DataPlaneError(f"data-plane call to {address} failed with {code.name}: {details}")
    return DataPlaneError(f"data-plane call to {address} failed: {err.__class__.__name__}: {err}")
