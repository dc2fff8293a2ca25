"""Checks a step request must pass before the decoder is touched (Algorithm 1, line 14 on the server).

Everything here is pure: it reads the decoded request and the host's expectations and raises
:class:`DataPlaneError` with one line naming the first problem and what to change. The host runs these
checks before taking its lock, so a refused request never reaches the head, its weights or its optimizer
state.
"""

from __future__ import annotations

import math

import torch

from collapipe_flwr.config.sections import Compression
from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.protocol import StepRequest, wire_mode
from collapipe_flwr.fl.dataplane.wire import peak_magnitude

_LABEL_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def expected_wire_dtype(compression: str) -> str:
    """The dtype z_enc travels in for the wire compression: float32 (none), float16 (fp16) or int8."""
    return _WIRE_DTYPES[wire_mode(compression)]


# dataplane.compression -> the dtype z_enc travels in
_WIRE_DTYPES = {Compression.NONE: "float32", Compression.FP16: "float16", Compression.INT8: "int8"}


def check_step(req: StepRequest, hidden_size: int, compression: str, max_len: int = 0, max_abs: float = 0.0) -> None:
    """z_enc[i] is [B_i, T_i, H] with H = ``hidden_size``, finite, in the agreed wire dtype; every
    micro-batch has an ``attention_mask`` [B_i, T_i] and every field has B_i rows; fields are integer.
    With ``max_len`` > 0 no sequence (T_i, or a field's second dim) is longer than the model's positions;
    with ``max_abs`` > 0 no activation is larger in magnitude (a finite but huge z_enc would overflow the
    decoder's loss). The first problem found raises, micro-batch by micro-batch."""
    check_wire_dtype(req, compression)
    mode = wire_mode(compression)
    keys = set(req.micro_batches[0])
    for i, (z, mb) in enumerate(zip(req.z_enc, req.micro_batches)):
        check_activation(i, z, hidden_size, max_len, max_abs, mode)
        check_micro_batch(i, z, mb, keys, max_len)


def check_wire_dtype(req: StepRequest, compression: str) -> None:
    """The activations arrive in the dtype of the agreed wire compression (none | fp16 | int8)."""
    mode = wire_mode(compression)
    want = expected_wire_dtype(mode)
    if req.wire_dtype != want:
        raise DataPlaneError(
            f"encoder outputs arrive as {req.wire_dtype} but the decoder host expects {want}; "
            f"set dataplane.compression={mode} on the CU too (and send float32 activations)"
        )


def check_activation(i: int, z: torch.Tensor, hidden_size: int, max_len: int, max_abs: float, mode: str) -> None:
    """z_enc[i] is a non-empty [B_i, T_i, H] with T_i <= ``max_len`` (when > 0), finite, and no |value| over
    ``max_abs`` (when > 0); ``mode`` is the wire compression (for the hint on NaN / Inf)."""
    if z.dim() != 3 or z.shape[2] != hidden_size:
        raise DataPlaneError(
            f"encoder output z/{i} has shape {list(z.shape)} but the decoder needs [B, T, {hidden_size}]; "
            f"the CU's encoder hidden size must equal the server head's"
        )
    if z.shape[0] == 0 or z.shape[1] == 0:
        raise DataPlaneError(
            f"encoder output z/{i} has shape {list(z.shape)}; empty micro-batches cannot be trained, drop them on "
            "the CU"
        )
    if max_len and z.shape[1] > max_len:
        raise DataPlaneError(
            f"encoder output z/{i} has T={z.shape[1]} positions but the model has max_len={max_len}; the CU must "
            "cut sequences at task.max_len"
        )
    peak = peak_magnitude(z)  # one pass: inf for NaN / Inf, else max |z|
    if not math.isfinite(peak):
        hint = " (float16 on the wire cannot be the cause: values are scaled)" if mode is Compression.FP16 else ""
        raise DataPlaneError(
            f"encoder output z/{i} holds NaN or Inf{hint}; the CU's encoder diverged: lower the learning rate or "
            "check the data"
        )
    if peak > max_abs > 0:
        raise DataPlaneError(
            f"encoder output z/{i} has |value| {peak:.3g} > dataplane.max_abs_activation={max_abs:g}; the CU's "
            "encoder diverged (lower the learning rate), or raise the limit"
        )


def check_micro_batch(i: int, z: torch.Tensor, mb: dict[str, torch.Tensor], keys: set[str], max_len: int) -> None:
    """Micro-batch i has the fields of micro-batch 0 (``keys``), an ``attention_mask`` [B_i, T_i] matching
    z_enc[i], and every field passes :func:`check_field`."""
    if set(mb) != keys:
        raise DataPlaneError(
            f"micro-batch {i} has fields {sorted(mb)} but micro-batch 0 has {sorted(keys)}; send the same fields "
            "for every micro-batch"
        )
    mask = mb.get("attention_mask")
    if mask is None:
        raise DataPlaneError(
            f"micro-batch {i} has no attention_mask; every micro-batch must send its attention_mask [B, T]"
        )
    if list(mask.shape) != list(z.shape[:2]):
        raise DataPlaneError(
            f"micro-batch {i}: attention_mask has shape {list(mask.shape)} but its encoder output has [B, T] = "
            f"{list(z.shape[:2])}; they must agree"
        )
    for key, value in mb.items():
        check_field(i, key, value, z.shape[0], max_len)


def check_field(i: int, key: str, value: torch.Tensor, rows: int, max_len: int) -> None:
    """Field ``key`` of micro-batch i has B_i = ``rows`` on dim 0, at most ``max_len`` positions on dim 1
    (when > 0), and an integer dtype (masks, labels, token ids)."""
    if value.dim() == 0 or value.shape[0] != rows:
        raise DataPlaneError(
            f"micro-batch {i}: field {key!r} has shape {list(value.shape)} but the encoder output has "
            f"B={rows} rows; every field needs the batch on dim 0"
        )
    if max_len and value.dim() >= 2 and value.shape[1] > max_len:
        raise DataPlaneError(
            f"micro-batch {i}: field {key!r} has {value.shape[1]} positions but the model has "
            f"max_len={max_len}; the CU must cut sequences at task.max_len"
        )
    if value.dtype not in _LABEL_DTYPES:
        raise DataPlaneError(
            f"micro-batch {i}: field {key!r} has dtype {str(value.dtype).removeprefix('torch.')}; masks, "
            "labels and token ids must be integer tensors"
        )


def check_part_fields(micro_batches: list[dict[str, torch.Tensor]], max_len: int = 0) -> None:
    """Part 0 of a 1F1B step carries every micro-batch's fields before their activations: each has the fields of
    micro-batch 0, an ``attention_mask`` [B_i, T_i], and fields passing :func:`check_field` (the activation of
    micro-batch i is checked against its mask with :func:`check_micro_batch` when its part arrives)."""
    if not micro_batches or not micro_batches[0]:
        raise DataPlaneError("part 0 of a step carries no micro-batch fields; it must send every micro-batch's fields")
    keys = set(micro_batches[0])
    for i, mb in enumerate(micro_batches):
        mask = mb.get("attention_mask")
        if set(mb) != keys or mask is None or mask.dim() != 2:
            shape = list(mask.shape) if mask is not None else None
            raise DataPlaneError(
                f"micro-batch {i} has fields {sorted(mb)} (attention_mask {shape}) but micro-batch 0 has "
                f"{sorted(keys)}; send the same fields, with an attention_mask [B, T], for every micro-batch"
            )
        for key, value in mb.items():
            check_field(i, key, value, mask.shape[0], max_len)
