"""The decoder host's settings in one frozen value: :class:`DecoderHostSpec`, checked once on construction and
built from the run's config in one place (:meth:`DecoderHostSpec.from_config`). The host
(:class:`~collapipe_flwr.fl.server.decoder.host.DecoderHost`) and its frame service
(:class:`~collapipe_flwr.fl.server.decoder.frame_service.FrameService`) read their settings from it; runtime
objects (the head, its optimizer, the secret, TLS material, the lr clock) stay separate arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

from collapipe_flwr.config import RunConfig
from collapipe_flwr.config.sections import Compression, DecoderUpdateMode, Transport
from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.backend import DEFAULT_TRANSPORT, check_transport
from collapipe_flwr.fl.dataplane.protocol import wire_mode
from collapipe_flwr.fl.dataplane.transport import resolve_message_mb


@dataclass(frozen=True)
class DecoderHostSpec:
    """What a decoder host serves and how (every field a plain setting; see DecoderHost for their roles).

    ``hidden_size`` is H, the encoder width every z_enc must have. ``compression`` is the wire codec of z_enc
    and dL/dz_enc (none | fp16 | int8). ``advertise_host`` is the host part of the host's address (None:
    ``bind``, or 127.0.0.1 when binding every interface). ``max_streams`` bounds the concurrent CU streams;
    ``lock_timeout_s`` how long a request waits for the decoder (and, under ``joint`` / ``ordered``, how long a
    silent cluster is waited for); ``keep_order`` how many served steps :attr:`DecoderHost.served_order` keeps.
    ``decoder_update`` is federation.decoder_update: per_cu (one update per CU step, in arrival order) | joint
    (one update on step seq of all clusters) | ordered (one update per CU step, in cluster order).
    ``dropout_seed`` (runtime.seeded_dropout) seeds each head step's dropout masks (None: unseeded);
    ``max_len`` and ``max_abs_activation`` bound a step's positions and |z_enc| (0 = no limit); a stream idle
    for ``idle_timeout_s`` is cancelled; ``transport`` is grpc | socket.
    """

    hidden_size: int
    bind: str = "0.0.0.0"
    port: int = 0
    compression: Compression = Compression.NONE
    max_message_mb: int = 256
    advertise_host: str | None = None
    max_streams: int = 32
    lock_timeout_s: float = 120.0
    keep_order: int = 100_000
    precision: str = "fp32"
    decoder_update: DecoderUpdateMode = DecoderUpdateMode.PER_CU
    dropout_seed: int | None = None
    max_len: int = 0
    max_abs_activation: float = 0.0
    idle_timeout_s: float = 30.0
    transport: Transport = DEFAULT_TRANSPORT

    def __post_init__(self) -> None:
        """One-line errors, in this order, for a host that could not serve: a port or a frame cap out of range,
        an unknown wire compression, an idle timeout that is not positive, an unknown decoder update or
        transport."""
        if not 0 <= int(self.port) < 65536:
            raise DataPlaneError(f"data-plane port {self.port} is out of range; use 0..65535 (0 = any free port)")
        if int(self.max_message_mb) < 1:
            raise DataPlaneError(f"max_message_mb={self.max_message_mb} must be >= 1")
        object.__setattr__(self, "compression", wire_mode(self.compression))  # raises on an unknown compression
        if not self.idle_timeout_s > 0:
            raise DataPlaneError(f"idle_timeout_s={self.idle_timeout_s} must be > 0")
        try:
            object.__setattr__(self, "decoder_update", DecoderUpdateMode(self.decoder_update))
        except ValueError:
            raise DataPlaneError(
                f"decoder_update={self.decoder_update!r}; a decoder host updates one of "
                f"{', '.join(DecoderUpdateMode)} (federation.decoder_update)"
            ) from None
        object.__setattr__(self, "transport", check_transport(self.transport))

    @classmethod
    def from_config(cls, cfg: RunConfig, *, hidden_size: int, precision: str) -> DecoderHostSpec:
        """The run's host: ``dataplane.*`` (bound to ``dataplane.bind``, else the announced host; the frame cap
        sized from the task when 0), ``federation.decoder_update``, the model's positions, and the run's seed for
        the head's dropout under ``runtime.seeded_dropout``."""
        dp = cfg.dataplane
        return cls(
            hidden_size=hidden_size,
            bind=dp.bind or dp.host,
            port=dp.port,
            compression=dp.compression,
            max_message_mb=resolve_message_mb(
                dp.max_message_mb, cfg.task.batch_size, cfg.model.max_len, cfg.model.width, dp.compression
            ),
            precision=precision,
            decoder_update=cfg.federation.decoder_update,
            dropout_seed=cfg.seed if cfg.runtime.seeded_dropout else None,
            max_len=cfg.model.max_len,
            max_abs_activation=dp.max_abs_activation,
            idle_timeout_s=dp.idle_timeout_s,
            transport=dp.transport,
        )
