"""``federation.decoder_update: ordered``: one decoder update per CU step (as ``per_cu``), applied in cluster order
(step seq of cluster 0, 1, 2, then step seq + 1), whatever order the requests arrive in.

- the served head equals a head trained by hand applying the steps in cluster order, with requests arriving
  scrambled (threads started in reverse order, lower clusters delayed); each CU's replies match the reference's;
- two runs give bit-identical decoders whatever the arrival order;
- a cluster that never arrives is left out after the timeout; one that finished early (its stream ended) or
  whose step was refused after its id was claimed holds nobody up;
- the config: ``ordered`` is a choice, refused with 1F1B, and the simulation runs every CU at once for it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import pytest
import torch

from collapipe_flwr.config import compose, load_run_config
from collapipe_flwr.errors import ConfigError, DataPlaneError
from collapipe_flwr.experiments.job import build_job
from collapipe_flwr.fl.dataplane.auth import cluster_key
from collapipe_flwr.fl.dataplane.client import DecoderClient, DecoderClientSpec
from collapipe_flwr.fl.server.decoder.host_spec import DecoderHostSpec
from collapipe_flwr.fl.server.decoder.ordered import OrderedSteps
from tests.dataplane_helpers import run_cus_then_stop
from tests.fl.server.decoder.test_decoder_update import H, TokenHead, _micro_batch, adam_host

STEPS = 3


def _data(clusters, steps: int = STEPS) -> dict[int, list[list[tuple]]]:
    """Per cluster, per step, two micro-batches; clusters differ in batch size and labelled tokens."""
    return {
        c: [[_micro_batch(100 * c + 10 * s + i, 2 + c % 2, 2 + c) for i in range(2)] for s in range(steps)]
        for c in clusters
    }


def _serve(data, delays: dict[int, float], lock_timeout_s: float = 30.0, seed: int = 0, transport: str = "grpc"):
    """Train a fresh head (seeded) on ``data`` through an ordered host; CU threads are started in reverse
    cluster order, CU n waiting ``delays[n]`` s before each step. Returns (head, host, replies per cluster)."""
    torch.manual_seed(seed)
    head = TokenHead()
    host = adam_host(head, decoder_update="ordered", lock_timeout_s=lock_timeout_s, transport=transport)
    host.start()
    clusters = sorted(data)
    host.open_round(1, clusters)
    replies: dict[int, list] = {c: [] for c in clusters}
    errors: list[BaseException] = []

    def cu(c: int) -> None:
        spec = DecoderClientSpec(timeout_s=30, transport=transport)
        client = DecoderClient(host.address, cluster_key("s", 1, c), round=1, cluster=c, spec=spec)
        try:
            for step in data[c]:
                time.sleep(delays.get(c, 0.0))
                replies[c].append(client([z for z, _ in step], [mb for _, mb in step]))
        except BaseException as err:  # noqa: BLE001 - surfaced by the test
            errors.append(err)
        finally:
            client.close()

    run_cus_then_stop(host, cu, [(c,) for c in reversed(clusters)], 60)
    assert not errors, errors
    return head, host, replies


@pytest.mark.parametrize("transport", ["grpc", "socket"])
def test_ordered_update_equals_the_steps_applied_by_hand_in_cluster_order(transport):
    clusters = (0, 1, 2)
    data = _data(clusters)
    # arrival scrambled: cluster 2 starts first and never waits, cluster 0 arrives last for every step
    head, host, replies = _serve(data, delays={0: 0.15, 1: 0.05, 2: 0.0}, transport=transport)
    torch.manual_seed(0)
    reference = TokenHead()
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.01)
    for s in range(STEPS):
        for c in clusters:  # the reference: one Adam step per CU step, cluster 0, 1, 2, then the next step
            zs = [z.clone().requires_grad_(True) for z, _ in data[c][s]]
            ref_opt.zero_grad()
            sums, counts = zip(
                *(reference.loss_terms(z, mb["attention_mask"], mb) for z, (_, mb) in zip(zs, data[c][s]))
            )
            loss = sum(sums) / sum(counts)
            loss.backward()
            ref_opt.step()
            got_loss, got_grads = replies[c][s]
            assert got_loss == pytest.approx(loss.item(), rel=1e-5)
            for i in range(2):
                torch.testing.assert_close(got_grads[i], zs[i].grad, rtol=1e-5, atol=1e-7)
    for name, p in head.named_parameters():
        torch.testing.assert_close(p.detach(), dict(reference.named_parameters())[name].detach(), rtol=1e-5, atol=1e-7)
    assert host.served_order == [(1, c, s) for s in range(1, STEPS + 1) for c in clusters]


def test_two_runs_give_bit_identical_decoders_whatever_the_arrival_order():
    data = _data((0, 1, 2))
    first, _, first_replies = _serve(data, delays={0: 0.1, 1: 0.0, 2: 0.05})
    second, _, second_replies = _serve(data, delays={0: 0.0, 1: 0.1, 2: 0.0})
    for (name, p), q in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(p, q), name
    for c in first_replies:
        for (loss_a, grads_a), (loss_b, grads_b) in zip(first_replies[c], second_replies[c]):
            assert loss_a == loss_b and all(torch.equal(a, b) for a, b in zip(grads_a, grads_b))


@dataclass
class _Req:
    round: int
    cluster: int
    seq: int


def test_a_cluster_that_never_arrives_is_left_out_after_the_timeout(caplog):
    steps = OrderedSteps(timeout_s=0.3)
    steps.open_round(1, [0, 1, 2])
    ran: list[tuple[int, int]] = []

    def step(c: int, s: int) -> None:
        with steps.turn(_Req(1, c, s)) as in_order:
            assert in_order
            ran.append((c, s))

    start = time.monotonic()
    step(0, 1)
    step(2, 1)  # cluster 1 never sends step 1: cluster 2 waits the timeout, then goes on without it
    assert time.monotonic() - start >= 0.25 and steps.dropped == {1}
    step(0, 2)
    step(2, 2)  # no more waiting for the dropped cluster
    assert time.monotonic() - start < 1.0 and ran == [(0, 1), (2, 1), (0, 2), (2, 2)]
    with steps.turn(_Req(1, 1, 3)) as in_order:  # it comes back late: served at once, out of the order
        assert not in_order
    assert sum("left out of the cluster order" in r.getMessage() for r in caplog.records) == 1


def test_a_silent_cluster_is_left_out_on_the_host_and_the_others_complete():
    data = _data((0, 2))
    head = TokenHead()
    host = adam_host(head, decoder_update="ordered", lock_timeout_s=0.3)
    host.start()
    host.open_round(1, [0, 1, 2])  # cluster 1 is selected but its CU never sends a step

    def cu(c: int) -> None:
        spec = DecoderClientSpec(timeout_s=30)
        with DecoderClient(host.address, cluster_key("s", 1, c), round=1, cluster=c, spec=spec) as client:
            for step in data[c]:
                client([z for z, _ in step], [mb for _, mb in step])

    run_cus_then_stop(host, cu, [(2,), (0,)], 30)
    assert host.served_order == [(1, c, s) for s in range(1, STEPS + 1) for c in (0, 2)]


@pytest.mark.parametrize("transport", ["grpc", "socket"])
def test_a_cluster_that_finished_early_or_had_a_step_refused_holds_nobody_up(transport):
    """Cluster 0 sends 2 steps, its second one refused after its id was claimed (wrong width), then closes its
    client (the stream's clean end takes it out of the order); cluster 1 sends 4. With a 30 s timeout, any wait
    for cluster 0's refused or missing steps would show."""
    data = _data((0, 1), steps=4)
    head = TokenHead()
    host = adam_host(head, decoder_update="ordered", lock_timeout_s=30.0, transport=transport)
    host.start()
    host.open_round(1, [0, 1])
    refused: list[str] = []

    def cu(c: int, steps: int) -> None:
        key = cluster_key("s", 1, c)
        spec = DecoderClientSpec(timeout_s=30, transport=transport)
        with DecoderClient(host.address, key, round=1, cluster=c, spec=spec) as client:
            for s, step in enumerate(data[c][:steps]):
                zs = [z for z, _ in step]
                if c == 0 and s == 1:
                    zs = [torch.zeros(*z.shape[:-1], H + 1) for z in zs]
                try:
                    client(zs, [mb for _, mb in step])
                except DataPlaneError as err:
                    refused.append(str(err))

    start = time.monotonic()
    run_cus_then_stop(host, cu, [(1, 4), (0, 2)], 30)
    assert time.monotonic() - start < 10.0 and len(refused) == 1 and "shape" in refused[0]
    assert host._last_seq[(1, 0)] == (2, 2)  # the refused step 2 had claimed its id: it can never come again
    assert host.served_order == [(1, 0, 1), (1, 1, 1), (1, 1, 2), (1, 1, 3), (1, 1, 4)]


def test_skipped_left_and_refused_in_turn_slots_resolve_at_once():
    """The turnstile alone, with a timeout no test would wait out: each way a slot resolves frees the next."""
    steps = OrderedSteps(timeout_s=30.0)
    steps.open_round(1, [0, 1, 2])
    start = time.monotonic()
    for c in (0, 1, 2):
        with steps.turn(_Req(1, c, 1)):
            pass
    with pytest.raises(DataPlaneError), steps.turn(_Req(1, 0, 2)):  # refused inside its turn (head untouched)
        raise DataPlaneError("the decoder could not run this step")
    steps.skip(1, 1, 2)  # cluster 1's step 2 refused after its id was claimed
    with steps.turn(_Req(1, 2, 2)) as in_order:
        assert in_order
    steps.leave(1, 0)  # cluster 0's client closed: its steps of the round are over
    for c in (1, 2):
        with steps.turn(_Req(1, c, 3)):
            pass

    # cluster 1 skips step id 4: its step 5, waiting for cluster 2's step 4, already resolves its own slot 4
    def step_5_of_cluster_1() -> None:
        with steps.turn(_Req(1, 1, 5)):
            pass

    late = threading.Thread(target=step_5_of_cluster_1)
    late.start()
    time.sleep(0.05)
    with steps.turn(_Req(1, 2, 4)):
        pass
    late.join(5)
    assert not late.is_alive()
    assert time.monotonic() - start < 1.0 and steps.left == {0} and steps.dropped == set()


def test_closing_the_round_refuses_a_step_waiting_for_its_turn():
    steps = OrderedSteps(timeout_s=30.0)
    steps.open_round(1, [0, 1])
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            with steps.turn(_Req(1, 1, 1)):
                pass
        except DataPlaneError as err:
            errors.append(err)

    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.1)
    steps.close_round()
    th.join(5)
    assert len(errors) == 1 and "closed while step 1 of cluster 1 waited" in str(errors[0])


