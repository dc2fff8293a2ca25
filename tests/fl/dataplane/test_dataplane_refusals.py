"""The data plane refuses every malformed, oversized, closed-round or surplus request with a clear error to that CU,
the decoder untouched, and keeps serving; broken peers, timeouts and unreachable hosts end as one error."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import torch

from collapipe_flwr.errors import CollaPipeError, DataPlaneError
from collapipe_flwr.fl.dataplane import DecoderClient, DecoderClientSpec
from collapipe_flwr.fl.dataplane.auth import cluster_key
from collapipe_flwr.fl.dataplane.protocol import encode_step_request
from collapipe_flwr.fl.dataplane.wire import decode_frame, decode_header
from collapipe_flwr.pipeline.head import head_step
from tests.dataplane_helpers import (
    SECRET,
    GatedHead,
    H,
    Served,
    TokenHead,
    assert_same_state,
    make_step,
    raw_stream,
    snapshot,
)


# ---------------------------------------------------------------------------------------------------
# refusals: a clear error to that CU, decoder untouched, server keeps serving
# ---------------------------------------------------------------------------------------------------
def _float64_z(z, mbs):
    return [t.double() for t in z], mbs


def _with(field, fn):
    def mutate(z, mbs):
        return z, [{**mb, field: fn(mb[field])} for mb in mbs]

    return mutate


def _nan(z, mbs):
    z = [t.clone() for t in z]
    z[-1][0, 1, 2] = float("nan")
    return z, mbs


def _inf(z, mbs):
    z = [t.clone() for t in z]
    z[0][0, 0, 0] = float("-inf")
    return z, mbs


def _longer_than_max_len(z, mbs):
    """200,000 positions in the original report; 40 > max_len = 16 is the same refusal, cheaper."""
    pad = 40 - z[0].shape[1]
    z = [torch.cat([t, torch.zeros(t.shape[0], pad, t.shape[2])], dim=1) for t in z]
    mbs = [{k: torch.cat([v, torch.zeros(v.shape[0], pad, dtype=v.dtype)], dim=1) for k, v in mb.items()} for mb in mbs]
    return z, mbs


def _drop_mask(z, mbs):
    return z, [{k: v for k, v in mb.items() if k != "attention_mask"} for mb in mbs]


MALFORMED = {
    "wrong key": ({"secret": "not-the-key"}, None, "no valid data-plane key"),
    "key of another cluster": ({"secret": cluster_key(SECRET, 1, 1)}, None, "no valid data-plane key"),
    "unknown round": ({"round": 7}, None, "round 7 is not open"),
    "cluster not in round": ({"cluster": 5}, None, "cluster 5 is not selected"),
    "hidden size": ({}, lambda z, mbs: ([t[..., : H - 1] for t in z], mbs), f"\\[B, T, {H}\\]"),
    "z not 3-d": ({}, lambda z, mbs: ([t[:, 0, :] for t in z], mbs), "needs \\[B, T"),
    "labels batch dim": ({}, _with("labels", lambda t: t[:-1]), "rows"),
    "mask shape": ({}, _with("attention_mask", lambda t: t[:, :-1]), "attention_mask has shape"),
    "missing mask": ({}, _drop_mask, "no attention_mask"),
    "z dtype float64": ({}, _float64_z, "float64 but the decoder host expects float32"),
    "z sent as fp16": ({"compression": "fp16"}, None, "float16 but the decoder host expects float32"),
    "labels dtype float": ({}, _with("labels", lambda t: t.float()), "integer"),
    "nan": ({}, _nan, "NaN or Inf"),
    "huge but finite z": ({}, lambda z, mbs: ([t * 0 + 3e38 for t in z], mbs), "max_abs_activation"),
    "sequence longer than max_len": ({}, _longer_than_max_len, "max_len=16"),
    "inf": ({}, _inf, "NaN or Inf"),
    "label out of range": ({}, _with("labels", lambda t: torch.where(t >= 0, t + 100, t)), "could not run"),
    "no targets": ({}, _with("labels", lambda t: torch.full_like(t, -100)), "no targets"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_request_is_refused_and_decoder_untouched(served, case, transport):
    client_kw, mutate, pattern = MALFORMED[case]
    with served.client(1) as warmup:  # give the optimizer state, so its untouchedness means something
        warmup(*make_step(1))
    before = snapshot(served.head, served.optimizer)
    z, mbs = make_step(2)
    bad_z, bad_mbs = mutate(z, mbs) if mutate else (z, mbs)
    with served.client(**{"cluster": 0, **client_kw}) as bad:
        with pytest.raises(DataPlaneError, match=pattern) as info:
            bad(bad_z, bad_mbs)
    message = str(info.value)
    assert isinstance(info.value, CollaPipeError) and "\n" not in message and len(message) < 400
    assert_same_state(before, snapshot(served.head, served.optimizer))
    # the same CU (a good request on a fresh client) and another CU are still served
    with served.client(0) as good0, served.client(1) as good1:
        good0(*make_step(3))
        good1(*make_step(4))
    counters = served.host.stats()
    assert sum(c["refused"] for c in counters["clusters"].values()) + counters["unattributed"]["refused"] == 1


def test_refused_request_leaves_the_stream_usable(served, transport):
    with served.client(0) as client:
        z, mbs = make_step(5)
        with pytest.raises(DataPlaneError, match="NaN"):
            client(*_nan(z, mbs))
        loss, grads = client(z, mbs)
    ref_loss, _ = head_step(served.ref_head, served.ref_optimizer, z, mbs)
    assert abs(loss - ref_loss) <= 1e-6


def test_oversized_request_is_refused(transport):
    s = Served(TokenHead(hidden=256), max_message_mb=1, hidden=256, transport=transport)
    try:
        before = snapshot(s.head, s.optimizer)
        z, mbs = make_step(6, b=64, t=32, m=1, hidden=256)  # 2 MiB of float32 activations
        with s.client(0) as client:
            with pytest.raises(DataPlaneError, match="oversized|max_message_mb"):
                client(z, mbs)
            # the client's own limit refuses before sending, with the same advice
            with s.client(0, max_message_mb=1) as strict:
                with pytest.raises(DataPlaneError, match="max_message_mb=1"):
                    strict(z, mbs)
            assert_same_state(before, snapshot(s.head, s.optimizer))
            client(*make_step(7, hidden=256))  # the stream is reopened and the server still serves
        assert s.host.stats()["clusters"][0]["steps"] == 1
    finally:
        s.host.stop(grace_s=0)


def test_closed_round_is_refused(served, transport):
    with served.client(0) as client:
        client(*make_step(8))
        served.host.close_round()
        before = snapshot(served.head, served.optimizer)
        with pytest.raises(DataPlaneError, match="closed|cancelled"):
            client(*make_step(9))
        with pytest.raises(DataPlaneError, match="round 1 is closed"):
            client(*make_step(9))
    served.host.open_round(2, [0])
    with served.client(0, round=1) as stale:
        with pytest.raises(DataPlaneError, match="round 1 is closed .*round 2 is open"):
            stale(*make_step(10))
    assert_same_state(before, snapshot(served.head, served.optimizer))
    with served.client(0, round=2) as fresh:
        fresh(*make_step(11))
    fresh.close()  # closing twice is fine; a closed client refuses to step
    with pytest.raises(DataPlaneError, match="closed"):
        fresh(*make_step(12))


def test_busy_decoder_and_too_many_streams_are_refused(transport):
    s = Served(TokenHead(), max_streams=1, lock_timeout_s=0.2, transport=transport)
    try:
        with s.client(0) as first, s.client(1) as second:
            first(*make_step(30))  # holds the only stream slot
            with pytest.raises(DataPlaneError, match="maximum number of CU streams"):
                second(*make_step(31))
            before = snapshot(s.head, s.optimizer)
            with s.host.lock:  # e.g. the server evaluating the decoder
                with pytest.raises(DataPlaneError, match="busy"):
                    first(*make_step(32))
            assert_same_state(before, snapshot(s.head, s.optimizer))
            first(*make_step(33))
    finally:
        s.host.stop(grace_s=0)


# ---------------------------------------------------------------------------------------------------
# broken peers, timeouts, raw frames
# ---------------------------------------------------------------------------------------------------


def test_server_survives_client_disconnect_mid_stream(served):
    z, mbs = make_step(12)
    frame = encode_step_request(cluster_key(SECRET, 1, 0), 1, 0, 1, z, mbs)
    hold = threading.Event()

    def requests():
        yield frame
        hold.wait(10)  # the stream stays open without sending more

    channel, call = raw_stream(served.host.address)
    responses = call(requests())
    next(responses)  # first step served
    responses.cancel()  # vanish mid-stream
    channel.close()
    hold.set()

    # garbage and truncated frames get error frames, not a dead server
    channel, call = raw_stream(served.host.address)
    replies = list(call(iter([b"garbage, not a frame", frame[:-9]]), timeout=10))
    channel.close()
    kinds = [decode_header(r)["kind"] for r in replies]
    assert kinds == ["error", "error"]
    assert "magic" in decode_frame(replies[0])[0]["message"]

    with served.client(1) as client:
        client(*make_step(13))
    stats = served.host.stats()
    assert stats["clusters"][0]["steps"] == 1 and stats["clusters"][1]["steps"] == 1
    head_step(served.ref_head, served.ref_optimizer, z, mbs)
    head_step(served.ref_head, served.ref_optimizer, *make_step(13))
    assert_same_state(snapshot(served.head, served.optimizer), snapshot(served.ref_head, served.ref_optimizer))


def test_client_times_out_and_recovers(transport):
    s = Served(GatedHead(), transport=transport)
    try:
        with s.client(0, timeout_s=0.3) as client:
            t0 = time.perf_counter()
            with pytest.raises(DataPlaneError, match="within timeout_s=0.3"):
                client(*make_step(14, m=1))
            assert time.perf_counter() - t0 < 5.0  # well before the gated step could ever finish (10 s)
            s.head.gate.set()  # the abandoned step completes on the server; the CU goes on with a new stream
            client(*make_step(15, m=1))
        assert s.host.stats()["clusters"][0]["steps"] == 2
    finally:
        s.host.stop(grace_s=0)


def test_unreachable_host_is_a_dataplane_error(transport):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spec = DecoderClientSpec(timeout_s=10, transport=transport)
    with DecoderClient(f"127.0.0.1:{port}", SECRET, 1, 0, spec) as client:
        with pytest.raises(DataPlaneError, match="cannot reach"):
            client(*make_step(16))
