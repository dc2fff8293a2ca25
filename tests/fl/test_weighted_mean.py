"""The one weighted mean (fl/weighted_mean.py) that the server folds CU replies with (WeightedSum) and a VanillaFL
CU averages its data users with (TreeMean), against a plain weighted mean written out in numpy: sum_n w_n x_n / W
per leaf, in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collapipe_flwr.errors import CollaPipeError
from collapipe_flwr.fl.weighted_mean import TreeMean, WeightedSum, tree_mean

WEIGHTS = [3.0, 5.0, 2.0]


def _plain(values, weights) -> np.ndarray:
    """The reference: sum_n w_n x_n / sum_n w_n, each x_n in float64."""
    xs = [np.asarray(v, dtype=np.float64) for v in values]
    return sum(w * x for w, x in zip(weights, xs)) / sum(weights)


def _user_state(rng: np.random.Generator, i: int) -> dict:
    """A data user's training state as the CU snapshots it: weights, and an Adam state dict (int parameter ids,
    a float ``step`` tensor, moments in float32 and bfloat16, the param_groups list), a float and a name."""

    def t(shape, dtype=torch.float32):
        return torch.tensor(rng.normal(size=shape), dtype=torch.float64).to(dtype)

    return {
        "weights": {"w": t((3, 2)), "b": t((2,), torch.float64), "position_ids": torch.arange(4)},
        "optimizer": {
            "state": {
                0: {"step": torch.tensor(float(3 + i)), "exp_avg": t((3, 2)), "exp_avg_sq": t((3, 2)).abs()},
                1: {"step": torch.tensor(float(3 + i)), "exp_avg": t((2,), torch.bfloat16)},
            },
            "param_groups": [{"lr": 0.1 * (i + 1), "params": [0, 1]}],
        },
        "scale": float(rng.uniform(0.5, 2.0)),
        "batches": torch.tensor(10 * (i + 1)),
        "name": f"user{i}",
    }


def test_tree_mean_is_the_plain_weighted_mean_leaf_by_leaf():
    states = [_user_state(np.random.default_rng(7 + i), i) for i in range(len(WEIGHTS))]
    out = tree_mean(states, WEIGHTS)

    def leaf(*path):
        values = []
        for s in states:
            for key in path:
                s = s[key]
            values.append(s.double().numpy() if torch.is_tensor(s) else s)
        return _plain(values, WEIGHTS)

    np.testing.assert_allclose(out["weights"]["w"].double().numpy(), leaf("weights", "w"), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(out["weights"]["b"].numpy(), leaf("weights", "b"), rtol=1e-14)
    for n, key in [(0, "step"), (0, "exp_avg"), (0, "exp_avg_sq")]:
        got = out["optimizer"]["state"][n][key].double().numpy()
        np.testing.assert_allclose(got, leaf("optimizer", "state", n, key), rtol=1e-6, atol=1e-7)
    bf16 = out["optimizer"]["state"][1]["exp_avg"]
    assert bf16.dtype == torch.bfloat16  # summed in float32, returned in its own dtype
    np.testing.assert_allclose(bf16.double().numpy(), leaf("optimizer", "state", 1, "exp_avg"), rtol=1e-2, atol=1e-2)
    assert out["scale"] == pytest.approx(float(leaf("scale")), rel=1e-14) and isinstance(out["scale"], float)
    # every tensor comes back in its own dtype
    assert out["weights"]["w"].dtype == torch.float32 and out["weights"]["b"].dtype == torch.float64
    # integers: the common value when all agree, else the weighted mean rounded (3*10 + 5*20 + 2*30) / 10 = 19
    assert torch.equal(out["weights"]["position_ids"], torch.arange(4))
    assert out["batches"].dtype == torch.int64 and out["batches"].item() == int(np.rint(leaf("batches")))
    # any other leaf is the first user's
    assert out["optimizer"]["param_groups"] == [{"lr": 0.1, "params": [0, 1]}] and out["name"] == "user0"


def test_the_server_and_a_cu_get_the_same_mean_of_the_same_states():
    rng = np.random.default_rng(3)
    states = [
        {
            "enc.w": torch.tensor(rng.normal(size=(4, 3)), dtype=torch.float32),
            "emb.w": torch.tensor(rng.normal(size=(5,)), dtype=torch.float16),
            "ids": torch.tensor([1, 2, 3 + i]),
        }
        for i in range(len(WEIGHTS))
    ]
    server: WeightedSum[str] = WeightedSum()
    for state, w in zip(states, WEIGHTS):
        server.add(state, w)
    cu = tree_mean(states, WEIGHTS)
    assert cu.keys() == server.means().keys()
    assert all(torch.equal(cu[k], v) and cu[k].dtype == v.dtype for k, v in server.means().items())
    np.testing.assert_allclose(cu["enc.w"].double().numpy(), _plain([s["enc.w"] for s in states], WEIGHTS), rtol=1e-6)


def test_a_tree_of_other_keys_is_refused_before_anything_changes():
    first = {"x": torch.ones(2), "opt": {"state": {}, "beta": 0.5}}
    running = TreeMean()
    running.add(first, 2.0)
    for other in (
        {"y": torch.ones(2), "opt": {"state": {}, "beta": 0.5}},
        {"x": torch.ones(2), "opt": {"beta": 0.5}},  # an empty dict missing is a different tree too
    ):
        with pytest.raises(ValueError, match="differ in their keys"):
            running.add(other, 1.0)
    with pytest.raises(CollaPipeError, match="is torch.float64"):  # the same keys, another dtype: WeightedSum's check
        running.add({"x": torch.ones(2, dtype=torch.float64), "opt": {"state": {}, "beta": 0.5}}, 1.0)
    running.add({"x": torch.full((2,), 4.0), "opt": {"state": {}, "beta": 2.0}}, 1.0)
    out = running.mean()
    torch.testing.assert_close(out["x"], torch.full((2,), 2.0))  # (2 * 1 + 1 * 4) / 3
    assert out["opt"] == {"state": {}, "beta": pytest.approx(1.0)}  # (2 * 0.5 + 2) / 3


def test_nothing_or_only_zero_weights_has_no_mean():
    with pytest.raises(ValueError, match="no data user"):
        TreeMean().mean()
    zero = TreeMean()
    zero.add({"x": torch.ones(1)}, 0.0)
    with pytest.raises(ValueError, match="no data user"):
        zero.mean()
    with pytest.raises(CollaPipeError, match="finite"):
        zero.add({"x": torch.ones(1)}, float("nan"))
