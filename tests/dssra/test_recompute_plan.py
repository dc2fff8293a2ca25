"""The planner's cost model (ClusterModel, Sub-1, the modelled round) under ``pipeline.checkpoint``: a re-materialized
micro-batch's chunk computes delta_k b_hat (o_l + o_l + o'_l) / (phi_k f_k) and E_k counts its extra forward; by
hand, against a brute force over every partition, and through a whole DSSRA round."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import yaml

from collapipe_flwr.config import CONF_DIR
from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.policies import make_policy
from collapipe_flwr.dssra.segments import solve_segments
from collapipe_flwr.dssra.specs import parse_scheduler
from collapipe_flwr.errors import InfeasiblePlanError
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.state import StateSampler
from tests.dssra.test_dssra_bruteforce import all_deltas, random_model
from tests.workloads import COMPUTE_HEAVY, uniform_workload

# two equal devices: phi_k = 10, f_k = 1e8 (phi_k f_k = 1e9 FLOP/s); o_l = 1e6, o'_l = 2e6 (o_l + o'_l = 3e6);
# b = 8; D2D: 1e4 bits a sample at 1e7 bit/s (1e-3 s a sample), no tau_0, no c0
K = 2
HAND = ClusterModel(
    cluster=0, num_blocks=4, batch_size=8, steps=1, flops_per_sample_block=3e6, activation_bits=1e4,
    flops_per_second=np.full(K, 1e9), flops_per_cycle=np.full(K, 10.0), f_hz=np.full(K, 1e8),
    d2d_rate=np.full(K, 1e7), d2d_power=np.full(K, 0.1), memory_cap=np.full(K, 4), energy_max=1e9,
    kappa=1e-28, forward_flops_per_sample_block=1e6,
)  # fmt: skip


def test_evaluate_by_hand_for_every_mode():
    """delta = (2, 2), m = 4: b_hat = 2; plain chunk 2 * 2 * 3e6 / 1e9 + 2 * 1e-3 = 0.014 s, recomputed
    2 * 2 * (1e6 + 1e6 + 2e6) / 1e9 + 0.002 = 0.018 s; S + m - 1 = 5 clocks."""
    expected = {"never": 5 * 0.014, "always": 5 * 0.018, "except_last": 0.014 + 4 * 0.018}
    for mode, pipe in expected.items():
        ev = dataclasses.replace(HAND, checkpoint=mode).evaluate((2, 2), 4)
        assert ev["pipeline_s"] == pytest.approx(pipe), mode
        assert ev["d2d_s"] == pytest.approx(5 * 0.002), mode
        assert ev["compute_s"] + ev["d2d_s"] == pytest.approx(ev["pipeline_s"]), mode
    assert HAND.evaluate((2, 2), 4)["pipeline_s"] == 5 * (2 * 2 * 3e6 / 1e9 + 2 * 1e4 / 1e7)  # never: eq. (15)
    # m = 1: except_last recomputes nothing
    one = dataclasses.replace(HAND, checkpoint="except_last").evaluate((2, 2), 1)
    assert one == HAND.evaluate((2, 2), 1)


def test_device_energy_counts_the_recomputed_forwards_by_hand():
    """E_k = kappa f_k^2 delta_k b_hat (m (o_l + o'_l) + n^rc o_l) / phi_k + m p_k tau_k^dd, delta_k = 2, b_hat = 2."""
    d2d = 4 * 0.1 * 2e-3
    for mode, n in (("never", 0), ("except_last", 3), ("always", 4)):
        energy = dataclasses.replace(HAND, checkpoint=mode).device_energy(np.array([2, 2]), 4)
        by_hand = 1e-28 * 1e16 * 2 * 2 * (4 * 3e6 + n * 1e6) / 10 + d2d
        assert energy == pytest.approx([by_hand, by_hand]), mode
    assert list(dataclasses.replace(HAND, checkpoint="always").device_energy(np.array([4, 0]), 4))[1] == 0.0


def test_the_workload_carries_the_forward_part_to_the_cluster_model():
    """uniform_workload: o_l = 1e6, o'_l = 2e6 a sample and block; ClusterModel.build takes o_l + o'_l and o_l."""
    work = uniform_workload(4, 1e6, 10.0, 1000.0, 50.0, 8, checkpoint="always")
    assert (work.flops_per_sample_block, work.forward_flops_per_sample_block) == (3e6, 1e6)
    raw = yaml.safe_load((CONF_DIR / "network" / "paper_table2.yaml").read_text())
    spec = NetworkSpec.from_config(raw, 1)
    model = ClusterModel.build(spec, StateSampler(spec, 0).sample(0), work, 0)
    assert (model.forward_flops_per_sample_block, model.checkpoint) == (1e6, "always")
    assert model.planned_compute_per_block(4) == pytest.approx(model.compute_per_block(4) * 4 / 3)


def brute_force(model: ClusterModel, V: float, drift: np.ndarray) -> float:
    """min over every partition within the caps and every m of V * evaluate's delay + drift(S)."""
    best = math.inf
    deltas = all_deltas(model.K, model.num_blocks)
    deltas = deltas[(deltas <= model.memory_cap[None, :]).all(axis=1)]
    for m in range(1, model.batch_size + 1):
        ok = model.energy_ok(deltas, m).all(axis=1)
        for delta in deltas[ok]:
            ev = model.evaluate(delta, m)
            best = min(best, V * ev["pipeline_s"] + drift[ev["S"]])
    return best


def test_sub1_with_always_is_the_brute_force_optimum_and_never_faster_than_without():
    """Under ``always`` every chunk carries the recompute, so Sub-1 stays exact (against evaluate over every
    partition); the best plan's delay is >= the best without re-materialization; under ``except_last`` Sub-1's
    stage time is a bound on the plan's exact (evaluate) delay, between never's and always'."""
    rng = np.random.default_rng(3)
    checked = tried = 0
    while checked < 25:
        tried += 1
        assert tried < 5000, "too few feasible random clusters"
        model = random_model(rng)
        if model.K > 4 or model.num_blocks > 6 or model.batch_size > 8:
            continue
        model = dataclasses.replace(model, forward_flops_per_sample_block=model.flops_per_sample_block / 3)
        V, drift = 1.0, np.zeros(model.K + 1)
        try:
            never = solve_segments(model, V, drift, range(1, model.batch_size + 1))
        except InfeasiblePlanError:  # C7 or C9 without recompute; with it, too (it costs more energy)
            continue
        always_model = dataclasses.replace(model, checkpoint="always")
        try:
            always = solve_segments(always_model, V, drift, range(1, model.batch_size + 1))
        except InfeasiblePlanError:  # C9: the recompute's energy
            continue
        assert always.objective == pytest.approx(brute_force(always_model, V, drift), rel=1e-9)
        assert always.pipeline_s == pytest.approx(always_model.evaluate(always.delta, always.m)["pipeline_s"])
        assert always.pipeline_s >= never.pipeline_s
        last = dataclasses.replace(model, checkpoint="except_last")
        exact = last.evaluate(always.delta, always.m)["pipeline_s"]
        assert model.evaluate(always.delta, always.m)["pipeline_s"] <= exact <= always.pipeline_s * (1 + 1e-12)
        plan = solve_segments(last, V, drift, range(1, model.batch_size + 1))  # always's plan meets its C9 too
        exact = last.evaluate(plan.delta, plan.m)["pipeline_s"]
        one_recompute = last.steps * float(np.max(np.asarray(plan.delta) * last.recompute_per_block(plan.m)))
        assert exact * (1 - 1e-12) <= plan.pipeline_s <= exact + one_recompute * (1 + 1e-9)
        checked += 1


def test_a_dssra_round_models_a_longer_delay_and_more_energy_with_re_materialization():
    """The same network, state and DSSRA scheduler on COMPUTE_HEAVY: the modelled round (eq. 26) of each mode's
    own plan, and of never's plan evaluated under always."""
    spec = NetworkSpec.from_config(yaml.safe_load((CONF_DIR / "network" / "paper_table2.yaml").read_text()), 3)
    sched = yaml.safe_load((CONF_DIR / "scheduler" / "dssra.yaml").read_text())
    sched = parse_scheduler(dict(sched, max_m=8))
    state = StateSampler(spec, 0).sample(0)
    plans = {}
    for mode in ("never", "except_last", "always"):
        work = dataclasses.replace(COMPUTE_HEAVY, checkpoint=mode)
        plans[mode] = make_policy(sched, spec, work, 0).plan(0, state)
    delay = {mode: plan.modelled.round_delay_s for mode, plan in plans.items()}
    assert delay["never"] <= delay["except_last"] <= delay["always"]
    assert delay["never"] < delay["always"]
    never_plan = plans["never"]
    for c, row in zip(never_plan.clusters, never_plan.modelled.clusters):
        if not c.selected:
            continue
        models = {m: ClusterModel.build(spec, state, dataclasses.replace(COMPUTE_HEAVY, checkpoint=m), c.cluster)
                  for m in ("never", "always")}  # fmt: skip
        before, after = (models[m].evaluate(c.delta, c.m) for m in ("never", "always"))
        assert before["pipeline_s"] == pytest.approx(row.pipeline_s)
        assert after["pipeline_s"] > before["pipeline_s"]
        assert all(a > b for a, b, d in zip(after["device_energy_j"], before["device_energy_j"], c.delta) if d)
