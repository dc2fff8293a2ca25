"""Scheduling policies behind one interface: ``make_policy(...).plan(t, state) -> RoundPlan``.

* ``dssra`` (Algorithm 4): exact Sub-1 per cluster, then Sub-2: optimal power for every (CU, channel)
  pair and Hungarian matching with virtual channels, all minimising the drift-plus-penalty
  V * delay + sum_n Y_n * Gamma_n (or the paper's literal Y_n (S + p_n), scheduler.drift = paper).
* ``uniform``: DSSRA without segment scheduling: equal blocks on all K devices, m = fixed_m.
* ``random``: min(N, J) CUs at random on random free channels.
* ``loss_only``: the J CUs with the highest last reported loss (never-seen CUs first).
* ``delay_only``: the J CUs with the smallest modelled local (pipeline) delay.
The three baselines ignore the queues: segments by Sub-1 with V only, channels greedily (each selected CU
in rank order takes its best free channel), power = the largest C6/C8'-feasible power.
``observe(plan, losses)`` updates Y_n by eq. (29) for every policy (so their Gamma can be compared).
"""

from __future__ import annotations

import numpy as np

from collapipe_flwr.dssra.channels import match_channels
from collapipe_flwr.dssra.cluster_model import ClusterModel
from collapipe_flwr.dssra.plan import ClusterPlan, RoundPlan
from collapipe_flwr.dssra.power import LN2, optimal_power
from collapipe_flwr.dssra.scheduler_config import DRIFTS, POLICIES, SchedulerSpec, parse_scheduler_config
from collapipe_flwr.dssra.segments import fixed_segments, solve_segments, uniform_delta
from collapipe_flwr.errors import ConfigError, InfeasiblePlanError
from collapipe_flwr.system import pipeline_model
from collapipe_flwr.system.convergence import ConvergenceParams, queue_update
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.state import RoundState
from collapipe_flwr.system.workload import Workload

__all__ = ["POLICIES", "DRIFTS", "Policy", "make_policy", "validate_scheduler_config"]


def validate_scheduler_config(scheduler: dict) -> None:
    """Raise a one-line ConfigError if ``scheduler`` (conf/scheduler/*.yaml) is not valid."""
    parse_scheduler_config(scheduler)


def make_policy(scheduler: dict, spec: NetworkSpec, workload: Workload, seed: int) -> "Policy":
    return Policy(parse_scheduler_config(scheduler), spec, workload, seed)


