"""ServerOptimizer (Flower's FedAvg/FedAvgM/FedAdam/FedYogi/FedAdagrad) against a hand-written NumPy reference.

The reference follows the published formulas (Hsu et al. 2019 for FedAvgM, Reddi et al. 2021 "Adaptive
Federated Optimization" for FedAdam/FedYogi/FedAdagrad) in Flower's conventions: FedAvgM's momentum buffer
starts as the first pseudo-gradient, FedAdam's step size is bias-corrected with the server round t as
eta * sqrt(1 - beta_2^(t+1)) / (1 - beta_1^(t+1)), FedYogi/FedAdagrad use eta as is, moments start at zero.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from collapipe_flwr.errors import CollaPipeError, ConfigError
from collapipe_flwr.fl.server.aggregation.server_optimizer import SERVER_OPTIMIZERS, ServerOptimizer

SHAPES = {"embedding.weight": (7, 4), "encoder.0.attn.q.weight": (4, 4), "encoder.0.attn.q.bias": (4,)}
HYPER = {"lr": 0.3, "momentum": 0.8, "beta_2": 0.95, "tau": 1e-2}
ROUNDS = ([3.0, 5.0, 2.0], [7, 1])  # client weights (num-examples) of round 1 and round 2


class Reference:
    """Independent NumPy (float64) implementation of the five server optimizers."""

    def __init__(self, name: str, lr: float, momentum: float, beta_2: float, tau: float) -> None:
        self.name, self.lr, self.momentum, self.beta_2, self.tau = name, lr, momentum, beta_2, tau
        self.m: dict[str, np.ndarray] | None = None
        self.v: dict[str, np.ndarray] | None = None

    def step(self, t: int, x: dict[str, np.ndarray], clients: list[tuple[dict[str, np.ndarray], float]]):
        total = sum(w for _, w in clients)
        avg = {k: sum(state[k] * (w / total) for state, w in clients) for k in x}
        if self.name == "fedavg":
            return avg
        if self.name == "fedavgm":  # x <- x - lr * m,  m <- mu m + (x - avg)  (m = x - avg in the first round)
            g = {k: x[k] - avg[k] for k in x}
            self.m = g if self.m is None else {k: self.momentum * self.m[k] + g[k] for k in x}
            return {k: x[k] - self.lr * self.m[k] for k in x}
        d = {k: avg[k] - x[k] for k in x}
        b1 = 0.0 if self.name == "fedadagrad" else self.momentum
        b2 = self.beta_2
        m0 = self.m or {k: np.zeros_like(x[k]) for k in x}
        v0 = self.v or {k: np.zeros_like(x[k]) for k in x}
        self.m = {k: b1 * m0[k] + (1 - b1) * d[k] for k in x}
        if self.name == "fedadam":
            self.v = {k: b2 * v0[k] + (1 - b2) * d[k] ** 2 for k in x}
            eta = self.lr * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
        elif self.name == "fedyogi":
            self.v = {k: v0[k] - (1 - b2) * d[k] ** 2 * np.sign(v0[k] - d[k] ** 2) for k in x}
            eta = self.lr
        else:  # fedadagrad
            self.v = {k: v0[k] + d[k] ** 2 for k in x}
            eta = self.lr
        return {k: x[k] + eta * self.m[k] / (np.sqrt(self.v[k]) + self.tau) for k in x}


def _model(rng: np.random.Generator) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for k, s in SHAPES.items()}


def _clients(rng: np.random.Generator, current: dict[str, torch.Tensor], weights) -> list:
    return [
        ({k: t + torch.from_numpy(rng.normal(0.0, 0.5, t.shape).astype(np.float32)) for k, t in current.items()}, w)
        for w in weights
    ]


def _np(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: t.double().numpy() for k, t in state.items()}


def _assert_close(got: dict[str, torch.Tensor], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == torch.float32 and got[k].device.type == "cpu"
        np.testing.assert_allclose(got[k].double().numpy(), want[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("name", SERVER_OPTIMIZERS)
def test_two_rounds_match_the_hand_computation(name):
    rng = np.random.default_rng(1234)
    opt, ref = ServerOptimizer(name, **HYPER), Reference(name, **HYPER)
    current = _model(rng)
    for server_round, weights in enumerate(ROUNDS, start=1):
        results = _clients(rng, current, weights)
        want = ref.step(server_round, _np(current), [(_np(s), float(w)) for s, w in results])
        new = opt.step(server_round, current, results)
        _assert_close(new, want)
        assert not all(torch.equal(new[k], current[k]) for k in current)
        current = new


def test_fedavgm_with_other_hyper_parameters():
    rng = np.random.default_rng(7)
    hyper = {"lr": 0.7, "momentum": 0.5, "beta_2": 0.5, "tau": 1.0}
    opt, ref = ServerOptimizer("fedavgm", **hyper), Reference("fedavgm", **hyper)
    current = _model(rng)
    for server_round, weights in enumerate(([1, 4], [2, 2, 9]), start=1):
        results = _clients(rng, current, weights)
        want = ref.step(server_round, _np(current), [(_np(s), float(w)) for s, w in results])
        current = opt.step(server_round, current, results)
        _assert_close(current, want)


def test_hyper_parameters_reach_flowers_strategy():
    from flwr.serverapp.strategy import FedAdagrad, FedAdam, FedAvg, FedAvgM, FedYogi

    assert type(ServerOptimizer("fedavg").strategy) is FedAvg
    avgm = ServerOptimizer("fedavgm", lr=0.5, momentum=0.7).strategy
    assert type(avgm) is FedAvgM and (avgm.server_learning_rate, avgm.server_momentum) == (0.5, 0.7)
    for name, cls in (("fedadam", FedAdam), ("fedyogi", FedYogi)):
        s = ServerOptimizer(name, **HYPER).strategy
        assert type(s) is cls and (s.eta, s.beta_1, s.beta_2, s.tau) == (0.3, 0.8, 0.95, 1e-2)
    s = ServerOptimizer("fedadagrad", **HYPER).strategy
    assert type(s) is FedAdagrad and (s.eta, s.beta_1, s.beta_2, s.tau) == (0.3, 0.0, 0.0, 1e-2)


@pytest.mark.parametrize("name", SERVER_OPTIMIZERS)
def test_moments_persist_over_rounds(name):
    rng = np.random.default_rng(5)
    current = _model(rng)
    round1, round2 = _clients(rng, current, ROUNDS[0]), None
    opt = ServerOptimizer(name, **HYPER)
    after1 = opt.step(1, current, round1)
    round2 = _clients(rng, after1, ROUNDS[1])
    kept = opt.step(2, after1, round2)
    fresh = ServerOptimizer(name, **HYPER).step(2, after1, round2)
    same = all(torch.equal(kept[k], fresh[k]) for k in kept)
    assert same == (name == "fedavg")  # only FedAvg has no state


def test_fedavg_is_the_example_weighted_mean():
    rng = np.random.default_rng(3)
    current = _model(rng)
    results = _clients(rng, current, [1, 3])
    new = ServerOptimizer("fedavg", lr=123.0).step(4, current, results)
    for k in current:
        want = (results[0][0][k].double() * 1 + results[1][0][k].double() * 3) / 4
        np.testing.assert_allclose(new[k].double().numpy(), want.numpy(), rtol=1e-6, atol=1e-7)


def _with_buffers(state: dict[str, torch.Tensor], batches: int) -> dict[str, torch.Tensor]:
    out = dict(state)
    out["encoder.0.position_ids"] = torch.arange(5)
    out["norm.num_batches_tracked"] = torch.tensor(batches)
    out["mask"] = torch.tensor([True, False, True])
    out["head.weight64"] = torch.linspace(-1, 1, 6, dtype=torch.float64).reshape(2, 3)
    out["head.weight_bf16"] = torch.linspace(-1, 1, 4).to(torch.bfloat16)
    return out


@pytest.mark.parametrize("name", ["fedadam", "fedavgm"])
def test_integer_buffers_are_not_optimised_and_dtypes_are_kept(name):
    rng = np.random.default_rng(11)
    current = _with_buffers(_model(rng), batches=10)
    clients = [(_with_buffers(s, batches=12), w) for s, w in _clients(rng, _model(rng), [3, 5, 2])]
    new = ServerOptimizer(name, **HYPER).step(1, current, clients)
    assert list(new) == list(current)
    for k, t in current.items():
        assert new[k].dtype == t.dtype and new[k].shape == t.shape and new[k].device.type == "cpu", k
    assert torch.equal(new["encoder.0.position_ids"], torch.arange(5))
    assert torch.equal(new["norm.num_batches_tracked"], torch.tensor(12))  # the clients' value, not x + update
    assert torch.equal(new["mask"], torch.tensor([True, False, True]))
    # differing integer values: the example-weighted mean, rounded: (3*10 + 5*20 + 2*31) / 10 = 19.2 -> 19
    for (state, _), batches in zip(clients, (10, 20, 31)):
        state["norm.num_batches_tracked"] = torch.tensor(batches)
    new = ServerOptimizer(name, **HYPER).step(1, current, clients)
    assert torch.equal(new["norm.num_batches_tracked"], torch.tensor(19))


def test_low_and_high_precision_floats_follow_the_reference():
    rng = np.random.default_rng(13)
    current = _with_buffers(_model(rng), batches=1)
    clients = [(_with_buffers(s, batches=1), w) for s, w in _clients(rng, current, [2, 1])]
    for state, _ in clients:
        state["head.weight64"] = state["head.weight64"] + torch.from_numpy(rng.standard_normal((2, 3)))
    floats = [k for k, t in current.items() if t.is_floating_point()]
    ref = Reference("fedadam", **HYPER)
    want = ref.step(
        1,
        {k: current[k].double().numpy() for k in floats},
        [({k: s[k].double().numpy() for k in floats}, float(w)) for s, w in clients],
    )
    new = ServerOptimizer("fedadam", **HYPER).step(1, current, clients)
    np.testing.assert_allclose(new["head.weight64"].numpy(), want["head.weight64"], rtol=1e-12)
    np.testing.assert_allclose(new["head.weight_bf16"].double().numpy(), want["head.weight_bf16"], rtol=1e-2, atol=1e-2)


def test_step_is_silent_and_leaves_its_inputs_alone():
    rng = np.random.default_rng(17)
    current = _with_buffers(_model(rng), batches=3)
    for k in SHAPES:
        current[k].requires_grad_(True)
    clients = [(_with_buffers(s, batches=4), w) for s, w in _clients(rng, _model(rng), [1, 2])]
    saved_current = {k: t.detach().clone() for k, t in current.items()}
    saved_clients = [{k: t.clone() for k, t in s.items()} for s, _ in clients]
    opt = ServerOptimizer("fedyogi", **HYPER)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = opt.step(1, current, clients)
    assert all(not t.requires_grad for t in new.values())
    assert all(torch.equal(current[k].detach(), saved_current[k]) for k in current)
    for (state, _), saved in zip(clients, saved_clients):
        assert all(torch.equal(state[k], saved[k]) for k in state)


def test_unknown_name_and_bad_hyper_parameters_are_config_errors():
    with pytest.raises(ConfigError) as err:
        ServerOptimizer("adam")
    assert all(name in str(err.value) for name in SERVER_OPTIMIZERS)
    for kwargs in ({"lr": 0.0}, {"lr": float("nan")}, {"momentum": 1.0}, {"beta_2": -0.1}, {"tau": 0.0}):
        with pytest.raises(ConfigError):
            ServerOptimizer("fedadam", **kwargs)
    with pytest.raises(ConfigError):
        ServerOptimizer("fedavgm", momentum=-0.5)
    ServerOptimizer("fedavg", lr=-1.0)  # FedAvg uses no hyper-parameter
    ServerOptimizer("fedadagrad", momentum=5.0)  # nor does FedAdagrad use momentum


def _bad_inputs(current, results):
    """(server_round, current, results, expected text) tuples that must be refused."""
    first = dict(results[0][0])
    missing = {k: v for k, v in first.items() if k != "encoder.0.attn.q.bias"}
    extra = {**first, "extra.weight": torch.zeros(1)}
    reshaped = {**first, "encoder.0.attn.q.bias": torch.zeros(5)}
    yield 2, current, [], "no client results"
    yield 2, current, [(missing, 1.0), results[1]], "different parameter names"
    yield 2, current, [results[0], (extra, 1.0)], "different parameter names"
    yield 2, current, [(reshaped, 1.0), results[1]], "shape"
    for weight in (float("nan"), float("inf"), -1.0):
        yield 2, current, [results[0], (results[1][0], weight)], "finite"
    yield 2, current, [(results[0][0], "many"), results[1]], "not a number"
    yield 2, current, [(results[0][0], 0), (results[1][0], 0.0)], "sum to zero"
    yield 0, current, results, "server_round"
    yield 2, {}, results, "empty"


def test_bad_inputs_are_refused_before_anything_changes():
    rng = np.random.default_rng(19)
    current = _model(rng)
    round1 = _clients(rng, current, ROUNDS[0])
    opt, twin = ServerOptimizer("fedadam", **HYPER), ServerOptimizer("fedadam", **HYPER)
    after1 = opt.step(1, current, round1)
    assert all(torch.equal(after1[k], v) for k, v in twin.step(1, current, round1).items())
    round2 = _clients(rng, after1, ROUNDS[1])
    for server_round, cur, results, text in _bad_inputs(after1, round2):
        with pytest.raises(CollaPipeError) as err:
            opt.step(server_round, cur, results)
        assert text in str(err.value) and "\n" not in str(err.value)
    # a different model after the first round: its moments would not fit
    other = {**after1, "encoder.0.attn.q.bias": torch.zeros(6)}
    with pytest.raises(CollaPipeError, match="create a new ServerOptimizer"):
        opt.step(2, other, [({**s, "encoder.0.attn.q.bias": torch.zeros(6)}, w) for s, w in round2])
    # the refused calls left the moments as they were
    kept, want = opt.step(2, after1, round2), twin.step(2, after1, round2)
    assert all(torch.equal(kept[k], want[k]) for k in kept)
