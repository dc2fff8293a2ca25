"""The data plane's same-host shortcut (fl/dataplane/shm.py): a step through shared memory equals the same
step sent inline and head_step in-process, only a pointer crosses gRPC, the frames read from a segment pass
the same checks, and no segment outlives its client (closed, refused, or killed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane import shm
from collapipe_flwr.fl.dataplane.auth import cluster_key
from collapipe_flwr.fl.dataplane.protocol import encode_step_request
from collapipe_flwr.fl.dataplane.wire import encode_frame
from collapipe_flwr.pipeline.head import head_step
from tests.dataplane_helpers import MAX_ABS, MAX_LEN, SECRET, Served, TokenHead, make_step
from tests.toplevel.test_shm_leftovers import dead_pid

SHM_DIR = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs /dev/shm (POSIX shared memory)")


def segments() -> set[str]:
    return {p.name for p in SHM_DIR.iterdir() if p.name.startswith(shm.PREFIX)}


@pytest.fixture
def served():
    s = Served(TokenHead(), max_len=MAX_LEN, max_abs_activation=MAX_ABS)
    yield s
    s.host.stop(grace_s=0)


def test_loopback_addresses():
    assert all(shm.is_loopback(a) for a in ("127.0.0.1:5", "localhost:5", "[::1]:5", "127.3.4.5:80"))
    assert not any(shm.is_loopback(a) for a in ("10.0.0.2:5", "edge-server:5", "[2001:db8::1]:5"))


def test_a_step_through_shared_memory_equals_the_inline_step_and_head_step(served):
    before = segments()
    z, mbs = make_step(3)
    with served.client(0, shared_memory="auto") as fast:
        loss, grads = fast(z, mbs)
        assert fast._segment is not None and fast._segment.name in segments() - before  # the shortcut was taken
        ref_loss, ref_grads = head_step(served.ref_head, served.ref_optimizer, z, mbs)
        assert loss == ref_loss
        for g, r in zip(grads, ref_grads):
            assert torch.equal(g, r)
        # a second step reuses the segment and still matches the reference
        z2, mbs2 = make_step(4)
        loss2, grads2 = fast(z2, mbs2)
        ref_loss2, ref_grads2 = head_step(served.ref_head, served.ref_optimizer, z2, mbs2)
        assert loss2 == ref_loss2 and all(torch.equal(g, r) for g, r in zip(grads2, ref_grads2))
    assert segments() == before  # closed with the client


def test_only_a_pointer_crosses_grpc(served, monkeypatch):
    sent: list[int] = []
    z, mbs = make_step(5)
    with served.client(0, shared_memory="auto") as fast:
        real = fast._exchange

        def spy(frame):
            sent.append(len(frame))
            return real(frame)

        monkeypatch.setattr(fast, "_exchange", spy)
        fast(z, mbs)
        inline = len(encode_step_request("k" * 64, 1, 0, 9, z, mbs))
    assert len(sent) == 1 and sent[0] < 300 < inline  # a pointer frame instead of the whole step


def test_frames_from_a_segment_pass_the_same_checks(served):
    """Cluster 0's stream pointing at a segment that holds cluster 1's step is refused, as inline."""
    z, mbs = make_step(6)
    frame = encode_step_request(cluster_key(SECRET, 1, 1), 1, 1, 1, z, mbs)
    segment = shm.ClientSegment(2 * len(frame))
    try:
        with served.client(0, shared_memory="auto") as client:
            client._segment = segment  # the forged content goes through the client's own segment

            def forged(_frame):
                return segment.write(frame)

            client._pointer_to = forged  # type: ignore[method-assign]
            with pytest.raises(
                DataPlaneError, match="a step of round 1, cluster 1 on the stream of round 1, cluster 0"
            ):
                client(z, mbs)
            client._segment = None
            del client._pointer_to  # back to the real method: the stream still serves cluster 0's own steps
            loss, _ = client(z, mbs)
        ref_loss, _ = head_step(served.ref_head, served.ref_optimizer, z, mbs)
        assert loss == ref_loss
    finally:
        segment.close()


def test_a_pointer_to_a_foreign_segment_name_is_refused():
    with pytest.raises(DataPlaneError, match="malformed shared-memory pointer"):
        shm.read_pointer(encode_frame({"kind": "shm", "name": "psm_other", "size": 10}, []))
    assert shm.read_pointer(encode_frame({"kind": "step"}, [])) is None


def test_the_client_falls_back_inline_when_the_host_cannot_open_its_segment(served):
    z, mbs = make_step(7)
    with served.client(0, shared_memory="auto") as client:
        client._pointer_to(b"x" * (1 << 20))  # make a segment big enough, then take its name away from the host
        client._segment.shm.unlink()
        loss, grads = client(z, mbs)
        assert client._use_shm is False and client._segment is None
    ref_loss, ref_grads = head_step(served.ref_head, served.ref_optimizer, z, mbs)
    assert loss == ref_loss and all(torch.equal(g, r) for g, r in zip(grads, ref_grads))


@pytest.mark.e2e
def test_a_killed_clients_segment_is_removed():
    """SIGKILL leaves no time to clean up: Python's resource tracker (its own process) unlinks the segment."""
    code = textwrap.dedent(
        """
        import os, signal, sys
        from collapipe_flwr.fl.dataplane.shm import ClientSegment
        segment = ClientSegment(1 << 16)
        print(segment.name, flush=True)
        sys.stdin.readline()
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    name = proc.stdout.readline().strip()
    assert (SHM_DIR / name).exists()
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 20
    while (SHM_DIR / name).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (SHM_DIR / name).exists()


def _segment_of_a_killed_group() -> str:
    """The name of a segment whose CU (a new session: its own process group) was killed with its whole group."""
    code = textwrap.dedent(
        """
        import sys
        from multiprocessing import resource_tracker
        from collapipe_flwr.fl.dataplane.shm import ClientSegment
        segment = ClientSegment(1 << 16)
        segment.write(b"step" * 100)
        resource_tracker.unregister(segment.shm._name, "shared_memory")
        print(segment.name, flush=True)
        sys.stdin.readline()
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.getcwd(),
        start_new_session=True,
    )
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith(f"{shm.PREFIX}{proc.pid}-") and (SHM_DIR / name).exists()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    return name


