"""gRPC settings shared by both ends of the data plane: message limits, keepalive, address format."""

from __future__ import annotations

from collapipe_flwr.config.sections import Compression

MB = 1 << 20
MAX_FRAME_BYTES = (1 << 24) - 1  # the largest HTTP/2 frame size a peer may announce (RFC 9113)


# Integer fields a step may carry per token besides z_enc (attention mask, labels, decoder inputs, ...):
# a generous bound, the tasks send at most four.
FIELDS_PER_TOKEN = 8
FRAME_OVERHEAD = 1 * MB  # header and per-tensor records


def step_message_mb(batch_size: int, max_len: int, hidden_size: int, compression: str) -> int:
    """The largest step frame a CU of this task can send, in MB, doubled for headroom: b sequences of at most
    ``max_len`` tokens, each with its z_enc row (H values: 4 bytes with ``compression`` none, else counted as
    2, the fp16 width, which also bounds int8 and its per-channel scales) and up to
    :data:`FIELDS_PER_TOKEN` int64 fields. Both ends use it as gRPC's message cap when
    ``dataplane.max_message_mb`` is 0, so no frame larger than the task can produce is ever buffered."""
    per_token = int(hidden_size) * (4 if compression == Compression.NONE else 2) + FIELDS_PER_TOKEN * 8
    largest = int(batch_size) * int(max_len) * per_token + FRAME_OVERHEAD
    return max(1, -(-2 * largest // MB))


def resolve_message_mb(configured: int, batch_size: int, max_len: int, hidden_size: int, compression: str) -> int:
    """dataplane.max_message_mb when set (> 0), else :func:`step_message_mb` of the task (both ends agree)."""
    return int(configured) if configured else step_message_mb(batch_size, max_len, hidden_size, compression)


def channel_options(max_message_mb: int) -> list[tuple[str, int]]:
    """Message size limits, a large HTTP/2 window and keepalive pings (a silent peer is noticed within
    ~40 s). The window (lookahead) lets a whole activation go out without waiting for flow-control
    acknowledgements: on loopback it saves a little CPU, on a real uplink it saves round trips."""
    limit = int(max_message_mb) * MB
    return [
        ("grpc.http2.lookahead_bytes", min(limit, 16 * MB)),
        # a fixed window (no bandwidth-delay probing that grows it): what a peer can push before its frame
        # is read, and refused when oversized, stays within min(cap, 16 MB) per stream
        ("grpc.http2.bdp_probe", 0),
        # HTTP/2 DATA frames up to 16 MiB (the default is 16 KiB: a 2 MiB z_enc went out as 128 frames, each
        # framed, parsed and flow-controlled apart); flow control above still bounds what a peer can push
        ("grpc.http2.max_frame_size", min(limit, MAX_FRAME_BYTES)),
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


def format_address(host: str, port: int) -> str:
    """host:port, bracketing IPv6 literals ("::1" -> "[::1]:port")."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{int(port)}"
