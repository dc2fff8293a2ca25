"""The messages of the per-step exchange (paper Algorithm 1, lines 11 and 15) on top of :mod:`.wire`.

A CU sends one *step request* per training step: the m encoder outputs z_enc[i] ("z/i") and, per
micro-batch, every tensor the head needs ("mb/i/<key>": attention_mask, labels, decoder_input_ids...;
``input_ids`` stays on the CU). Its header carries the per-run secret, the round t, the cluster n and a
sequence number. The server answers with a *step reply* (the step loss and dL/dz_enc[i] as "grad/i")
or an *error* frame whose one-line message the client raises as :class:`DataPlaneError`.

Wire compression (``dataplane.compression``): ``none`` sends float32, ``fp16`` scaled float16, ``int8``
int8 values with per-channel float32 scales beside them ("zs/i" for "z/i", "gs/i" for "grad/i").

Under ``pipeline.schedule: 1f1b`` a step travels as m *part* requests, one per micro-batch i (header
``"part": i``, ``"m"``: the step's micro-batch count): each carries its own "z/i" only, and part 0 also every
micro-batch's fields (the head counts the whole batch's targets C from them before any other part arrives).
Each part is answered with a reply holding "grad/0" (dL/dz_enc of that micro-batch); the reply to the last
part carries the step loss, after the decoder's one update of the step.

All of it travels on one gRPC method, a bidirectional stream of raw frames (no protoc code generation):
a CU opens one stream per round and sends its requests one after another on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from collapipe_flwr.config.sections import Compression
from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.wire import (
    Frame,
    WireTensor,
    decode_frame,
    decode_header,
    frame_of,
    from_wire_int8,
    to_wire_fp16,
    to_wire_int8,
    with_meta,
)

SERVICE = "collapipe.DecoderDataPlane"
METHOD = "Step"
FULL_METHOD = f"/{SERVICE}/{METHOD}"
LOCAL_ONLY_KEYS = ("input_ids",)


def wire_mode(compression: str = "none") -> Compression:
    """The wire compression ``compression`` (none | fp16 | int8), else a one-line :class:`DataPlaneError`."""
    try:
        return Compression(compression)
    except ValueError:
        raise DataPlaneError(f"dataplane.compression={compression!r}; use one of {', '.join(Compression)}") from None


def _float_tensors(prefix: str, scale_prefix: str, i: int, t: torch.Tensor, mode: str) -> list:
    """(name, tensor, scale) records of one float tensor in the wire mode (int8 adds its scales)."""
    if mode == Compression.FP16 and t.is_floating_point():
        half, scale = to_wire_fp16(t)
        return [(f"{prefix}/{i}", half, scale)]
    if mode == Compression.INT8 and t.is_floating_point():
        q, scales = to_wire_int8(t)
        return [(f"{prefix}/{i}", q, 1.0), (f"{scale_prefix}/{i}", scales, 1.0)]
    return [(f"{prefix}/{i}", t.to(torch.float32) if prefix == "grad" else t, 1.0)]


@dataclass
class StepRequest:
    """A decoded step request: the activations z_enc (float32, fp16 scale divided out) and micro-batches."""

    secret: str
    round: int
    cluster: int
    seq: int
    z_enc: list[torch.Tensor]
    micro_batches: list[dict[str, torch.Tensor]]
    wire_dtype: str
    part: int | None = None  # a 1F1B part request: micro-batch ``part`` of the step's m (z_enc holds its one z)
    m: int = 0  # the step's micro-batch count (the header's m)
    restart: bool = False  # the first step of a fresh attempt at the round (:func:`restarting`)


@dataclass(frozen=True)
class StepReply:
    seq: int
    loss: float
    grads: list[torch.Tensor]


def _int_field(meta: dict, key: str) -> int:
    value = meta.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise DataPlaneError(f"step request header field {key!r} is {value!r}; it must be an integer")
    return value


def encode_step_request(
    secret: str,
    round_: int,
    cluster: int,
    seq: int,
    z_enc: Sequence[torch.Tensor],
    micro_batches: Sequence[dict[str, torch.Tensor]],
    compression: str = "none",
) -> bytes:
    """Frame for one step: z_enc as float16 with a power-of-two scale when ``compression="fp16"``, as int8 with
    per-channel scales when ``compression="int8"`` (else as given)."""
    mode = wire_mode(compression)
    return step_request_frame(secret, round_, cluster, seq, z_enc, micro_batches, mode).tobytes()


def step_request_frame(
    secret: str,
    round_: int,
    cluster: int,
    seq: int,
    z_enc: Sequence[torch.Tensor],
    micro_batches: Sequence[dict[str, torch.Tensor]],
    compression: str = "none",
) -> Frame:
    """:func:`encode_step_request` as a :class:`~.wire.Frame` (its pieces, joined or written into shared
    memory by the sender: the activations are copied once)."""
    mode = wire_mode(compression)
    tensors = []
    for i, z in enumerate(z_enc):
        tensors.extend(_float_tensors("z", "zs", i, z, mode))
    for i, mb in enumerate(micro_batches):
        tensors.extend(_field_tensors(i, mb))
    return frame_of(_step_meta(secret, round_, cluster, seq, len(z_enc)), tensors)


def _step_meta(secret: str, round_: int, cluster: int, seq: int, m: int) -> dict:
    return {"kind": "step", "secret": secret, "round": int(round_), "cluster": int(cluster), "seq": int(seq), "m": m}


def part_request_frame(
    secret: str,
    round_: int,
    cluster: int,
    seq: int,
    part: int,
    z: torch.Tensor,
    micro_batches: Sequence[dict[str, torch.Tensor]],
    compression: str = "none",
) -> Frame:
    """Frame for micro-batch ``part`` of step ``seq`` (1F1B, module docstring): its "z/<part>", and with part 0
    the fields of all m = len(micro_batches) micro-batches."""
    mode = wire_mode(compression)
    tensors = _float_tensors("z", "zs", part, z, mode)
    for i, mb in enumerate(micro_batches if part == 0 else ()):
        tensors.extend(_field_tensors(i, mb))
    meta = _step_meta(secret, round_, cluster, seq, len(micro_batches))
    meta["part"] = int(part)
    return frame_of(meta, tensors)


def restarting(frame: Frame) -> Frame:
    """A step request (or part 0 of a 1F1B step) marked ``"restart": true``: the first step of the CU's fresh
    attempt at the round after a re-plan (a device lost mid-round, ``fl/cu/device_loss.py``). The host takes every
    step the cluster sent before in the round out of its decoder first (``fl/server/decoder/journal.py``) and
    numbers this one step 1 of the round again; the step id itself still rises (the replay guard holds)."""
    return with_meta(frame, restart=True)


def _field_tensors(i: int, mb: dict[str, torch.Tensor]) -> list:
    """(name, tensor, 1.0) records of micro-batch i's fields the head needs (not ``input_ids``)."""
    out = []
    for key, value in mb.items():
        if key in LOCAL_ONLY_KEYS:
            continue
        if "/" in key:
            raise DataPlaneError(
                f"micro-batch key {key!r} contains '/', which the data plane reserves; rename the batch field"
            )
        out.append((f"mb/{i}/{key}", value, 1.0))
    return out