@pytest.mark.e2e
def test_a_segment_left_by_a_killed_process_group_is_removed_when_the_next_host_starts():
    """SIGKILL to the CU's whole process group (its resource tracker included, as a container stop) leaves the
    segment in /dev/shm; the next decoder host on this machine unlinks it at its start.

    One CI run found the segment gone 0.5 s after the kill. Two things can take it first: the dying CU's resource
    tracker (woken by the CU's closed pipe before the kernel, sending the group its SIGKILLs one process after
    another, reached it), and a decoder host that another test process (pytest-xdist) starts in that moment, whose
    own sweep removes it. So the CU takes its segment off its tracker first (the state a tracker that died first
    leaves), and a segment some other sweep took before this host started is made again, a few times at most."""
    for _ in range(5):
        name = _segment_of_a_killed_group()
        if (SHM_DIR / name).exists():
            break
    assert (SHM_DIR / name).exists(), "the killed CU's segment stays until a host sweeps it"
    served = Served(TokenHead(), max_len=MAX_LEN, max_abs_activation=MAX_ABS)  # starts a host
    try:
        assert not (SHM_DIR / name).exists()
    finally:
        served.host.stop(grace_s=0)


@pytest.mark.e2e
def test_the_sweep_removes_only_segments_whose_creator_is_gone(tmp_path):
    dead, alive = dead_pid(), os.getpid()
    names = {
        "dead": shm.segment_name(dead),
        "alive": shm.segment_name(alive),
        "no_pid": shm.PREFIX + "0123456789abcdef",  # a segment named before the pid was in the name
        "other": f"psm_{dead}-abc",  # not this data plane's
        "no_rest": f"{shm.PREFIX}{dead}-",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    assert shm.remove_stale(tmp_path) == [names["dead"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "dead")
    assert shm.remove_stale(tmp_path / "missing") == []


def test_no_room_in_dev_shm_means_inline(served, monkeypatch):
    monkeypatch.setattr("collapipe_flwr.fl.dataplane.client.shm_room_for", lambda size: False)
    z, mbs = make_step(8)
    with served.client(0, shared_memory="auto") as client:
        client(z, mbs)
        assert client._use_shm is False and client._segment is None


def test_off_keeps_frames_inline_and_a_bad_mode_is_named(served):
    assert served.client(0, shared_memory="off")._use_shm is False
    with pytest.raises(DataPlaneError, match="dataplane.shared_memory='on' must be one of auto, off"):
        served.client(0, shared_memory="on")


def test_a_pointer_naming_more_than_the_cap_is_refused_before_anything_is_read():
    """Eight 250 MB frames through shared memory took the server to a 3.4 GB peak: the size a pointer names is
    checked against the host's message cap before the segment is attached or a byte is copied."""
    segment = shm.ClientSegment(1 << 16)
    try:
        host_side = shm.HostSegments(max_bytes=1 << 12)
        with pytest.raises(DataPlaneError, match="at most 4096 bytes"):
            host_side.read(segment.name, 250 * 2**20)
        with pytest.raises(DataPlaneError, match="at most 4096 bytes"):  # also before a missing segment is opened
            host_side.read("psm_never_made", 250 * 2**20)
        assert host_side._open == {}  # nothing attached
        host_side.close()
    finally:
        segment.close()
    # through a host with the task-sized cap (4 MB): a forged pointer of 250 MB is one error frame naming the
    # cap, and the CU is served after it
    from collapipe_flwr.fl.dataplane.wire import decode_frame

    served = Served(TokenHead(), max_len=MAX_LEN, max_message_mb=4)
    try:
        z, mbs = make_step(8)
        with served.client(0, shared_memory="auto") as client:
            client(z, mbs)  # a real step: the stream and the client's segment exist
            pointer = encode_frame({"kind": "shm", "name": client._segment.name, "size": 250 * 2**20}, [])
            meta = decode_frame(client._exchange(pointer))[0]
            assert meta["kind"] == "error" and "max_message_mb" in meta["message"]
        with served.client(0) as again:
            again(*make_step(9))
    finally:
        served.host.stop(grace_s=0)
