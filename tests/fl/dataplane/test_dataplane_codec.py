"""The data plane's wire codec: every dtype and shape round-trips, a step request carries all but the input ids, and
untrusted bytes only ever raise DataPlaneError."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.protocol import decode_step_request, encode_step_request
from collapipe_flwr.fl.dataplane.wire import DTYPES, decode_frame, encode_frame
from tests.dataplane_helpers import (
    SECRET,
    make_step,
)


# ---------------------------------------------------------------------------------------------------
# wire codec
# ---------------------------------------------------------------------------------------------------
def test_codec_round_trips_every_dtype_and_shape():
    g = torch.Generator().manual_seed(9)
    tensors = []
    for i, (name, dtype) in enumerate(DTYPES.items()):
        shape = [(2, 3), (), (0, 4), (5,), (1, 2, 3)][i % 5]
        base = torch.randn(shape, generator=g) * 50
        t = base > 0 if dtype is torch.bool else base.to(dtype)
        tensors.append((f"t/{name}", t, 1.0))
    meta, decoded = decode_frame(encode_frame({"kind": "x", "n": 3}, tensors))
    assert meta == {"kind": "x", "n": 3}
    for (name, t, _), wt in zip(tensors, decoded):
        assert wt.name == name and wt.tensor.dtype == t.dtype and wt.tensor.shape == t.shape
        assert torch.equal(wt.tensor, t)
        wt.tensor.add_(0) if wt.tensor.dtype is not torch.bool else None  # writable, no warning path


def test_step_request_carries_everything_but_input_ids():
    z, mbs = make_step(40, m=3)
    req = decode_step_request(encode_step_request(SECRET, 4, 2, 9, z, mbs))
    assert (req.secret, req.round, req.cluster, req.seq, req.wire_dtype) == (SECRET, 4, 2, 9, "float32")
    for got, mb, zz, sent in zip(req.micro_batches, mbs, req.z_enc, z):
        assert set(got) == set(mb) - {"input_ids"}
        for key in got:
            assert torch.equal(got[key], mb[key])
        assert torch.equal(zz, sent)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.integers(0, 400))
def test_decoder_of_untrusted_bytes_only_raises_dataplane_error(noise, cut):
    good = encode_frame({"kind": "step"}, [("z/0", torch.ones(2, 3), 1.0), ("mb/0/labels", torch.arange(2), 1.0)])
    for data in (noise, good[:cut] + noise, good[:cut], b"CPDP\x01" + noise):
        try:
            decode_frame(data)
        except DataPlaneError:
            pass