def peek_step_header(data: bytes | bytearray) -> tuple[str, int, int, int, int]:
    """(secret, round, cluster, seq, m) from a step request header, without decoding any tensor bytes."""
    meta = decode_header(data)
    if meta.get("kind") != "step":
        raise DataPlaneError(
            f"frame kind {meta.get('kind')!r} is not a step request; the sender is not a data-plane client"
        )
    secret = meta.get("secret")
    if not isinstance(secret, str):
        raise DataPlaneError("step request carries no secret; pass the run's data-plane secret to the client")
    m = _int_field(meta, "m")
    if not 1 <= m <= 4096:
        raise DataPlaneError(f"step request has m={m} micro-batches; it must be between 1 and 4096")
    return secret, _int_field(meta, "round"), _int_field(meta, "cluster"), _int_field(meta, "seq"), m


def decode_step_request(data: bytes | bytearray) -> StepRequest:
    """Parse a step request; names must be exactly z/0..z/{m-1} and mb/{i}/{key} for i < m."""
    secret, round_, cluster, seq, m = peek_step_header(data)
    meta, tensors = decode_frame(data)
    z: list[WireTensor | None] = [None] * m
    zs: list[torch.Tensor | None] = [None] * m
    mbs: list[dict[str, torch.Tensor]] = [{} for _ in range(m)]
    for wt in tensors:
        parts = wt.name.split("/")
        index = _index(parts[1], m, wt.name) if len(parts) >= 2 else None
        if index is not None and parts[0] == "z" and len(parts) == 2:
            if z[index] is not None:
                raise DataPlaneError(f"step request holds {wt.name!r} twice; send each encoder output once")
            z[index] = wt
        elif index is not None and parts[0] == "zs" and len(parts) == 2:
            if zs[index] is not None or wt.tensor.dtype != torch.float32:
                raise DataPlaneError(f"step request holds {wt.name!r} twice or not as float32; send one scale vector")
            zs[index] = wt.tensor
        elif index is not None and parts[0] == "mb" and len(parts) == 3 and parts[2]:
            if parts[2] in mbs[index]:
                raise DataPlaneError(f"step request holds {wt.name!r} twice; send each micro-batch field once")
            if wt.scale != 1.0:
                raise DataPlaneError(
                    f"micro-batch field {wt.name!r} carries a wire scale; only activations may be scaled"
                )
            mbs[index][parts[2]] = wt.tensor
        else:
            raise DataPlaneError(f"step request holds a tensor named {wt.name!r}; expected z/<i> or mb/<i>/<key>")
    part = _part(meta, m)
    expect = list(range(m)) if part is None else [part]
    missing = [i for i in expect if z[i] is None]
    if missing:
        raise DataPlaneError(
            f"step request has m={m} but no encoder output for micro-batch(es) {missing}; send z/0..z/{m - 1}"
            if part is None
            else f"part {part} of a step carries no z/{part}; send its micro-batch's encoder output"
        )
    others = [i for i, (w, sc) in enumerate(zip(z, zs)) if i != part and (w is not None or sc is not None)]
    if part is not None and (others or (part and any(mbs))):
        raise DataPlaneError(
            f"part {part} of a step carries other micro-batches' tensors; a part sends its own z (and part 0 the "
            "fields of every micro-batch)"
        )
    outputs = [w for i, w in enumerate(z) if w is not None and i in expect]
    wire_dtype, values = _activations(outputs, [zs[i] for i in expect])
    return StepRequest(
        secret,
        round_,
        cluster,
        seq,
        values,
        mbs if part in (None, 0) else [],
        wire_dtype,
        part,
        m,
        _restart(meta, part),
    )


