"""Who may use the data plane: a key per (round t, cluster n), checked before any request body is read.

The server keeps one random run secret and never sends it. CU n gets, in its own round-t train message,
``cluster_key(secret, t, n)`` = HMAC-SHA256(secret, "t:n"): a CU knows only its own key, so it cannot send
steps as another cluster or into another round. The key travels twice:
- in the stream's call metadata (``x-collapipe-round``, ``x-collapipe-cluster``, ``x-collapipe-key``),
  which :class:`KeyInterceptor` checks when the call starts: a caller without a valid key, or with the key
  of a round that is not open or of a cluster the open round did not select, is refused (UNAUTHENTICATED)
  before a single frame is read, so floods of large unauthenticated frames never reach memory, idle
  unauthenticated streams never hold a worker, and a key of a closed round opens nothing;
  (with ``dataplane.transport: socket`` the same (t, n, key) travel in the connection's hello frame and are
  checked by :func:`refusal` before any step frame is read);
- in every frame's header, which the host checks again against the frame's own (t, n) and the stream's.
Step ids (the frame's ``seq``) must increase strictly per (t, n): a replayed or reordered frame is refused.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence

import grpc

ROUND_KEY = "x-collapipe-round"
CLUSTER_KEY = "x-collapipe-cluster"
KEY_KEY = "x-collapipe-key"


def cluster_key(run_secret: str | bytes, round_: int, cluster: int) -> str:
    """The data-plane key of cluster n in round t (hex HMAC-SHA256 of the run secret)."""
    secret = run_secret.encode("utf-8") if isinstance(run_secret, str) else run_secret
    return hmac.new(secret, f"{int(round_)}:{int(cluster)}".encode(), hashlib.sha256).hexdigest()


def key_matches(run_secret: str | bytes, round_: int, cluster: int, key: str) -> bool:
    """Constant-time check of a presented key."""
    return hmac.compare_digest(cluster_key(run_secret, round_, cluster).encode(), str(key).encode())


def call_metadata(round_: int, cluster: int, key: str) -> tuple[tuple[str, str], ...]:
    """What a CU's stream carries as metadata."""
    return ((ROUND_KEY, str(int(round_))), (CLUSTER_KEY, str(int(cluster))), (KEY_KEY, str(key)))


def identity_of(metadata: Sequence[tuple[str, str | bytes]] | None) -> tuple[int, int, str] | None:
    """(t, n, key) from call metadata, or None when any of them is missing or not an integer."""
    values = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in (metadata or ())}
    try:
        return int(values[ROUND_KEY]), int(values[CLUSTER_KEY]), str(values[KEY_KEY])
    except (KeyError, ValueError):
        return None


def refusal(
    run_secret: str | bytes,
    who: tuple[int, int, str] | None,
    not_admitted: Callable[[int, int], str | None] | None = None,
    carrier: str = "call metadata",
) -> str | None:
    """Why a stream presenting ``who`` = (t, n, key) in its ``carrier`` may not open (one line), None when it may:
    no valid key (checked in constant time), else round t not open or cluster n not selected (``not_admitted``)."""
    if who is None or not key_matches(run_secret, *who):
        return f"no valid data-plane key in the {carrier}; use the key from this round's train message"
    return not_admitted(who[0], who[1]) if not_admitted is not None else None


class KeyInterceptor(grpc.ServerInterceptor):
    """Refuse a call whose metadata carries no valid (round, cluster, key) before its handler runs."""

    def __init__(
        self,
        run_secret: str | bytes,
        on_refused: Callable[[], None] | None = None,
        not_admitted: Callable[[int, int], str | None] | None = None,
    ) -> None:
        self._secret = run_secret
        self._on_refused = on_refused
        # (t, n) -> why a valid key of round t, cluster n opens no stream now (round t not open, n not selected),
        # or None when it may; None here: any round's key is admitted
        self._not_admitted = not_admitted
        self._refusal = self._refuse_with(
            "no valid data-plane key in the call metadata; use the key from this round's train message"
        )

    @staticmethod
    def _refuse_with(message: str):
        def refuse(request_iterator, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        return grpc.stream_stream_rpc_method_handler(refuse)

    def intercept_service(self, continuation, handler_call_details):
        why = refusal(self._secret, identity_of(handler_call_details.invocation_metadata), self._not_admitted)
        if why is None:
            return continuation(handler_call_details)
        if self._on_refused is not None:
            self._on_refused()
        return self._refusal if why.startswith("no valid data-plane key") else self._refuse_with(why)
