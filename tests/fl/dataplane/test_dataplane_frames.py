"""wire.Frame: the unjoined frame written into a buffer or joined gives the very bytes of encode_frame, and
decode_frame views a private bytearray in place (aligned) with the same values as a decode of bytes."""

from __future__ import annotations

import struct

import torch

from collapipe_flwr.fl.dataplane.wire import ALIGN, decode_frame, encode_frame, frame_of


def tensors():
    g = torch.Generator().manual_seed(5)
    return [
        ("z/0", torch.randn(4, 3, 8, generator=g), 1.0),
        ("mb/0/attention_mask", torch.ones(4, 3, dtype=torch.int64), 1.0),
        ("odd", torch.arange(3, dtype=torch.int8), 1.0),  # 3 bytes: padded to 8
        ("h", torch.randn(5, generator=g).half(), 0.5),
        ("empty", torch.empty(0, 2), 1.0),
    ]


def test_frame_pieces_match_the_joined_encoding():
    meta = {"kind": "x", "seq": 7}
    frame = frame_of(meta, tensors())
    joined = encode_frame(meta, tensors())
    assert frame.tobytes() == joined and len(frame) == len(joined)
    buf = bytearray(len(frame) + 16)  # room to spare: only the first len(frame) bytes are written
    frame.write_into(memoryview(buf))
    assert bytes(buf[: len(frame)]) == joined and not any(buf[len(frame) :])


def test_header_is_padded_so_the_payload_is_aligned():
    for name_len in range(1, 20):  # header lengths of every residue mod 8
        data = encode_frame({"kind": "x" * name_len}, [("t", torch.ones(2), 1.0)])
        header_len = struct.unpack_from("<4sBI", data)[2]
        assert (9 + header_len) % ALIGN == 0


def test_a_bytearray_is_decoded_in_place_with_the_values_of_a_copy():
    data = encode_frame({"kind": "x"}, tensors())
    own = bytearray(data)
    meta_a, from_bytes = decode_frame(data)
    meta_b, in_place = decode_frame(own)
    assert meta_a == meta_b == {"kind": "x"}
    for a, b, (name, t, scale) in zip(from_bytes, in_place, tensors()):
        assert a.name == b.name == name and a.scale == b.scale == scale
        assert torch.equal(a.tensor, t) and torch.equal(b.tensor, t)
    z = in_place[0].tensor
    assert z.data_ptr() % ALIGN == 0
    base = torch.frombuffer(own, dtype=torch.uint8).data_ptr()
    assert base <= z.data_ptr() < base + len(own)  # a view of the caller's buffer, no second copy
    z.add_(1.0)  # writable
    assert torch.equal(decode_frame(bytes(own))[1][0].tensor, tensors()[0][1] + 1.0)