def _activations(outputs: list[WireTensor], scales: list[torch.Tensor | None]) -> tuple[str, list[torch.Tensor]]:
    """(wire dtype, float32 z_enc) of a request's encoder outputs and their int8 scales (None where none came)."""
    dtypes = {str(w.tensor.dtype).removeprefix("torch.") for w in outputs}
    if len(dtypes) != 1:
        raise DataPlaneError(f"encoder outputs arrive with mixed dtypes {sorted(dtypes)}; send them all in one dtype")
    wire_dtype = dtypes.pop()
    if wire_dtype == "int8":
        if any(s is None for s in scales):
            raise DataPlaneError("int8 encoder outputs need their per-channel scales zs/<i>; the frame is incomplete")
        return wire_dtype, [from_wire_int8(w.tensor, s) for w, s in zip(outputs, scales) if s is not None]
    if any(s is not None for s in scales):
        raise DataPlaneError(f"step request carries int8 scales for {wire_dtype} encoder outputs; the frame is corrupt")
    return wire_dtype, [w.value(torch.float32) if w.tensor.is_floating_point() else w.tensor for w in outputs]


def _restart(meta: dict, part: int | None) -> bool:
    """The header's ``restart`` flag (:func:`restarting`): a bool, on a whole step or part 0 only."""
    restart = meta.get("restart", False)
    if not isinstance(restart, bool):
        raise DataPlaneError(f"step request header field 'restart' is {restart!r}; it must be true or false")
    if restart and part not in (None, 0):
        raise DataPlaneError(
            f"part {part} of a step is marked restart; only a whole step or part 0 may start a fresh attempt"
        )
    return restart


