"""The per-step data plane between a CU and the server's decoder (paper Section III.B, Algorithm 1): transport
only. The decoder it carries the frames to (its host, per-frame work, joint and ordered updates) is the server's,
in :mod:`collapipe_flwr.fl.server.decoder`.

- :mod:`.wire`: frame codec (JSON header + raw tensor bytes; scaled float16 or per-channel int8 on the
  wire), no pickle.
- :mod:`.protocol`: step request / reply / error frames and the gRPC method name.
- :mod:`.backend`: the one interface to the transport that carries the CUs' streams (``dataplane.transport``):
  ``grpc`` (:mod:`.grpc_server`, :mod:`.grpc_client`; passes HTTP/2 proxies and load balancers) or ``socket``
  (:mod:`.socket_server`, :mod:`.socket_client`, framing in :mod:`.socket_wire`; one TCP connection per CU, the
  lowest latency); :mod:`.stream_session` serves one stream's frames whichever carries them.
- :mod:`.checks`: what a step request must satisfy before the decoder runs it.
- :mod:`.streams`: the host's open streams (per (t, n) caps, idle reaper); :mod:`.stats`: its counters.
- :mod:`.client`: :class:`DecoderClient`, the CU's remote ``HeadFn`` (its settings: :class:`DecoderClientSpec`).
- :mod:`.shm`: the same-host shortcut (``dataplane.shared_memory: auto``): a CU on the server's host puts
  its frames in a shared-memory segment it owns and sends only a pointer on its authenticated stream.

Wiring (one host per run, one client per CU per round; the host: ``fl/server/decoder/host.py``)::

    spec = DecoderHostSpec.from_config(cfg, hidden_size=H, precision=p)  # dataplane.*, decoder_update, ...
    host = DecoderHost(head, head_optimizer, secret, spec, lr_factor_of=f)  # or DecoderHostSpec(hidden_size=H, ...)
    host.start()                          # then announce f"{cfg.dataplane.host}:{host.port}" + secret
    host.open_round(t, selected_clusters) # before sending the round's train messages
    ...                                   # CUs: with DecoderClient(address, secret, t, n, spec) as head:
    host.close_round()                    #          pipeline.train_step(batch, m, head)
    with host.lock: evaluate(head)        # use the head outside the data plane only under its lock
    host.stop()

Threat model: each CU holds its own key per round (:mod:`.auth`), checked from the stream's metadata (gRPC) or
its connection's hello frame (socket) before any frame is read; frames larger than the task can produce are
refused by gRPC's cap or from the socket frame's length prefix (:func:`.transport.step_message_mb`); idle
streams are reaped; with ``dataplane.tls_*`` the channel is TLS (grpc.ssl_server_credentials /
grpc.secure_channel, or the stdlib ``ssl`` for sockets), the server authenticated by its certificate.
"""

from collapipe_flwr.fl.dataplane.client import DecoderClient, DecoderClientSpec

__all__ = ["DecoderClient", "DecoderClientSpec"]
