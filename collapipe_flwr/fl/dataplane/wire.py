"""The wire codec: one frame = a small JSON header + the raw bytes of named tensors.

Layout of a frame (all integers little-endian)::

    b"CPDP" | version: u8 | header_len: u32 | header: UTF-8 JSON | payload

The header is a JSON object, padded with spaces so the payload starts at a multiple of 8 in the frame (a
decoder may view a frame it owns in place, aligned); its ``"tensors"`` list names every tensor in payload order as
``{"name": str, "dtype": str, "shape": [int, ...], "scale": float}``. Each tensor's bytes start at the
next multiple of 8 in the payload (so every dtype view is aligned) and the payload ends right after the
last tensor. Nothing is unpickled: only the dtypes in :data:`DTYPES` are accepted and every size is
checked against the frame before a byte is read, because frames come from the network (untrusted).

fp16 on the wire: :func:`to_wire_fp16` casts a float tensor to float16 after multiplying it by a power
of two ``scale`` chosen so that the largest magnitude lands near 2**14. That keeps large activations
from overflowing to inf and small gradients (the loss is divided by the whole batch's target count, so
dL/dz_enc is often ~1e-6) from flushing to zero. The scale is exact (a power of two), so decoding
divides it out without extra rounding; the only error is float16's rounding: at most 2**-11 of a value's
magnitude, and at most 2**-25 / scale (< 2**-38 * max|t|) for values in float16's subnormal range.

int8 on the wire (per channel): :func:`to_wire_int8` sends a float tensor [..., C] as int8
q = round(t / s_c) with one float32 scale per channel c of the last dim (the hidden size H of z_enc and
dL/dz_enc), s_c = max|t[..., c]| / 127, so q lies in [-127, 127]. Decoding is q * s_c; the only error is
the rounding, at most s_c / 2 = max|t[..., c]| / 254 per value (plus float32 rounding of the product).
A quarter of the fp32 bytes, plus 4 bytes per channel.
"""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from collapipe_flwr.errors import DataPlaneError

MAGIC = b"CPDP"
VERSION = 1
_PREFIX = struct.Struct("<4sBI")
ALIGN = 8
MAX_HEADER_BYTES = 1 << 20
MAX_DIMS = 8

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
_ITEMSIZE: dict[torch.dtype, int] = {v: torch.empty((), dtype=v).element_size() for v in DTYPES.values()}

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("the data-plane wire format assumes a little-endian machine")


@dataclass(frozen=True)
class WireTensor:
    """One decoded tensor: its name, values (as sent) and the fp16 scale to divide out (1.0 if none)."""

    name: str
    tensor: torch.Tensor
    scale: float = 1.0

    def value(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tensor with the wire scale divided out, cast to ``dtype`` when given."""
        t = self.tensor if dtype is None else self.tensor.to(dtype)
        if self.scale != 1.0:
            t = t.to(dtype or torch.float32) / self.scale
        return t


def _padded(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def peak_magnitude(t: torch.Tensor) -> float:
    """max |t| from one aminmax pass (as ``pipeline.finite.all_finite``); inf when t holds NaN or Inf."""
    if not t.is_floating_point() or t.numel() == 0:
        return 0.0
    lo, hi = (float(x) for x in torch.aminmax(t))
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return math.inf
    return max(-lo, hi)


def fp16_scale(t: torch.Tensor) -> float:
    """A power of two s such that max|s * t| lies in [2**13, 2**14) (1.0 for zero or non-finite t)."""
    if t.numel() == 0:
        return 1.0
    lo, hi = torch.aminmax(t.detach())
    amax = max(-float(lo), float(hi))  # aminmax propagates NaN, so a non-finite t gives a non-finite amax
    if not math.isfinite(amax) or amax == 0.0:
        return 1.0
    exponent = 13 - math.floor(math.log2(amax))
    return float(2.0 ** max(-100, min(100, exponent)))


def to_wire_fp16(t: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(float16 tensor, scale) for a float tensor; see the module docstring for the error bound."""
    scale = fp16_scale(t)
    scaled = t.detach().to(torch.float32)
    if scale != 1.0:
        scaled = scaled * scale
    return scaled.to(torch.float16), scale


INT8_LEVELS = 127


def to_wire_int8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 tensor, float32 scales [C]) for a float tensor [..., C]; see the module docstring for the bound."""
    x = t.detach().to(torch.float32)
    flat = x.reshape(-1, x.shape[-1]) if x.dim() else x.reshape(1, 1)
    amax = flat.abs().amax(dim=0) if flat.shape[0] else torch.zeros(flat.shape[1])
    scales = torch.where(amax > 0, amax / INT8_LEVELS, torch.ones_like(amax))
    q = torch.div(x, scales).round_().clamp_(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)  # one float temporary
    return q, scales


def from_wire_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 values q * s_c of an int8 tensor [..., C] and its per-channel scales [C]."""
    if scales.dim() != 1 or q.dim() == 0 or scales.shape[0] != q.shape[-1]:
        raise DataPlaneError(
            f"int8 tensor of shape {list(q.shape)} came with {list(scales.shape)} scales; one scale per channel of "
            "the last dim is needed"
        )
    if not bool(torch.isfinite(scales).all()) or not bool((scales > 0).all()):
        raise DataPlaneError("int8 scales must be finite and positive; the sender's frame is corrupt")
    return q.to(torch.float32).mul_(scales.to(torch.float32))  # the same values as int8 x float32 promotion


