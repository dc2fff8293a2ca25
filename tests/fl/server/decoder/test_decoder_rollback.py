"""A CU's aborted attempt leaves no trace in the server's decoder (issues 63 and 67).

A CU that loses a device mid-round re-plans and trains the round again; its first step of the fresh attempt is
marked ``restart`` and the host takes the cluster's earlier steps of the round out of the decoder
(``fl/server/decoder/journal.py``). References, none of them the host's own code:
- the decoder trained by hand with ``head_step`` on the steps an uninterrupted round would have sent (the other
  clusters' in their order, the re-planned cluster's fresh attempt numbered 1, 2, ... for the lr clock): the
  host's head, its optimizer state and every reply equal it bit for bit;
- the snapshot: after a restart with no other cluster in the round the weights and Adam's moments are those of the
  round's start, bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch

from collapipe_flwr.errors import DataPlaneError
from collapipe_flwr.fl.dataplane.auth import cluster_key
from collapipe_flwr.fl.dataplane.client import DecoderClient, DecoderClientSpec
from collapipe_flwr.fl.dataplane.protocol import (
    decode_step_request,
    part_request_frame,
    restarting,
    step_request_frame,
)
from collapipe_flwr.fl.server.decoder.host import DecoderHost, DecoderHostSpec
from collapipe_flwr.fl.server.decoder.journal import JOINT, WHOLE, RoundJournal
from collapipe_flwr.pipeline.head import head_step
from tests.fl.server.decoder.test_decoder_update import H, _micro_batch
from tests.fl.server.decoder.test_decoder_update import TokenHead as PlainTokenHead


class TokenHead(PlainTokenHead):
    """The token classifier, also counting its targets before a forward (what 1F1B parts need)."""

    def target_count(self, attention_mask, batch):
        return (batch["labels"] != -100).sum()


def lr_factor(round_: int, seq: int) -> float:
    """A clock whose factor differs per step, so a step numbered wrongly after a restart shows."""
    return 1.0 / seq


def host_for(head: TokenHead) -> tuple[DecoderHost, torch.optim.Optimizer]:
    optimizer = torch.optim.Adam(head.parameters(), lr=0.01)
    spec = DecoderHostSpec(hidden_size=H, bind="127.0.0.1")
    return DecoderHost(head, optimizer, "s", spec, lr_factor_of=lr_factor), optimizer


def client(host: DecoderHost, cluster: int) -> DecoderClient:
    return DecoderClient(host.address, cluster_key("s", 1, cluster), 1, cluster, DecoderClientSpec(timeout_s=30))


def step_data(cluster: int, step: int) -> tuple[list[torch.Tensor], list[dict]]:
    pairs = [_micro_batch(1000 * cluster + 10 * step + i, 2, 3) for i in range(2)]
    return [z for z, _ in pairs], [mb for _, mb in pairs]


def by_hand(head: TokenHead, steps: list[tuple[int, int]]) -> tuple[TokenHead, torch.optim.Optimizer, list]:
    """The decoder an uninterrupted round leaves: ``steps`` = (cluster, its step number 1..) in order, each one
    ``head_step`` at lr 0.01 / step number; returns the head, its optimizer and each step's (loss, grads)."""
    head = copy.deepcopy(head)
    optimizer = torch.optim.Adam(head.parameters(), lr=0.01)
    out = []
    for cluster, number in steps:
        optimizer.param_groups[0]["lr"] = 0.01 * lr_factor(1, number)
        z, mbs = step_data(cluster, number)
        out.append(head_step(head, optimizer, [t.clone() for t in z], mbs))
    return head, optimizer, out


def assert_same_decoder(head, optimizer, ref_head, ref_optimizer) -> None:
    for (name, p), q in zip(head.state_dict().items(), ref_head.state_dict().values()):
        assert torch.equal(p, q), name
    mine, ref = optimizer.state_dict()["state"], ref_optimizer.state_dict()["state"]
    assert mine.keys() == ref.keys()
    for i in mine:
        for key in mine[i]:
            assert torch.equal(torch.as_tensor(mine[i][key]), torch.as_tensor(ref[i][key])), (i, key)