def test_ordered_is_a_config_choice_refused_with_1f1b_and_runs_every_cu_at_once(data_dir, tmp_path):
    cfg = load_run_config(["federation=tiny", "federation.decoder_update=ordered"], data_dir=str(data_dir))
    assert cfg.federation.decoder_update == "ordered"
    with pytest.raises(
        ConfigError, match=r"^federation\.decoder_update='sorted' must be one of per_cu, joint, ordered$"
    ):
        load_run_config(["federation=tiny", "federation.decoder_update=sorted"], data_dir=str(data_dir))
    with pytest.raises(ConfigError, match=r"decoder_update=ordered .*set decoder_update=per_cu or schedule=gpipe$"):
        load_run_config(
            ["federation=tiny", "pipeline.schedule=1f1b", "federation.decoder_update=ordered"], data_dir=str(data_dir)
        )
    environ = {"COLLAPIPE_DATA_DIR": str(data_dir)}
    ordered = ["federation.decoder_update=ordered", "federation.num_clusters=5"]
    assert build_job(compose(ordered), [], tmp_path / "n", environ=environ).concurrent_cus == 5
    capped = build_job(compose([*ordered, "runtime.concurrent_cus=2"]), [], tmp_path / "o", environ=environ)
    assert capped.concurrent_cus == 2


def test_a_host_takes_one_known_decoder_update():
    with pytest.raises(DataPlaneError, match=r"decoder_update='both'; a decoder host updates one of per_cu, joint"):
        DecoderHostSpec(hidden_size=H, decoder_update="both")
