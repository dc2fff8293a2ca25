"""The host's gRPC transport (``dataplane.transport: grpc``): one bidirectional stream of raw frames per CU.

A ``grpc.server`` with one worker thread per stream (at most ``max_streams``, more are refused), TLS from
``grpc.ssl_server_credentials`` when given, and :class:`~.auth.KeyInterceptor` refusing a call whose metadata
carries no admitted (t, n, key) before its handler runs. Each admitted stream's frames go through a
:class:`~.stream_session.StreamSession`. A frame over ``max_message_mb`` is refused by gRPC itself before any
decoding (RESOURCE_EXHAUSTED ends that stream); keepalive pings end a stream whose CU's machine vanished.
Choose it where the path to the server runs through HTTP/2 proxies or load balancers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent import futures

import grpc

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.auth import KeyInterceptor, identity_of
from collapipe_flwr.fl.dataplane.protocol import METHOD, SERVICE
from collapipe_flwr.fl.dataplane.stream_session import Sessions
from collapipe_flwr.fl.dataplane.transport import channel_options, format_address

log = logging.getLogger(__name__)


class GrpcListener:
    """The data plane's gRPC server on bind:port (TLS with ``tls`` = (certificate PEM, key PEM))."""

    def __init__(
        self, sessions: Sessions, *, bind: str, port: int, tls: tuple[bytes, bytes] | None, max_streams: int
    ) -> None:
        self._sessions = sessions
        self._bind, self._port, self._tls = bind, int(port), tls
        self._max_streams = int(max_streams)
        self._server: grpc.Server | None = None

    def start(self) -> int:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_streams + 2, thread_name_prefix="decoder-host"),
            options=channel_options(self._sessions.max_message_mb),
            maximum_concurrent_rpcs=self._max_streams,
            interceptors=(
                KeyInterceptor(
                    self._sessions.secret,
                    on_refused=self._sessions.refuse_unattributed,
                    not_admitted=self._sessions.not_admitted,
                ),
            ),
        )
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {METHOD: grpc.stream_stream_rpc_method_handler(self._serve_stream)}
        )
        server.add_generic_rpc_handlers((handler,))
        port = self._add_port(server)
        server.start()
        self._server = server
        return port

    def _add_port(self, server: grpc.Server) -> int:
        """Bind ``server`` to bind:port, over TLS when given; the bound port (one-line error when taken)."""
        try:
            address = format_address(self._bind, self._port)
            if self._tls is None:
                port = server.add_insecure_port(address)
            else:
                cert, key = self._tls
                port = server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
        except RuntimeError:
            port = 0
        if not port:
            raise DataPlaneError(
                f"cannot bind the data plane to {format_address(self._bind, self._port)}; choose a free "
                "dataplane.port or another dataplane.bind"
            )
        return port

    def stop(self, grace_s: float) -> None:
        if self._server is not None:
            self._server.stop(grace_s).wait(grace_s + 5.0)
            self._server = None

    def _serve_stream(self, request_iterator: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        """One CU's bidirectional stream: each request frame answered in order by its session."""
        who = identity_of(context.invocation_metadata())  # (t, n, key), checked by KeyInterceptor
        stream = (who[0], who[1]) if who is not None else None
        session = self._sessions.open(stream, context)
        if session is None:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self._sessions.full(stream))
            return
        try:
            for raw in request_iterator:
                reply = session.answer(raw)
                yield reply if isinstance(reply, bytes) else reply.tobytes()
            session.ended()  # the iterator ran out: the CU closed its side (a cancel raises instead)
        except Exception as err:  # the CU went away (cancel, disconnect, deadline) or the host stopped
            log.debug("data-plane stream ended: %s", err)
        finally:
            session.close()