def run_round(
    head: TokenHead, events: list[tuple[int, int | None]], parts: bool = False
) -> tuple[TokenHead, torch.optim.Optimizer, list]:
    """One round on a fresh host over loopback for a copy of ``head``: ``events`` = (cluster, its step number) sent
    in order, (cluster, None) a restart of that cluster's attempt; ``parts``: cluster 0 sends its steps as 1F1B
    parts. Returns the head, its optimizer and the replies."""
    head = copy.deepcopy(head)
    host, optimizer = host_for(head)
    host.start()
    replies = []
    try:
        host.open_round(1, [0, 1])
        clients = {0: client(host, 0), 1: client(host, 1)}
        for cluster, number in events:
            if number is None:
                clients[cluster].restart_attempt()
            elif parts and cluster == 0:
                replies.append(in_parts(clients[cluster], *step_data(cluster, number)))
            else:
                replies.append(clients[cluster](*step_data(cluster, number)))
        for c in clients.values():
            c.close()
        host.close_round()
    finally:
        host.stop()
    return head, optimizer, replies


def in_parts(head: DecoderClient, z: list[torch.Tensor], mbs: list[dict]) -> tuple[float, list[torch.Tensor]]:
    """One step as m part requests (pipeline.schedule: 1f1b)."""
    head.begin_step(mbs)
    grads = [head.micro_step(i, zi) for i, zi in enumerate(z)]
    return head.end_step(), grads


UNINTERRUPTED = [(1, 1), (1, 2), (0, 1), (1, 3), (0, 2)]
# cluster 0's first attempt sends its steps 1 and 2, then a device dies and it starts the round again
INTERRUPTED = [(0, 1), (1, 1), (0, 2), (1, 2), (0, None), (0, 1), (1, 3), (0, 2)]


