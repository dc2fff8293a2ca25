"""Wire compression of the data plane (dataplane.compression: none | fp16 | int8), against hand formulas."""

from __future__ import annotations

import pytest
import torch

from collapipe_flwr.config import DataPlaneSpec, compose
from collapipe_flwr.config.sections import parse_dataplane
from collapipe_flwr.errors import ConfigError, DataPlaneError
from collapipe_flwr.fl.dataplane.backend import TRANSPORTS
from collapipe_flwr.fl.dataplane.protocol import (
    decode_reply,
    decode_step_request,
    encode_step_reply,
    encode_step_request,
)
from collapipe_flwr.fl.dataplane.wire import from_wire_int8, to_wire_int8
from collapipe_flwr.pipeline.head import head_step
from tests.dataplane_helpers import SECRET, Served, TokenHead, make_step


def test_int8_by_hand():
    """Channel 0: max |x| = 1.27 -> s = 0.01; channel 1: max |x| = 4 -> s = 4/127 (hand computation)."""
    x = torch.tensor([[1.0, -2.0], [0.5, 4.0], [-1.27, 0.1]])
    q, scales = to_wire_int8(x)
    assert q.dtype == torch.int8
    torch.testing.assert_close(scales, torch.tensor([0.01, 4 / 127]))
    # -2 / (4/127) = -63.5 -> -64 (round half to even); 0.1 / (4/127) = 3.175 -> 3
    assert q.tolist() == [[100, -64], [50, 127], [-127, 3]]
    back = from_wire_int8(q, scales)
    torch.testing.assert_close(back, torch.tensor([[1.0, -64 * 4 / 127], [0.5, 4.0], [-1.27, 3 * 4 / 127]]))


@pytest.mark.parametrize("magnitude", [1e-7, 1.0, 1e4])
def test_int8_error_bound(magnitude):
    """|x - q s_c| <= s_c / 2 = max|x[..., c]| / 254 per value (float32 rounding aside)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 7, 12, generator=g) * magnitude * torch.linspace(0.1, 10, 12)
    back = from_wire_int8(*to_wire_int8(x))
    amax = x.abs().amax(dim=(0, 1))
    bound = amax / 254 * (1 + 1e-5)
    assert bool(((back - x).abs() <= bound).all())


def test_int8_zero_channel_is_exact():
    x = torch.zeros(3, 4)
    x[:, 1] = torch.tensor([1.0, -1.0, 0.5])
    back = from_wire_int8(*to_wire_int8(x))
    assert torch.equal(back[:, [0, 2, 3]], torch.zeros(3, 3))


def test_none_round_trip_is_bit_exact():
    z, mbs = make_step(5, m=2)
    req = decode_step_request(encode_step_request(SECRET, 1, 0, 1, z, mbs, compression="none"))
    for a, b in zip(req.z_enc, z):
        assert torch.equal(a, b)
    grads = [torch.randn(2, 3, 4), torch.randn(1, 3, 4)]
    reply = decode_reply(encode_step_reply(1, 0.5, grads, compression="none"), 1, 2)
    assert all(torch.equal(a, b) for a, b in zip(reply.grads, grads))


def test_int8_frame_is_a_quarter_of_fp32():
    z, mbs = make_step(6, b=8, t=16, m=1, hidden=256)
    mbs = [{"attention_mask": mb["attention_mask"]} for mb in mbs]
    none = len(encode_step_request(SECRET, 1, 0, 1, z, mbs, compression="none"))
    int8 = len(encode_step_request(SECRET, 1, 0, 1, z, mbs, compression="int8"))
    z_bytes = 8 * 16 * 256
    assert none - int8 >= 3 * z_bytes - 256 * 4 - 64


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_int8_remote_step_matches_a_hand_quantised_reference(transport):
    """The decoder sees z rounded per channel (q s_c, computed here by hand); the CU gets dL/dz_enc within
    max|g[..., c]| / 254 of the reference gradient."""
    s = Served(TokenHead(), compression="int8", transport=transport)
    try:
        with s.client(0, compression="int8") as client:
            for step in range(2):
                z, mbs = make_step(40 + step, m=2)
                loss, grads = client(z, mbs)
                zq = []
                for t in z:
                    sc = t.abs().amax(dim=(0, 1)) / 127
                    zq.append(torch.round(t / sc) * sc)
                ref_loss, ref_grads = head_step(s.ref_head, s.ref_optimizer, zq, mbs)
                assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss)
                for g, rg in zip(grads, ref_grads):
                    bound = rg.abs().amax(dim=(0, 1)) / 254 * (1 + 1e-4) + 1e-12
                    assert g.dtype == torch.float32 and bool(((g - rg).abs() <= bound).all())
    finally:
        s.host.stop(grace_s=0)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mismatched_compression_is_refused_naming_the_key(transport):
    s = Served(TokenHead(), transport=transport)  # host: none
    try:
        with s.client(0, compression="int8") as client:
            z, mbs = make_step(50)
            with pytest.raises(DataPlaneError, match="dataplane.compression=none"):
                client(z, mbs)
    finally:
        s.host.stop(grace_s=0)


def test_unknown_compression_is_refused():
    with pytest.raises(DataPlaneError, match="dataplane.compression='zip'"):
        encode_step_reply(1, 0.0, [], compression="zip")


def test_config_keys():
    assert DataPlaneSpec().compression == "none"
    assert parse_dataplane({"compression": "int8"}).compression == "int8"
    with pytest.raises(ConfigError, match="dataplane.compression='gzip'"):
        DataPlaneSpec(compression="gzip")
    assert DataPlaneSpec().transport == "socket" and DataPlaneSpec(transport="grpc").transport == "grpc"
    with pytest.raises(ConfigError, match="dataplane.transport='tcp' must be one of grpc, socket"):
        DataPlaneSpec(transport="tcp")


OLD_FP16 = r"^dataplane.fp16 was removed; use dataplane.compression: fp16 instead"


@pytest.mark.parametrize("value", [True, False])
def test_the_old_fp16_key_in_a_config_is_refused_naming_compression(value):
    with pytest.raises(ConfigError, match=OLD_FP16) as err:
        parse_dataplane({"fp16": value, "compression": "none"})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("override", ["dataplane.fp16=true", "+dataplane.fp16=false"])
def test_an_override_of_the_old_fp16_key_is_refused_naming_compression(override):
    with pytest.raises(ConfigError, match=OLD_FP16) as err:
        compose(["task=translation", override])
    assert "\n" not in str(err.value)
    assert compose(["task=translation", "dataplane.compression=fp16"])["dataplane"]["compression"] == "fp16"