class Frame:
    """An encoded frame as its pieces (prefix and header, then each tensor's bytes and padding), not yet joined.

    A tensor's bytes are copied once on the way out: joined into the ``bytes`` gRPC sends (:meth:`tobytes`) or
    written straight into a shared-memory segment (:meth:`write_into`). The pieces view the tensors' storage,
    so a frame is sent before its tensors change.
    """

    __slots__ = ("pieces", "size")

    def __init__(self, pieces: list, size: int) -> None:
        self.pieces = pieces
        self.size = size

    def __len__(self) -> int:
        return self.size

    def tobytes(self) -> bytes:
        """The frame as one ``bytes`` object (what gRPC sends)."""
        return b"".join(self.pieces)

    def write_into(self, buf: memoryview) -> None:
        """Copy the frame to the start of ``buf`` (a byte buffer of at least :attr:`size` bytes)."""
        offset = 0
        for piece in self.pieces:
            n = len(piece)
            buf[offset : offset + n] = piece
            offset += n


def encode_frame(meta: dict, tensors: Sequence[tuple[str, torch.Tensor, float]]) -> bytes:
    """One frame holding ``meta`` (JSON-safe dict without a "tensors" key) and ``(name, tensor, scale)``."""
    return frame_of(meta, tensors).tobytes()


def frame_of(meta: dict, tensors: Sequence[tuple[str, torch.Tensor, float]]) -> Frame:
    """:func:`encode_frame` as a :class:`Frame` (its pieces: each tensor's bytes viewed, not copied)."""
    entries: list[dict] = []
    pieces: list = []
    offset = 0
    for name, tensor, scale in tensors:
        dtype_name = DTYPE_NAMES.get(tensor.dtype)
        if dtype_name is None:
            raise DataPlaneError(
                f"tensor {name!r} has dtype {tensor.dtype} which the data plane does not carry; cast it to one of "
                f"{', '.join(DTYPES)}"
            )
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        nbytes = flat.numel() * flat.element_size()
        entries.append({"name": name, "dtype": dtype_name, "shape": list(tensor.shape), "scale": float(scale)})
        if nbytes:  # a flat uint8 view of the storage (one-dimensional, format "B": joins and copies as is)
            pieces.append(memoryview(flat.view(torch.uint8).numpy()))  # type: ignore[arg-type]  # an ndarray is a Buffer
        pad = _padded(nbytes) - nbytes
        if pad:
            pieces.append(b"\0" * pad)
        offset += nbytes + pad
    prefix = _prefix({**meta, "tensors": entries})
    return Frame([prefix, *pieces], len(prefix) + offset)


def _prefix(header_fields: dict) -> bytes:
    """The frame's prefix and JSON header (``header_fields`` with its "tensors" entries), padded so the payload
    starts 8-aligned."""
    header = json.dumps(header_fields, separators=(",", ":")).encode("utf-8")
    header += b" " * (_padded(_PREFIX.size + len(header)) - _PREFIX.size - len(header))  # payload 8-aligned
    return _PREFIX.pack(MAGIC, VERSION, len(header)) + header


def with_meta(frame: Frame, **fields) -> Frame:
    """``frame`` with ``fields`` added to its header (JSON-safe values); its tensor pieces are shared, not copied
    (the payload's offsets are relative to its start, so a longer header moves nothing)."""
    meta = decode_header(frame.pieces[0])
    meta.pop("_header_len")
    prefix = _prefix({**meta, **fields})
    return Frame([prefix, *frame.pieces[1:]], frame.size - len(frame.pieces[0]) + len(prefix))


