"""Privacy accounting (config/privacy_accounting.py, fl/server/privacy_ledger.py) against numbers computed here by
hand: RDP of the Gaussian mechanism, alpha / (2 z^2) per step, summed over T steps and converted to (epsilon, delta);
basic composition for local DP; the budget refusal at start-up; a short run's rounds.jsonl and summary.json."""

from __future__ import annotations

import json
import math

import pytest

from collapipe_flwr.config import PrivacySpec, load_run_config
from collapipe_flwr.config.privacy_accounting import (
    ALPHAS,
    central_entry,
    gaussian_epsilon,
    local_entry,
    local_noise_multiplier,
)
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.server.privacy_ledger import PrivacyLedger
from collapipe_flwr.fl.server.server_main import run_server
from tests.inprocess_grid import InProcessGrid


def _rdp(z: float, steps: int) -> list[float]:
    """RDP(alpha) of ``steps`` Gaussian mechanisms with noise multiplier z, q = 1: steps alpha / (2 z^2)."""
    return [steps * a / (2 * z * z) for a in ALPHAS]


def _classic(z: float, steps: int, delta: float) -> float:
    """Mironov 2017, Prop. 3: min_alpha RDP(alpha) + ln(1/delta) / (alpha - 1)."""
    return min(r + math.log(1 / delta) / (a - 1) for a, r in zip(ALPHAS, _rdp(z, steps)))


def _improved(z: float, steps: int, delta: float) -> float:
    """Balle et al. 2020, Thm. 21: min_alpha RDP(alpha) - (ln delta + ln alpha)/(alpha - 1) + ln((alpha - 1)/alpha)."""
    return min(
        r - (math.log(delta) + math.log(a)) / (a - 1) + math.log((a - 1) / a) for a, r in zip(ALPHAS, _rdp(z, steps))
    )


@pytest.mark.parametrize("z,steps,delta", [(1.0, 1, 1e-5), (1.0, 10, 1e-5), (0.5, 3, 1e-6), (4.0, 50, 1e-5)])
def test_central_epsilon_is_opacus_improved_conversion_and_below_the_classic(z, steps, delta):
    """Opacus converts RDP with the improved conversion: equal to it by hand (1e-6 relative), and the classic
    conversion, over the same orders, is an upper bound."""
    eps = gaussian_epsilon(z, 1.0, steps, delta)
    assert eps == pytest.approx(_improved(z, steps, delta), rel=1e-6)
    assert eps <= _classic(z, steps, delta)


def test_central_entry_per_round_and_total():
    entry = central_entry(1.0, 10, True, 1e-5)
    assert entry["epsilon_round"] == pytest.approx(_improved(1.0, 1, 1e-5), rel=1e-6)
    assert entry["epsilon_total"] == pytest.approx(_improved(1.0, 10, 1e-5), rel=1e-6)
    assert (entry["delta"], entry["sample_rate"], entry["accountant"]) == (1e-5, 1.0, "opacus.RDPAccountant")
    assert central_entry(1.0, 10, False, 1e-5)["epsilon_round"] == 0.0
    assert central_entry(0.0, 1, True, 1e-5)["epsilon_total"] == math.inf  # no noise: no guarantee


def test_local_entry_basic_composition_and_rdp_by_hand():
    eps, delta = 0.5, 1e-5
    entry = local_entry(eps, delta, {0: 3, 1: 2}, True)
    assert entry["epsilon_round"] == eps
    assert entry["epsilon_total_basic"] == pytest.approx(3 * eps)  # the CU with the most releases
    assert entry["delta_total_basic"] == pytest.approx(3 * delta)
    z = math.sqrt(2 * math.log(1.25 / delta)) / eps
    assert local_noise_multiplier(eps, delta) == pytest.approx(z)
    assert entry["epsilon_total"] == pytest.approx(_improved(z, 3, delta), rel=1e-6)