def _part(meta: dict, m: int) -> int | None:
    """The header's ``part`` (1F1B: micro-batch i of the step's m), None for a whole-step request."""
    if "part" not in meta:
        return None
    part = _int_field(meta, "part")
    if not 0 <= part < m:
        raise DataPlaneError(f"step request is part {part} of m={m} micro-batches; parts run 0..{m - 1}")
    return part


def encode_step_reply(
    seq: int,
    loss: float,
    grads: Sequence[torch.Tensor],
    compression: str = "none",
    part: int | None = None,
) -> bytes:
    """The reply to a step request (or to its ``part``: then ``grads`` is that micro-batch's one gradient)."""
    return step_reply_frame(seq, loss, grads, wire_mode(compression), part).tobytes()


def step_reply_frame(
    seq: int, loss: float, grads: Sequence[torch.Tensor], compression: str = "none", part: int | None = None
) -> Frame:
    """:func:`encode_step_reply` as a :class:`~.wire.Frame` (written straight into a CU's segment, or joined)."""
    mode = wire_mode(compression)
    tensors = []
    for i, g in enumerate(grads):
        tensors.extend(_float_tensors("grad", "gs", i, g, mode))
    meta: dict = {"kind": "reply", "seq": int(seq), "loss": float(loss)}
    if part is not None:
        meta["part"] = int(part)
    return frame_of(meta, tensors)


def encode_error(seq: int | None, message: str) -> bytes:
    return error_frame(seq, message).tobytes()


def error_frame(seq: int | None, message: str) -> Frame:
    """The one-line refusal of step ``seq`` (None: not known) as a :class:`~.wire.Frame`."""
    return frame_of({"kind": "error", "seq": seq, "message": " ".join(str(message).split())}, [])


def decode_reply(data: bytes | bytearray, expected_seq: int, m: int, part: int | None = None) -> StepReply:
    """A step reply (to ``part`` of the step, when given) as float32 gradients; an error frame raises
    :class:`DataPlaneError` with its message."""
    meta, tensors = decode_frame(data)
    kind = meta.get("kind")
    if kind == "error":
        raise DataPlaneError(f"decoder host refused the step: {meta.get('message', 'no reason given')}")
    if kind != "reply":
        raise DataPlaneError(f"decoder host answered a frame of kind {kind!r}; server and CU run different versions")
    if meta.get("seq") != expected_seq:
        raise DataPlaneError(
            f"decoder host answered step {meta.get('seq')!r} while step {expected_seq} was waiting; the stream is out "
            "of order"
        )
    if meta.get("part") != part:
        raise DataPlaneError(
            f"decoder host answered part {meta.get('part')!r} of step {expected_seq} while part {part} was waiting; "
            "the stream is out of order"
        )
    loss = meta.get("loss")
    if not isinstance(loss, (int, float)) or isinstance(loss, bool):
        raise DataPlaneError(f"decoder host sent loss {loss!r}; expected a number")
    names = [t.name for t in tensors]
    if names == [f"grad/{i}" for i in range(m)]:
        return StepReply(int(expected_seq), float(loss), [t.value(torch.float32) for t in tensors])
    if names == [n for i in range(m) for n in (f"grad/{i}", f"gs/{i}")] and all(
        t.tensor.dtype == torch.int8 for t in tensors[::2]
    ):
        grads = [from_wire_int8(q.tensor, s.tensor) for q, s in zip(tensors[::2], tensors[1::2])]
        return StepReply(int(expected_seq), float(loss), grads)
    raise DataPlaneError(
        f"decoder host sent {len(tensors)} gradient tensors for {m} micro-batches; server and CU disagree on the step"
    )


def _index(text: str, m: int, name: str) -> int:
    if not text.isdigit() or int(text) >= m:
        raise DataPlaneError(f"step request tensor {name!r} names micro-batch {text!r}; indices run 0..{m - 1}")
    return int(text)
