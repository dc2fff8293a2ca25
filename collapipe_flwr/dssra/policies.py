"""Scheduling policies behind one interface: ``make_policy(scheduler, ...).plan(t, state) -> RoundPlan``.

Every policy runs the same block coordinate descent (Algorithms 2-4) between Sub-1 (exact, per cluster: S,
m, delta given the matching) and Sub-2 (Dinkelbach + SCA power for every (CU, channel) pair under C6, C8',
C11', then the channel selection), minimising the decomposed drift-plus-penalty (P3, eqs. 34-36)
sum_{n selected} V (tau_n^pipe + tau_n^Up) + sum_n Y_n Gamma_n (or the paper's literal Y_n (S + p_n),
scheduler.drift = paper), until the plan stops changing or scheduler.bcd_max_iters passes.
What differs between policies is the channel selection rule a_{n,j}, one
:class:`~collapipe_flwr.dssra.selectors.ChannelSelector` per ``scheduler.name`` (dssra, uniform, random,
loss_only, delay_only; see dssra/selectors.py). A rule without queues (the baselines) gets one pass,
segments by Sub-1 with V only and power = the largest C6/C8'-feasible power.
``observe(plan, losses)`` updates Y_n by eq. (29) for every policy (so their Gamma can be compared).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.dinkelbach import PowerProblem, c11_power_floor, dinkelbach_sca_power
from collapipe_flwr.dssra.plan import ClusterPlan, ModelledCluster, ModelledRound, RoundPlan
from collapipe_flwr.dssra.power import LN2, max_energy_power
from collapipe_flwr.dssra.replan import sub1_inputs
from collapipe_flwr.dssra.segments import (
    SegmentPlan,
    best_m_segments,
    fixed_segments,
    solve_segments,
    uniform_delta,
)
from collapipe_flwr.dssra.selectors import SELECTORS, ChannelProblem, sit_out_reason, taken_channels
from collapipe_flwr.dssra.specs import Drift, SchedulerSpec
from collapipe_flwr.dssra.sub1_round import RoundSub1
from collapipe_flwr.dssra.sub2_data import RadioState, Sub2Result
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.system import pipeline_model
from collapipe_flwr.system.convergence import ConvergenceParams, calibrated_gamma_max_for, queue_update
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.profile import ClusterProfile
from collapipe_flwr.system.state import RoundState
from collapipe_flwr.system.workload import Workload

__all__ = ["PlanShape", "Policy", "make_policy"]


def make_policy(
    scheduler: SchedulerSpec, network: NetworkSpec, workload: Workload, seed: int, shape: PlanShape | None = None
) -> Policy:
    """The Policy of ``scheduler`` (conf/scheduler/*.yaml, parsed by ``specs.parse_scheduler``) for one run."""
    return Policy(scheduler, network, workload, seed, shape)


# segments(model, V, drift_by_S, idle) -> SegmentPlan: a method's own partition rule (see dssra/methods/)
SegmentRule = Callable[[ClusterModel, float, np.ndarray, bool], SegmentPlan]


@dataclass(frozen=True)
class PlanShape:
    """How a training method's plan differs from CollaPipe's (dssra/methods/); the default is CollaPipe.

    method: name logged in plan.modelled.method.  segments: partition rule replacing Sub-1 / uniform blocks.
    uplink_bits: bits a selected CU sends per round (default Workload.uplink_bits()).
    d2d: False = one device, no activation hand-over (tau^dd = 0, no D2D energy).
    optimise_power: False = each CU sends at the largest C6/C8'-feasible power.
    evaluate: the modelled delay split and energy of a cluster's plan, when they do not follow from its
    (delta, m) by eqs. 13-16 (VanillaFL's data-parallel devices); default ``ClusterModel.evaluate``.
    """

    method: str = "collapipe"
    segments: SegmentRule | None = None
    uplink_bits: float | None = None
    d2d: bool = True
    optimise_power: bool = True
    evaluate: Callable[[ClusterModel, SegmentPlan], dict] | None = None


def convergence_params(sched: SchedulerSpec, spec: NetworkSpec, num_blocks: int) -> ConvergenceParams:
    """Eq. (28)'s constants for a run of N = ``spec.num_clusters`` clusters and L = ``num_blocks`` TEBs, with
    Gamma^max calibrated for that N, L and the network's J when ``scheduler.convergence.gamma_max: auto``
    (system/convergence.calibrated_gamma_max_for, docs/system_model.md)."""
    conv = ConvergenceParams(
        sched.beta,
        sched.eta,
        sched.grad_bound,
        sched.interference_c,
        1.0 if sched.gamma_max_auto else sched.gamma_max,  # replaced below when auto
        spec.num_clusters,
        num_blocks,
    )
    return replace(conv, gamma_max=calibrated_gamma_max_for(conv, spec)) if sched.gamma_max_auto else conv


class Policy:
    """One scheduling policy with its Lyapunov queues Y_n and loss history."""

    def __init__(
        self, sched: SchedulerSpec, spec: NetworkSpec, workload: Workload, seed: int, shape: PlanShape | None = None
    ) -> None:
        self.sched, self.spec, self.workload = sched, spec, workload
        self.shape = shape or PlanShape()
        self.name = sched.name
        self.conv = convergence_params(sched, spec, workload.num_blocks)
        self.Y = np.zeros(spec.num_clusters)
        self.last_loss: dict[int, float] = {}
        self.rng = np.random.default_rng([int(seed), 0xD55])
        self.selector = SELECTORS[sched.name](self.rng)
        self.uplink_bits = float(
            self.shape.uplink_bits if self.shape.uplink_bits is not None else workload.uplink_bits()
        )
        b = workload.batch_size
        top = min(b, sched.max_m) if sched.max_m else b
        self.m_values = range(1, top + 1)
        if self.shape.segments is None and not sched.segment_scheduling and sched.fixed_m > b:
            raise ConfigError(
                f"scheduler.fixed_m={sched.fixed_m} exceeds the batch size b={b}; choose 1 <= fixed_m <= {b}"
            )

    # ------------------------------------------------------------------ drift terms
    @property
    def uses_queues(self) -> bool:
        return self.selector.uses_queues

    def _segment_drift(self, n: int, K: int) -> np.ndarray:
        S = np.arange(K + 1)
        if not self.uses_queues:
            return np.zeros(K + 1)
        if self.sched.drift is Drift.PAPER:
            return self.Y[n] * S
        return self.Y[n] * self.conv.segment_term(S)

    # ------------------------------------------------------------------ Sub-1
    def _segments(self, model: ClusterModel, n: int, idle: bool) -> SegmentPlan:
        """Sub-1 of cluster n alone (RoundSub1 solves the exact Sub-1 of all clusters at once)."""
        drift = self._segment_drift(n, model.K)
        if self.shape.segments is not None:
            return self.shape.segments(model, self.sched.V, drift, idle)
        if self.sched.segment_scheduling:
            return solve_segments(model, self.sched.V, drift, self.m_values, idle=idle)
        delta = uniform_delta(model.K, model.num_blocks)
        if self.sched.fixed_m:
            return fixed_segments(model, self.sched.V, drift, delta, self.sched.fixed_m)
        return best_m_segments(model, self.sched.V, drift, delta, self.m_values)

    # ------------------------------------------------------------------ the plan
    def plan(self, t: int, state: RoundState, profiles: Mapping[int, ClusterProfile] | None = None) -> RoundPlan:
        """Block coordinate descent (Algorithms 2-4): Sub-1 for every cluster (first as if every cluster
        trains), Sub-2 (power + matching) given the segments, then Sub-1 again given which clusters got a
        channel (an idle cluster's delay does not count, so it only minimises its drift), and so on until the
        selection, hence the plan, stops changing or scheduler.bcd_max_iters Sub-1/Sub-2 passes are done.
        Both blocks are exact, so the decomposed objective (``bcd_objective``) never increases. ``profiles``
        ({cluster n: measured profile}, ``system.profile: measured``) replace the preset's device numbers of the
        clusters they name (ClusterModel.build)."""
        spec = self.spec
        N = spec.num_clusters
        profiles = profiles or {}
        models = [ClusterModel.build(spec, state, self.workload, n, profiles.get(n)) for n in range(N)]
        if not self.shape.d2d:
            models = [replace(m, d2d_rate=np.full(m.K, np.inf), d2d_latency_s=0.0) for m in models]
        radio = self._radio(state)
        power_cache: dict[tuple[int, int], np.ndarray] = {}
        exact = self.shape.segments is None and self.sched.segment_scheduling
        sub1 = RoundSub1(models, self._segments, exact, self.sched.V, self._segment_drift, self.m_values)
        max_passes = self.sched.bcd_max_iters if self.uses_queues else 1
        flags = [True] * N
        segs = sub1(flags)
        sub2 = self._sub2(t, segs, radio, power_cache)
        history = [self._bcd_objective(segs, sub2, radio)]
        passes = 1
        while passes < max_passes:
            new_flags = [c is not None for c in sub2.channel]
            if new_flags == flags:
                break
            flags = new_flags
            segs = sub1(flags)
            history.append(self._bcd_objective(segs, sub2, radio))  # Sub-1 half-step: last pass's channels, power
            sub2 = self._sub2(t, segs, radio, power_cache)
            history.append(self._bcd_objective(segs, sub2, radio))
            passes += 1
        return self._assemble(t, models, segs, sub2, radio, history, passes)

    def _radio(self, state: RoundState) -> RadioState:
        spec = self.spec
        N, J = spec.num_clusters, spec.num_channels
        gain, interf = state.gain_matrix()[:N, :J], state.interference()[:J]
        bandwidth = np.broadcast_to(np.asarray(spec.channel_bandwidth_hz)[None, :], (N, J))
        slope = gain / (interf[None, :] + bandwidth * spec.noise_psd_w_hz)
        energy = self.uplink_bits * LN2 / (bandwidth * spec.cu_energy_max_j)  # C8': D ln2 / (B E^max)
        p_cap = max_energy_power(slope, energy, np.full(energy.shape, spec.cu_power_max_w))  # C6, C8'
        return RadioState(gain, interf, bandwidth, slope, p_cap)

    def _weights(self, radio: RadioState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(w_gamma [N], w_lin [N], sit-out drift [N]) of Sub-2: drift = gamma gives Y_n scale C / (p h + I)
        (eq. 28) and, for a CU left without a channel, its value at p = 0 with the mean interference;
        drift = paper gives the printed Y_n p_n (eq. 32). Baselines without queues, and methods that do not
        optimise power, have no power drift."""
        N = self.spec.num_clusters
        zero = np.zeros(N)
        if not self.uses_queues or not self.shape.optimise_power:
            return zero, zero, zero
        if self.sched.drift is Drift.GAMMA:
            w_gamma = self.Y * self.conv.scale * self.conv.interference_c
            return w_gamma, zero, w_gamma / radio.interf.mean()
        return zero, self.Y.copy(), zero

    def _sub2(self, t: int, segs, radio: RadioState, power_cache: dict) -> Sub2Result:
        """Power for every (CU, channel) pair (Dinkelbach + SCA under C6, C8', C11') and the matching."""
        spec, V = self.spec, self.sched.V
        N = spec.num_clusters
        gain, interf, bandwidth, slope = radio.gain, radio.interf, radio.bandwidth, radio.slope
        bits = self.uplink_bits
        w_gamma, w_lin, virtual = self._weights(radio)
        rows = [n for n in range(N) if (n, segs[n].S) not in power_cache]
        if rows:
            power_w = self._pair_powers(rows, segs, radio, w_gamma, w_lin)
            for i, n in enumerate(rows):
                power_cache[(n, segs[n].S)] = power_w[i]
        power = np.stack([power_cache[(n, segs[n].S)] for n in range(N)])
        pipe = np.array([s.pipeline_s for s in segs])
        feasible = np.isfinite(power) & (power > 0)
        p_safe = np.where(feasible, power, 1.0)
        uplink = np.where(feasible, bits * LN2 / (bandwidth * np.log1p(slope * p_safe)), np.inf)
        drift = w_gamma[:, None] / (p_safe * gain + interf[None, :]) + w_lin[:, None] * p_safe
        cost = np.where(feasible, V * (pipe[:, None] + uplink) + drift, np.inf)
        problem = ChannelProblem(cost, virtual, pipe, slope, feasible, self.last_loss)
        channel = self.selector.select(problem)
        # A round in which no CU can meet C8 on any channel is a round every CU sits out (C8 as the paper states
        # it): the plan selects nobody and says why; the global model is kept and the next round's channel draw
        # may be feasible again (sit_out_reason names C8 and the upload size).
        taken = taken_channels(channel, spec.num_channels)
        queues = self.selector.uses_queues
        left_out = {n: sit_out_reason(problem, channel, n, queues, taken) for n in range(N) if channel[n] is None}
        if not any(c is not None for c in channel):
            left_out = {
                n: f"{reason}: no CU can upload {bits / 8e6:.4g} MB within E_n^max={spec.cu_energy_max_j:g} J in "
                f"round {t} (raise network.uplink.energy_max_j or shrink the model)"
                for n, reason in left_out.items()
            }
        return Sub2Result(channel, power, uplink, cost, virtual, left_out)

    def _pair_powers(self, rows: list[int], segs, radio: RadioState, w_gamma, w_lin) -> np.ndarray:
        """p_{n,j} [len(rows), J] of the CUs ``rows`` given their S_n: Dinkelbach + SCA under C6, C8' and the
        C11' floor (Gamma_n(S_n, p) <= Gamma^max, only when the power drift is on)."""
        spec, bits = self.spec, self.uplink_bits
        gain, interf, bandwidth, slope, p_cap = radio.gain, radio.interf, radio.bandwidth, radio.slope, radio.p_cap
        idx = np.asarray(rows)
        p_floor: float | np.ndarray = 0.0
        if self.uses_queues and self.shape.optimise_power and self.conv.interference_c > 0:
            S = np.array([segs[n].S for n in rows], dtype=float)
            budget = self.conv.gamma_max - self.conv.segment_term(S) - self.conv.constant_term()
            p_floor = c11_power_floor(
                budget[:, None], self.conv.scale * self.conv.interference_c, gain[idx], interf[None, :], p_cap[idx]
            )
        problem = PowerProblem(
            V=self.sched.V,
            bits=bits,
            bandwidth=bandwidth[idx],
            slope=slope[idx],
            gain=gain[idx],
            interference=interf[None, :],
            w_gamma=w_gamma[idx, None],
            w_lin=w_lin[idx, None],
            energy_max=spec.cu_energy_max_j,
            pmax=spec.cu_power_max_w,
            p_floor=p_floor,
            p_cap=p_cap[idx],
        )
        result = dinkelbach_sca_power(problem)
        return result.power_w

    def _bcd_objective(self, segs, sub2: Sub2Result, radio: RadioState) -> float:
        """sum_{n selected} [V (tau^pipe + tau^Up) + power drift] + sum_{n idle} sit-out drift + sum_n drift(S_n),
        recomputed from the segments (Sub-2's cost matrix may hold another iteration's pipeline delays)."""
        V = self.sched.V
        w_gamma, w_lin, _ = self._weights(radio)
        total = 0.0
        for n, (seg, j) in enumerate(zip(segs, sub2.channel)):
            total += float(self._segment_drift(n, len(seg.delta))[seg.S])
            if j is None:
                total += float(sub2.virtual[n])
                continue
            p = float(sub2.power[n, j])
            total += V * (seg.pipeline_s + float(sub2.uplink[n, j]))
            total += float(w_gamma[n] / (p * radio.gain[n, j] + radio.interf[j]) + w_lin[n] * p)
        return total

    def _assemble(self, t, models, segs, sub2: Sub2Result, radio: RadioState, history, passes: int) -> RoundPlan:
        clusters, rows, gammas, delays = [], [], [], []
        for n in range(len(models)):
            cluster, row, delay = self._cluster_outcome(n, models[n], segs[n], sub2, radio)
            gammas.append(row.gamma)
            if delay is not None:
                delays.append(delay)
            clusters.append(cluster)
            rows.append(row)
        objective = self.sched.V * (max(delays) if delays else 0.0) + self._drift_total(clusters, gammas)
        modelled = ModelledRound(
            method=self.shape.method,
            policy=self.name,
            V=self.sched.V,
            round_delay_s=pipeline_model.round_delay(delays, np.zeros(len(delays))) if delays else 0.0,
            objective=float(objective),
            bcd_objective=tuple(float(x) for x in history),
            bcd_iterations=int(passes),
            uplink_bits=self.uplink_bits,
            gamma_max=self.conv.gamma_max,
            gamma_mean=float(np.mean(gammas)),
            clusters=tuple(rows),
            left_out=dict(sorted(sub2.left_out.items())),  # only CUs that sit out: why (selectors.sit_out_reason)
        )
        solves_m = self.shape.segments is None and self.sched.segment_scheduling
        replan = {
            n: sub1_inputs(
                models[n], self.sched.V, self._segment_drift(n, models[n].K), self.m_values if solves_m else [segs[n].m]
            )
            for n in range(len(models))
            if clusters[n].selected
        }
        return RoundPlan(round=int(t), clusters=tuple(clusters), modelled=modelled, replan_inputs=replan)

    def _cluster_outcome(self, n: int, model: ClusterModel, seg: SegmentPlan, sub2: Sub2Result, radio: RadioState):
        """(ClusterPlan, modelled row, tau_n^pipe + tau_n^Up or None if idle) of cluster n: its S, m, delta_k,
        channel and p_n, evaluated (eq. 26), with Gamma_n (eq. 28)."""
        j = sub2.channel[n]
        ev = self.shape.evaluate(model, seg) if self.shape.evaluate else model.evaluate(seg.delta, seg.m)
        selected = j is not None
        p = float(sub2.power[n, j]) if selected else 0.0
        up = float(sub2.uplink[n, j]) if selected else 0.0
        h = float(radio.gain[n, j]) if selected else 0.0
        I = float(radio.interf[j]) if selected else float(radio.interf.mean())
        gamma = float(self.conv.gamma(seg.S, p, h, I))
        cluster = ClusterPlan(
            cluster=n,
            selected=selected,
            channel=j,
            power_w=p,
            S=seg.S,
            m=seg.m,
            delta=seg.delta,
            data_users=int(ev.get("data_users", 1)),
            user_devices=tuple(int(k) for k in ev.get("user_devices", ())),
        )
        row = ModelledCluster(
            pipeline_s=ev["pipeline_s"],
            compute_s=ev["compute_s"],
            d2d_s=ev["d2d_s"],
            # the CU's measured time per round outside the devices (measured profiles only): not in
            # eq. (26), so not in delay_s, and the same for every plan of a cluster
            overhead_s=float(ev.get("overhead_s", 0.0)),
            uplink_s=up,
            delay_s=ev["pipeline_s"] + up if selected else 0.0,
            device_energy_j=tuple(ev["device_energy_j"]),
            cu_energy_j=p * up,
            gamma=gamma,
            Y=float(self.Y[n]),
            data_users=ev["data_users"] if "data_users" in ev else None,
        )
        return cluster, row, (ev["pipeline_s"] + up if selected else None)

    def _drift_total(self, clusters, gammas) -> float:
        """sum_n Y_n Gamma_n (drift = gamma) or sum_n Y_n (S_n + p_n) (drift = paper) of the chosen plan."""
        if self.sched.drift is Drift.PAPER:
            return float(sum(self.Y[c.cluster] * (c.S + c.power_w) for c in clusters))
        return float(np.dot(self.Y, gammas))

    # ------------------------------------------------------------------ state (checkpoints)
    def state_dict(self) -> dict:
        """What changes from round to round: the queues Y_n, the last losses, the random generator."""
        return {"Y": self.Y.tolist(), "last_loss": dict(self.last_loss), "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict` (the selector shares ``rng``, so it continues too)."""
        Y = np.asarray(state["Y"], dtype=float)
        if Y.shape != self.Y.shape:
            raise ConfigError(f"the saved queues Y_n are for {Y.size} clusters, this run has {self.Y.size}")
        self.Y = Y
        self.last_loss = {int(n): float(v) for n, v in state["last_loss"].items()}
        self.rng.bit_generator.state = state["rng"]

    # ------------------------------------------------------------------ feedback
    def observe(self, plan: RoundPlan, losses: dict[int, float]) -> None:
        """Y_n(t+1) = max(Y_n + Gamma_n^t - Gamma^max, 0) (eq. 29); remember the reported losses."""
        if plan.modelled is None:
            raise ValueError(f"round {plan.round}'s plan has no modelled Gamma_n: observe takes a plan a policy made")
        gammas = np.array([row.gamma for row in plan.modelled.clusters], dtype=float)
        self.Y = queue_update(self.Y, gammas, self.conv.gamma_max)
        for n, loss in losses.items():
            self.last_loss[int(n)] = float(loss)
