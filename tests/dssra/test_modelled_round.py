"""ModelledRound, the typed ``RoundPlan.modelled``: a policy builds it, readers read fields, and its codec keeps
rounds.jsonl's ``modelled`` section as it was (every kept record in results/ reads back to the same JSON)."""

from __future__ import annotations

import json

import pytest

from collapipe_flwr.dssra.plan import ClusterPlan, ModelledCluster, ModelledRound, RoundPlan
from tests.paths import ROOT

RESULTS = ROOT / "results"
# kept runs: a pipelined method whose CUs sometimes sit out (left_out), and VanillaFL (data_users per cluster)
KEPT = [
    RESULTS / "trained/jobs/translation/methods/seed1/pipeline/rounds.jsonl",
    RESULTS / "trained/jobs/translation/methods/seed1/vanilla_fl/rounds.jsonl",
]

# The section as the policy wrote it before it was typed: the keys in the order they were built.
RECORD = {
    "method": "collapipe",
    "policy": "dssra",
    "V": 0.01,
    "round_delay_s": 12.5,
    "objective": 0.2,
    "bcd_objective": [0.3, 0.2],
    "bcd_iterations": 2,
    "uplink_bits": 8.0e6,
    "gamma_max": 3.5,
    "gamma_mean": 1.25,
    "clusters": [
        {
            "pipeline_s": 10.0,
            "compute_s": 7.0,
            "d2d_s": 3.0,
            "overhead_s": 0.0,
            "uplink_s": 2.5,
            "delay_s": 12.5,
            "device_energy_j": [1.0, 2.0],
            "cu_energy_j": 0.5,
            "gamma": 1.5,
            "Y": 0.25,
        },
        {
            "pipeline_s": 4.0,
            "compute_s": 4.0,
            "d2d_s": 0.0,
            "overhead_s": 0.0,
            "uplink_s": 0.0,
            "delay_s": 0.0,
            "device_energy_j": [0.0, 3.0],
            "cu_energy_j": 0.0,
            "gamma": 1.0,
            "Y": 0.0,
            "data_users": 2,
        },
    ],
    "left_out": {"1": "all usable channels went to other CUs"},
}


def test_the_codec_writes_the_section_key_for_key_in_the_order_it_was_built():
    modelled = ModelledRound.from_dict(RECORD)
    assert json.dumps(modelled.to_dict()) == json.dumps(RECORD)
    assert modelled.clusters[0].uplink_s == 2.5 and modelled.clusters[0].data_users is None
    assert modelled.clusters[1].data_users == 2 and modelled.clusters[1].device_energy_j == (0.0, 3.0)
    assert modelled.left_out == {1: "all usable channels went to other CUs"}
    without = {k: v for k, v in RECORD.items() if k != "left_out"}
    assert "left_out" not in ModelledRound.from_dict(without).to_dict()  # only when a CU sits out


@pytest.mark.parametrize("path", KEPT, ids=lambda p: p.parent.name)
def test_every_kept_record_reads_back_to_the_same_json(path):
    seen = 0
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if not record.get("modelled"):
            continue
        plan = RoundPlan.from_dict(record["plan"])
        assert json.dumps(plan.to_dict(), sort_keys=True) == json.dumps(record["plan"], sort_keys=True)
        assert json.dumps(plan.modelled_dict(), sort_keys=True) == json.dumps(record["modelled"], sort_keys=True)
        seen += 1
    assert seen > 0


def test_the_uplink_rate_is_the_bits_over_the_uplink_time_and_zero_when_idle():
    modelled = ModelledRound.from_dict(RECORD)
    assert modelled.uplink_bytes_per_s(0) == pytest.approx(8.0e6 / 8 / 2.5)  # eq. (11): D_n / tau_n^Up
    assert modelled.uplink_bytes_per_s(1) == 0.0


def test_a_plan_names_why_each_cu_sits_out_and_a_plan_without_figures_has_an_empty_section():
    idle = ClusterPlan(cluster=1, selected=False, channel=None, power_w=0.0, S=1, m=1, delta=(2, 0))
    busy = ClusterPlan(cluster=0, selected=True, channel=0, power_w=0.2, S=2, m=2, delta=(1, 1))
    plan = RoundPlan(round=3, clusters=(busy, idle), modelled=ModelledRound.from_dict(RECORD))
    assert plan.left_out == {1: "all usable channels went to other CUs"}
    bare = RoundPlan(round=3, clusters=(busy, idle))
    assert bare.left_out == {1: "not selected"} and bare.modelled_dict() == {} and bare.to_dict()["modelled"] == {}
    assert RoundPlan.from_dict(bare.to_dict()) == bare


def test_a_cluster_entry_is_frozen():
    row = ModelledCluster.from_dict(RECORD["clusters"][0])
    with pytest.raises(AttributeError):
        row.uplink_s = 1.0  # type: ignore[misc]
