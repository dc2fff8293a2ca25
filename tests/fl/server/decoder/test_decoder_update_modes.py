"""``federation.decoder_update`` picked once as a DecoderUpdate (fl/server/decoder/update_modes.py): each mode's
class, which refuse 1F1B parts, and how a step reaches the decoder (alone, or as its share of a joint step)."""

from __future__ import annotations

import pytest
import torch

from collapipe_flwr.config.sections import DecoderUpdateMode
from collapipe_flwr.fl.dataplane.protocol import StepRequest
from collapipe_flwr.fl.server.decoder.update_modes import MODES, Joint, Ordered, PerCu, update_mode


def _request(cluster: int, seq: int = 1) -> StepRequest:
    return StepRequest("k", 1, cluster, seq, [torch.zeros(1, 2, 4)], [{}], "float32")


def _never(*_):
    raise AssertionError("a joint step ran for a per-CU mode")


def test_every_configurable_mode_has_its_class():
    assert set(MODES) == set(DecoderUpdateMode)
    kinds = {name: type(update_mode(name, _never, 1.0)) for name in DecoderUpdateMode}
    assert kinds == {"per_cu": PerCu, "ordered": Ordered, "joint": Joint}
    assert [update_mode(n, _never, 1.0).whole_steps_only for n in ("per_cu", "ordered", "joint")] == [0, 1, 1]
    with pytest.raises(ValueError, match="not one of"):
        update_mode("sometimes", _never, 1.0)


@pytest.mark.parametrize("name", ["per_cu", "ordered"])
def test_a_per_cu_step_runs_alone(name):
    mode = update_mode(name, _never, 1.0)
    mode.open_round(1, [0])
    assert mode.apply(_request(0), lambda req: f"alone {req.cluster}", _never) == "alone 0"
    mode.close_round()


def test_a_joint_step_answers_each_cluster_with_its_share_and_a_left_out_one_alone():
    ran: list[list[int]] = []

    def run_step(reqs):
        ran.append([r.cluster for r in reqs])
        return {r.cluster: (float(r.cluster), []) for r in reqs}

    mode = update_mode("joint", run_step, 0.05)
    mode.open_round(1, [0, 1])
    joined = lambda req, share: f"joint {req.cluster} loss {share[0]}"  # noqa: E731
    # cluster 1 never comes: after the timeout cluster 0's step runs without it, and cluster 1 is left out
    assert mode.apply(_request(0), _never, joined) == "joint 0 loss 0.0" and ran == [[0]]
    assert mode.apply(_request(1), lambda req: "alone 1", joined) == "alone 1"
    mode.close_round()