def test_ledger_counts_and_resumes():
    central = PrivacyLedger(PrivacySpec(mode="central", noise_multiplier=1.0))
    totals = []
    for aggregated in (True, False, True):
        central.charge([0, 1], aggregated=aggregated)
        totals.append(central.close_round()["epsilon_total"])
    assert totals[0] < totals[2] and totals[0] == totals[1] and central.steps == 2
    local = PrivacyLedger(PrivacySpec(mode="local", epsilon=1.0))
    local.charge([0], aggregated=True)
    local.charge([0, 2], aggregated=False)
    section = local.close_round()
    assert section["releases"] == {"0": 2, "2": 1}
    back = PrivacyLedger.resumed(
        local.privacy, [{"round": 1}, {"round": 2, "privacy": json.loads(json.dumps(section))}]
    )
    assert back.releases == {0: 2, 2: 1}
    assert PrivacyLedger(PrivacySpec()).close_round() == {}


@pytest.mark.parametrize(
    "override,planned",
    [
        ("privacy=central privacy.noise_multiplier=1.0", _improved(1.0, 10, 1e-5)),
        ("privacy=local privacy.epsilon=1.0", _improved(math.sqrt(2 * math.log(1.25e5)), 10, 1e-5)),
    ],
)
def test_budget_refused_at_start_up_only_when_exceeded(override, planned, data_dir):
    """federation.num_rounds=10, every cluster each round: the planned total against privacy.max_epsilon."""
    base = f"{override} federation.num_rounds=10"
    over = f"{base} privacy.max_epsilon={planned * 0.99}"
    with pytest.raises(ConfigError) as err:
        load_run_config(over.split(), data_dir=str(data_dir))
    msg = str(err.value)
    assert "\n" not in msg and "privacy.max_epsilon" in msg and "federation.num_rounds=10" in msg
    assert f"epsilon={planned:.4g}" in msg
    cfg = load_run_config(f"{base} privacy.max_epsilon={planned * 1.01}".split(), data_dir=str(data_dir))
    assert cfg.privacy.planned_epsilon(10) == pytest.approx(planned, rel=1e-6)
    load_run_config(base.split(), data_dir=str(data_dir))  # 0: no limit


OVERRIDES = (
    "task=translation model=transformer_tiny federation=tiny network=small federation.num_rounds=2 "
    "federation.local_steps=2 runtime.backend=local task.batch_size=8 eval.max_examples=16 checkpoint=false"
)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "privacy", ["privacy=central privacy.noise_multiplier=1.0", "privacy=local privacy.epsilon=100"]
)
def test_a_run_records_epsilon_per_round_and_in_total(privacy, data_dir, tmp_path):
    """Two rounds of two CUs (local DP at epsilon 100: sigma = 0.048 C, so the tiny model trains on)."""
    overrides = f"{OVERRIDES} run_name=dp {privacy}"
    run_config = {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(tmp_path)}
    folder = run_server(InProcessGrid(2, str(data_dir)), run_config)
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
    sections = [r["privacy"] for r in rounds if r["round"] > 0]
    assert len(sections) == 2 and all("train_loss" in r for r in rounds if r["round"] > 0)
    totals = [s["epsilon_total"] for s in sections]
    assert 0 < totals[0] < totals[1]
    assert all(s["epsilon_round"] > 0 and s["delta"] == 1e-5 and s["accountant"] for s in sections)
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["privacy"]["epsilon_total"] == pytest.approx(totals[1])


def test_the_end_of_run_lines_say_the_epsilon_spent(tmp_path):
    from collapipe_flwr.fl.server.server_main import summary_lines

    privacy = {"mode": "central", "epsilon_total": 3.5, "delta": 1e-5, "accountant": "opacus.RDPAccountant"}
    lines = summary_lines({"num_rounds": 2, "final_val": {}, "privacy": privacy}, tmp_path, "bleu")
    assert any(line.startswith("privacy (central): epsilon 3.5 at delta 1e-05") for line in lines)