def decode_frame(data: bytes | bytearray | memoryview) -> tuple[dict, list[WireTensor]]:
    """Parse a frame from untrusted bytes: (header without "tensors", tensors in order).

    Raises :class:`DataPlaneError` naming the first problem. The returned tensors share one writable
    buffer: a ``bytearray`` is taken as the caller's own (its private copy, e.g. read out of shared memory,
    which the caller does not touch again), any other input is copied once into a new one.
    """
    meta = decode_header(data)
    view = memoryview(data)
    start = _PREFIX.size + meta.pop("_header_len")
    specs = meta.pop("tensors")
    layout, offset = [], 0
    for spec in specs:
        name, dtype, shape, scale = _tensor_spec(spec)
        count = math.prod(shape)
        layout.append((name, dtype, shape, scale, offset, count))
        offset += _padded(count * _ITEMSIZE[dtype])
    payload_len = len(view) - start
    if payload_len != offset:
        raise DataPlaneError(
            f"frame payload has {payload_len} bytes but its header describes {offset}; the sender's frame is corrupt "
            "or truncated"
        )
    buffer, base = (data, start) if _owned_aligned(data, start) else (bytearray(view[start:]), 0)
    out = []
    for name, dtype, shape, scale, off, count in layout:
        if count == 0:
            t = torch.empty(shape, dtype=dtype)
        else:
            t = torch.frombuffer(buffer, dtype=dtype, count=count, offset=base + off).reshape(shape)
        out.append(WireTensor(name, t, scale))
    return meta, out


def _owned_aligned(data: bytes | bytearray | memoryview, start: int) -> bool:
    """Whether ``data`` is a bytearray (the caller's private copy) whose payload at ``start`` is 8-aligned in
    memory, so the tensors can view it in place instead of a second copy."""
    if not isinstance(data, bytearray) or start % ALIGN or len(data) == 0:
        return False
    return torch.frombuffer(data, dtype=torch.uint8, count=1).data_ptr() % ALIGN == 0


def decode_header(data: bytes | bytearray | memoryview) -> dict:
    """Only the JSON header of a frame (cheap: used to check the secret before touching tensor bytes).

    The result keeps ``"tensors"`` (unvalidated) and adds ``"_header_len"``.
    """
    view = memoryview(data)
    if len(view) < _PREFIX.size:
        raise DataPlaneError(
            f"frame of {len(view)} bytes is shorter than the {_PREFIX.size}-byte prefix; the sender is not a "
            "data-plane client"
        )
    magic, version, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise DataPlaneError(
            "frame does not start with the data-plane magic bytes; the sender is not a data-plane client"
        )
    if version != VERSION:
        raise DataPlaneError(
            f"frame has wire version {version} but this side speaks {VERSION}; run the same collapipe-flwr version on "
            "server and CUs"
        )
    if header_len > MAX_HEADER_BYTES or _PREFIX.size + header_len > len(view):
        raise DataPlaneError(
            f"frame header length {header_len} does not fit the {len(view)}-byte frame; the frame is corrupt"
        )
    try:
        meta = json.loads(bytes(view[_PREFIX.size : _PREFIX.size + header_len]).decode("utf-8"))
    except (ValueError, RecursionError) as err:  # bad UTF-8 / JSON, absurd ints, absurd nesting
        raise DataPlaneError(
            f"frame header is not valid JSON ({err.__class__.__name__}); the frame is corrupt"
        ) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("tensors", None), list):
        raise DataPlaneError("frame header must be a JSON object with a 'tensors' list; the frame is corrupt")
    meta["_header_len"] = header_len
    return meta


def _tensor_spec(spec) -> tuple[str, torch.dtype, list[int], float]:
    if not isinstance(spec, dict):
        raise DataPlaneError("a tensor entry in the frame header is not an object; the frame is corrupt")
    name, dtype_name, shape, scale = spec.get("name"), spec.get("dtype"), spec.get("shape"), spec.get("scale", 1.0)
    if not isinstance(name, str) or not name:
        raise DataPlaneError("a tensor entry in the frame header has no name; the frame is corrupt")
    if dtype_name not in DTYPES:
        raise DataPlaneError(
            f"tensor {name!r} has dtype {dtype_name!r}; the data plane accepts only {', '.join(DTYPES)}"
        )
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in shape)
    ):
        raise DataPlaneError(
            f"tensor {name!r} has shape {shape!r}; a shape is a list of at most {MAX_DIMS} non-negative ints"
        )
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise DataPlaneError(f"tensor {name!r} has wire scale {scale!r}; it must be a finite positive number")
    if math.prod(shape) > 2**40:
        raise DataPlaneError(f"tensor {name!r} has shape {shape} with more elements than any frame can hold")
    return name, DTYPES[dtype_name], shape, float(scale)