class Policy:
    """One scheduling policy with its Lyapunov queues Y_n and loss history."""

    def __init__(self, sched: SchedulerSpec, spec: NetworkSpec, workload: Workload, seed: int) -> None:
        self.sched, self.spec, self.workload = sched, spec, workload
        self.name = sched.name
        self.conv = ConvergenceParams(sched.beta, sched.eta, sched.grad_bound, sched.interference_c,
                                      sched.gamma_max, spec.num_clusters, workload.num_blocks)
        self.Y = np.zeros(spec.num_clusters)
        self.last_loss: dict[int, float] = {}
        self.rng = np.random.default_rng([int(seed), 0xD55])
        b = workload.batch_size
        top = min(b, sched.max_m) if sched.max_m else b
        self.m_values = range(1, top + 1)
        if not sched.segment_scheduling and sched.fixed_m > b:
            raise ConfigError(f"scheduler.fixed_m={sched.fixed_m} exceeds the batch size b={b}; choose 1 <= fixed_m <= {b}")

    # ------------------------------------------------------------------ drift terms
    @property
    def uses_queues(self) -> bool:
        return self.name in ("dssra", "uniform")

    def _segment_drift(self, n: int, K: int) -> np.ndarray:
        S = np.arange(K + 1)
        if not self.uses_queues:
            return np.zeros(K + 1)
        if self.sched.drift == "paper":
            return self.Y[n] * S
        return self.Y[n] * self.conv.segment_term(S)

    # ------------------------------------------------------------------ the plan
    def plan(self, t: int, state: RoundState) -> RoundPlan:
        spec, V = self.spec, self.sched.V
        N, J = spec.num_clusters, spec.num_channels
        models = [ClusterModel.build(spec, state, self.workload, n) for n in range(N)]
        segs = []
        for n, model in enumerate(models):
            drift = self._segment_drift(n, model.K)
            if self.sched.segment_scheduling:
                segs.append(solve_segments(model, V, drift, self.m_values))
            else:
                segs.append(fixed_segments(model, V, drift, uniform_delta(model.K, model.num_blocks), self.sched.fixed_m))
        pipe = np.array([s.pipeline_s for s in segs])

        gain, interf = state.gain_matrix()[:N, :J], state.interference()[:J]
        bandwidth = np.asarray(spec.channel_bandwidth_hz)[None, :]
        slope = gain / (interf[None, :] + bandwidth * spec.noise_psd_w_hz)
        bits = self.workload.uplink_bits()
        w_gamma = np.zeros((N, 1))
        w_lin = np.zeros((N, 1))
        virtual = np.zeros(N)
        if self.uses_queues and self.sched.drift == "gamma":
            w_gamma = (self.Y * self.conv.scale * self.conv.interference_c)[:, None]
            virtual = self.Y * self.conv.interference_term(0.0, 1.0, interf.mean())
        elif self.uses_queues:
            w_lin = self.Y[:, None]
        shape = (N, J)
        power = optimal_power(np.full(shape, V), bits, np.broadcast_to(bandwidth, shape), slope, gain,
                              np.broadcast_to(interf[None, :], shape), np.broadcast_to(w_gamma, shape),
                              np.broadcast_to(w_lin, shape), spec.cu_energy_max_j, spec.cu_power_max_w)
        feasible = np.isfinite(power) & (power > 0)
        p_safe = np.where(feasible, power, 1.0)
        uplink = np.where(feasible, bits * LN2 / (bandwidth * np.log1p(slope * p_safe)), np.inf)
        cost = V * (pipe[:, None] + uplink) + w_gamma / (p_safe * gain + interf[None, :]) + w_lin * p_safe
        cost = np.where(feasible, cost, np.inf)
        channel = self._select(cost, virtual, pipe, slope, feasible)
        if not any(c is not None for c in channel):
            raise InfeasiblePlanError(
                f"C8 (CU energy) violated in every cluster in round {t}: no CU can upload {bits / 8e6:.4g} MB within "
                f"E_n^max={spec.cu_energy_max_j:g} J on any channel; raise network.uplink.energy_max_j or shrink the model"
            )
        return self._assemble(t, state, models, segs, channel, power, uplink, gain, interf, cost, virtual)

    def _select(self, cost, virtual, pipe, slope, feasible) -> list[int | None]:
        N, J = cost.shape
        if self.name in ("dssra", "uniform"):
            return match_channels(cost, virtual)
        candidates = [n for n in range(N) if feasible[n].any()]
        if self.name == "random":
            order = [int(x) for x in self.rng.permutation(candidates)]
            pick = lambda free, n: int(self.rng.choice(free))  # noqa: E731
        else:
            if self.name == "loss_only":
                key = lambda n: (-self.last_loss.get(n, np.inf), n)  # noqa: E731
            else:  # delay_only
                key = lambda n: (pipe[n], n)  # noqa: E731
            order = sorted(candidates, key=key)
            pick = lambda free, n: max(free, key=lambda j: (slope[n, j], -j))  # noqa: E731
        channel: list[int | None] = [None] * N
        used: set[int] = set()
        for n in order:
            if len(used) == J:
                break
            free = [j for j in range(J) if j not in used and feasible[n, j]]
            if free:
                channel[n] = pick(free, n)
                used.add(channel[n])
        return channel

    def _assemble(self, t, state, models, segs, channel, power, uplink, gain, interf, cost, virtual) -> RoundPlan:
        N = len(models)
        clusters, rows, gammas, delays = [], [], [], []
        for n in range(N):
            seg, j = segs[n], channel[n]
            ev = models[n].evaluate(seg.delta, seg.m)
            selected = j is not None
            p = float(power[n, j]) if selected else 0.0
            up = float(uplink[n, j]) if selected else 0.0
            h = float(gain[n, j]) if selected else 0.0
            I = float(interf[j]) if selected else float(interf.mean())
            gamma = float(self.conv.gamma(seg.S, p, h, I))
            gammas.append(gamma)
            if selected:
                delays.append(ev["pipeline_s"] + up)
            clusters.append(ClusterPlan(cluster=n, selected=selected, channel=j, power_w=p, S=seg.S, m=seg.m, delta=seg.delta))
            rows.append({
                "pipeline_s": ev["pipeline_s"], "compute_s": ev["compute_s"], "d2d_s": ev["d2d_s"],
                "uplink_s": up, "delay_s": ev["pipeline_s"] + up if selected else 0.0,
                "device_energy_j": ev["device_energy_j"], "cu_energy_j": p * up,
                "gamma": gamma, "Y": float(self.Y[n]),
            })
        objective = self.sched.V * (max(delays) if delays else 0.0) + self._drift_total(clusters, gammas)
        modelled = {
            "policy": self.name,
            "V": self.sched.V,
            "round_delay_s": pipeline_model.round_delay(delays, np.zeros(len(delays))) if delays else 0.0,
            "objective": float(objective),
            "gamma_max": self.conv.gamma_max,
            "gamma_mean": float(np.mean(gammas)),
            "clusters": rows,
        }
        return RoundPlan(round=int(t), clusters=tuple(clusters), modelled=modelled)

    def _drift_total(self, clusters, gammas) -> float:
        """sum_n Y_n Gamma_n (drift = gamma) or sum_n Y_n (S_n + p_n) (drift = paper) of the chosen plan."""
        if self.sched.drift == "paper":
            return float(sum(self.Y[c.cluster] * (c.S + c.power_w) for c in clusters))
        return float(np.dot(self.Y, gammas))

    # ------------------------------------------------------------------ feedback
    def observe(self, plan: RoundPlan, losses: dict[int, float]) -> None:
        """Y_n(t+1) = max(Y_n + Gamma_n^t - Gamma^max, 0) (eq. 29); remember the reported losses."""
        gammas = np.array([row["gamma"] for row in plan.modelled["clusters"]], dtype=float)
        self.Y = queue_update(self.Y, gammas, self.conv.gamma_max)
        for n, loss in losses.items():
            self.last_loss[int(n)] = float(loss)