@pytest.mark.parametrize("parts", [False, True], ids=["gpipe", "1f1b-parts"])
def test_a_restarted_cluster_leaves_the_decoder_as_an_uninterrupted_round_would(parts):
    torch.manual_seed(0)
    start = TokenHead()
    head, optimizer, replies = run_round(start, INTERRUPTED, parts)
    ref_head, ref_optimizer, ref_replies = run_round(start, UNINTERRUPTED, parts)
    assert_same_decoder(head, optimizer, ref_head, ref_optimizer)  # bit for bit
    for (loss, grads), (ref_loss, ref_grads) in zip(replies[-3:], ref_replies[-3:]):
        assert loss == ref_loss and all(torch.equal(g, r) for g, r in zip(grads, ref_grads))
    # and both equal the decoder trained by hand on the uninterrupted round's steps (float32 tolerance)
    hand, _, hand_replies = by_hand(start, UNINTERRUPTED)
    for p, q in zip(head.parameters(), hand.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    for (loss, _), (hand_loss, _) in zip(replies[-3:], hand_replies[-3:]):
        assert loss == pytest.approx(hand_loss, rel=1e-6)


def test_without_the_restart_mark_the_aborted_steps_stay_in_the_decoder():
    """The check above can fail: the same round with the restart mark left out differs from the uninterrupted one."""
    torch.manual_seed(0)
    start = TokenHead()
    head, _, _ = run_round(start, [e for e in INTERRUPTED if e[1] is not None])
    ref_head, _, _ = run_round(start, UNINTERRUPTED)
    assert not torch.equal(head.proj.weight, ref_head.proj.weight)


def test_a_restart_alone_in_its_round_puts_the_decoder_back_to_the_rounds_start_bit_for_bit():
    torch.manual_seed(1)
    head = TokenHead()
    optimizer = torch.optim.Adam(head.parameters(), lr=0.01)
    journal = RoundJournal()
    for earlier in (5, 6):  # two earlier rounds: Adam has moments and a step count, the journal its copies
        journal.open(head, optimizer, [0])
        for number in (1, 2):
            head_step(head, optimizer, *step_data(earlier, number))
        journal.close()
    at_start = copy.deepcopy(head.state_dict()), copy.deepcopy(optimizer.state_dict())
    journal.open(head, optimizer, [0])  # copied into the last round's copies
    for number in (1, 2, 3):  # the attempt that a lost device cuts short
        head_step(head, optimizer, *step_data(0, number))
    assert not torch.equal(head.proj.weight, at_start[0]["proj.weight"])
    assert journal.restart(1, 0, 4, head, optimizer) == []  # nothing of another cluster to apply again
    for name, p in head.state_dict().items():
        assert torch.equal(p, at_start[0][name]), name
    for i, state in optimizer.state_dict()["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(at_start[1]["state"][i][key])), (i, key)
    assert journal.step_of(1, 0, 4) == 1 and journal.step_of(1, 0, 6) == 3 and journal.step_of(1, 1, 4) == 4


def test_a_joint_update_is_kept_without_the_restarted_clusters_requests():
    journal = RoundJournal()
    head = TokenHead()
    journal.open(head, None, [0, 1, 2])
    reqs = [decode_step_request(step_request_frame("k", 1, c, 1, *step_data(c, 1)).tobytes()) for c in (0, 1, 2)]
    journal.record(JOINT, reqs, 1)
    (kept,) = journal.restart(1, 1, 2, head, None)
    assert kept.kind == JOINT and [r.cluster for r in kept.requests] == [0, 2] and kept.step == 1


def test_the_restart_mark_travels_on_a_step_and_part_0_only():
    z, mbs = step_data(0, 1)
    whole = decode_step_request(restarting(step_request_frame("k", 1, 0, 3, z, mbs)).tobytes())
    assert whole.restart and whole.seq == 3 and torch.equal(whole.z_enc[1], z[1])  # the tensors survive the mark
    assert not decode_step_request(step_request_frame("k", 1, 0, 3, z, mbs).tobytes()).restart
    part0 = decode_step_request(restarting(part_request_frame("k", 1, 0, 3, 0, z[0], mbs)).tobytes())
    assert part0.restart and part0.part == 0
    with pytest.raises(DataPlaneError, match="only a whole step or part 0"):
        decode_step_request(restarting(part_request_frame("k", 1, 0, 3, 1, z[1], mbs)).tobytes())


def test_kept_requests_survive_their_frame_buffer_and_reuse_the_last_rounds_memory():
    """The journal keeps copies, not the received frame (whose buffer the host may reuse or free), and a round's
    copies go into the buffers of the round before."""
    journal = RoundJournal()
    head = TokenHead()
    frames = [bytearray(step_request_frame("k", 1, c, 1, *step_data(c, 1)).tobytes()) for c in (0, 1)]
    journal.open(head, None, [0, 1])
    journal.record(WHOLE, [decode_step_request(frames[0])], 1)
    for frame in frames:  # the received buffers overwritten: a kept view would now read zeros
        frame[:] = bytes(len(frame))
    (kept,) = journal.restart(1, 1, 2, head, None)
    z, mbs = step_data(0, 1)
    assert all(torch.equal(a, b) for a, b in zip(kept.requests[0].z_enc, z))
    assert torch.equal(kept.requests[0].micro_batches[0]["labels"], mbs[0]["labels"])
    first = {t.untyped_storage().data_ptr() for t in kept.requests[0].z_enc}
    journal.open(head, None, [0, 1])  # the next round: the same shapes land in the same buffers
    journal.record(WHOLE, [decode_step_request(step_request_frame("k", 2, 0, 1, *step_data(0, 2)).tobytes())], 1)
    (again,) = journal.restart(2, 1, 2, head, None)
    assert {t.untyped_storage().data_ptr() for t in again.requests[0].z_enc} == first


def test_a_round_of_one_cluster_keeps_no_requests():
    journal = RoundJournal()
    head = TokenHead()
    journal.open(head, None, [3])
    journal.record(WHOLE, [decode_step_request(step_request_frame("k", 1, 3, 1, *step_data(3, 1)).tobytes())], 1)
    assert journal._applied == []  # nothing another cluster's restart could need
