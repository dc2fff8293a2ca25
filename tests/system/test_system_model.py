"""System model formulas (eqs. 10-16, 26, 28-29), the network config, round states and the FLOP count."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from torch import nn

from collapipe_flwr.config import CONF_DIR
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.system import channel, pipeline_model
from collapipe_flwr.system.convergence import ConvergenceParams, queue_update
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.state import RoundState, StateSampler
from collapipe_flwr.system.units import db_to_linear, dbm_to_watt
from collapipe_flwr.system.workload import RoundShape, Workload, measure_workload


def paper_network() -> dict:
    return yaml.safe_load((CONF_DIR / "network" / "paper_table2.yaml").read_text())


def test_units_by_hand():
    assert dbm_to_watt(-174.0) == pytest.approx(10 ** (-20.4))  # -174 dBm/Hz = 3.98e-21 W/Hz
    assert dbm_to_watt(30.0) == pytest.approx(1.0)
    assert db_to_linear(-30.0) == pytest.approx(1e-3)


def test_uplink_rate_delay_energy_by_hand():
    B, p, h, I, N0 = 5e5, 0.5, 0.9, 0.07, 4e-21
    rate = channel.shannon_rate(B, p, h, I, N0)
    assert rate == pytest.approx(B * math.log2(1 + p * h / (I + B * N0)))  # eq. (10)
    delay = channel.transfer_delay(8e6, rate)
    assert delay == pytest.approx(8e6 / rate)  # eq. (11)
    assert channel.transmit_energy(p, delay) == pytest.approx(0.5 * 8e6 / rate)  # eq. (12)
    assert channel.transfer_delay(1.0, 0.0) == math.inf


def test_pipeline_delay_and_energy_by_hand():
    # 3 stages, m = 4: (S + m - 1) * slowest chunk (eq. 15)
    assert pipeline_model.pipeline_delay([1.0, 3.0, 2.0], 3, 4) == pytest.approx(6 * 3.0)
    assert pipeline_model.micro_batch_size(64, 5) == 13
    e = pipeline_model.compute_energy(1e-28, 2, 16, 1e9, 20.0, 5e8, 4)
    assert e == pytest.approx(4 * 1e-28 * (2 * 16 * 1e9 / 20.0) * 5e8**2)  # eq. (16) with kappa
    assert pipeline_model.round_delay([1.0, 5.0], [2.0, 0.5]) == pytest.approx(5.5)  # eq. (26)


def test_gamma_and_queue_by_hand():
    c = ConvergenceParams(
        beta=2.0, eta=0.1, grad_bound=3.0, interference_c=0.5, gamma_max=0.01, num_clusters=4, num_blocks=12
    )
    expected = 2.0 * 0.01 / 8 * (9.0 / 12 * 16 + 0.5 / (0.4 * 0.9 + 0.07) + 9.0)  # eq. (28)
    assert c.gamma(4, 0.4, 0.9, 0.07) == pytest.approx(expected)
    assert queue_update([0.0, 1.0], [0.005, 0.02], 0.01).tolist() == pytest.approx([0.0, 1.01])  # eq. (29)
    with pytest.raises(ConfigError, match="gamma_max"):
        ConvergenceParams(1, 1, 1, 1, 0.0, 1, 1)


def test_network_from_paper_preset():
    spec = NetworkSpec.from_config(paper_network(), 3)
    assert (spec.num_clusters, spec.num_channels, spec.devices_per_cluster) == (3, 4, 6)
    assert all(4e5 <= b <= 6e5 for b in spec.channel_bandwidth_hz)
    devs = spec.devices_of(2)
    assert len(devs) == 6 and all(1e8 <= d.f_hz <= 8e8 and 10 <= d.flops_per_cycle <= 24 for d in devs)
    assert spec.noise_psd_w_hz == pytest.approx(10 ** (-20.4))
    assert spec == NetworkSpec.from_config(paper_network(), 3)  # same seed, same network
    with pytest.raises(ConfigError):
        spec.devices_of(3)


def edge_network() -> dict:
    return yaml.safe_load((CONF_DIR / "network" / "edge.yaml").read_text())


def test_memory_shares_size_every_device_to_the_model_and_leave_the_other_draws_alone():
    """gamma_k^max = gamma_rt + share_k x L gamma_0 (by hand), drawn where memory_bytes would be: f_k, phi_k, p_k
    unchanged."""
    net = edge_network()
    shared = NetworkSpec.from_config(net, 3)
    assert shared.needs_sizing
    device = {k: v for k, v in net["device"].items() if k != "memory_share"}
    absolute = dict(net, device={**device, "memory_bytes": [1e9, 2e9]})
    plain = NetworkSpec.from_config(absolute, 3)
    encoder = 115e6  # L gamma_0 of some model, bytes
    sized = shared.sized_to(encoder)
    assert not sized.needs_sizing and sized.sized_to(1.0) is sized  # absolute memories: nothing to size
    lo, hi = net["device"]["memory_share"]
    for n in range(3):
        for d_sized, d_plain, share in zip(sized.devices_of(n), plain.devices_of(n), shared.memory_share[n]):
            assert lo <= share <= hi
            assert d_sized.memory_bytes == pytest.approx(net["device"]["runtime_bytes"] + share * encoder)
            assert (d_sized.f_hz, d_sized.flops_per_cycle, d_sized.d2d_power_w) == (
                d_plain.f_hz,
                d_plain.flops_per_cycle,
                d_plain.d2d_power_w,
            )
    with pytest.raises(ConfigError, match="> 0"):
        shared.sized_to(0.0)


def test_an_unsized_network_is_refused_by_the_planner():
    from collapipe_flwr.dssra.cluster_model import ClusterModel

    spec = NetworkSpec.from_config(edge_network(), 2)
    state = StateSampler(spec, 0).sample(0)
    workload = Workload.paper_preset(num_blocks=3)
    with pytest.raises(ConfigError, match="sized_to"):
        ClusterModel.build(spec, state, workload, 0)
    model = ClusterModel.build(spec.sized_to(workload.encoder_memory_bytes), state, workload, 0)
    # share x L gamma_0 / gamma_0 blocks, floored: no device of a share < 1 holds all L = 3 blocks
    expected = [math.floor(s * 3) for s in spec.memory_share[0]]
    assert model.memory_cap.tolist() == expected and max(expected) < 3


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda n: n["device"].update(memory_share=[0.4, 0.9]), "exactly one of memory_bytes"),
        (lambda n: n["device"].pop("memory_bytes"), "exactly one of memory_bytes"),
        (lambda n: n.pop("num_channels"), "network.num_channels"),
        (lambda n: n.update(bogus=1), "network.bogus"),
        (lambda n: n["uplink"].update(fading="nakagami"), "network.uplink.fading"),
        (lambda n: n["device"].update(f_hz=[-1, 2]), "network.device.f_hz"),
        (lambda n: n["device"].update(d2d_power_w=0.5), "d2d_power_max_w"),
        (lambda n: n["d2d"].update(bandwidth_hz="wide"), "network.d2d.bandwidth_hz"),
        (lambda n: n["device"].update(availability=[0.5, 1.5]), "availability"),
    ],
)
def test_network_config_errors_name_the_key(edit, match):
    net = paper_network()
    edit(net)
    with pytest.raises(ConfigError, match=match) as err:
        NetworkSpec.from_config(net, 3)
    assert "\n" not in str(err.value)


def test_state_is_seeded_per_round_and_json_safe():
    spec = NetworkSpec.from_config(paper_network(), 3)
    a, b = StateSampler(spec, 7), StateSampler(spec, 7)
    assert a.sample(5) == b.sample(5)
    assert a.sample(5) != a.sample(6)
    s = a.sample(3)
    assert RoundState.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    g = s.gain_matrix()
    assert g.shape == (3, 4) and (g > 0).all()
    assert all(0.06 <= i <= 0.08 for i in s.uplink_interference_w)
    assert all(0.5 <= x <= 1.0 for row in s.availability for x in row)


class Block(nn.Module):
    def __init__(self, H: int, F: int, heads: int) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(H, heads, F, dropout=0.0, batch_first=True)

    def forward(self, hidden, attention_mask):
        return self.layer(hidden, src_key_padding_mask=attention_mask == 0)


def test_measured_flops_match_the_textbook_formula():
    torch.manual_seed(0)
    B, T, H, F, L = 3, 10, 32, 64, 2
    blocks = nn.ModuleList([Block(H, F, 4) for _ in range(L)])
    w = measure_workload(blocks, torch.randn(B, T, H), torch.ones(B, T, dtype=torch.long), round_shape=RoundShape(64))
    # per sample, 2 FLOPs per multiply-add: QKV + output projections 8TH^2, FFN 4THF, scores and A.V 4T^2H
    fwd = 8 * T * H * H + 4 * T * H * F + 4 * T * T * H
    # backward: twice the linear layers; attention as flash backward (recompute QK^T + 4 products) = 10T^2H
    bwd = 2 * (8 * T * H * H + 4 * T * H * F) + 10 * T * T * H
    assert w.forward_flops == (fwd, fwd)
    assert w.backward_flops == (bwd, bwd)
    params = 4 * H * H + 4 * H + 2 * H * F + F + H + 4 * H  # attention, FFN, two LayerNorms
    assert w.param_bytes == (4.0 * params,) * L
    assert w.boundary_bytes == (4.0 * T * H,) * (L + 1)
    assert w.batch_size == 64 and w.encoder_bytes == 4.0 * params * L
    assert w.uplink_bits() == 8 * (4.0 * T * H * 64 + 4.0 * params * L)
    assert all(s > 4.0 * T * H for s in w.saved_bytes)  # at least the block input is kept
    assert Workload.from_dict(json.loads(json.dumps(w.to_dict()))) == w


def test_paper_workload_preset():
    w = Workload.paper_preset()
    assert w.num_blocks == 12 and w.batch_size == 64
    assert w.forward_flops[0] == 2e6 and w.backward_flops[0] == 2e6
