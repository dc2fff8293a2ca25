"""The per-round cost model of one cluster's pipeline (Sub-1's data), built from the system model.

``ClusterModel.build(spec, state, workload, n)`` turns the round's state into per-device numbers:
FLOP rate phi_k f_k(t), D2D rate r_k^dd (eq. 13), memory cap (C7) and, per m, the compute and D2D time
of one chunk and the largest delta_k the energy budget allows (C9'). ``evaluate(delta, m)`` is the
direct formula (eqs. 13-16) that the exact solver and the brute-force test both answer to.

The per-device numbers come from the network preset (``system.profile: config``) or, given a
:class:`~collapipe_flwr.system.profile.ClusterProfile` (``system.profile: measured``), from what the CU measured
on its devices: phi_k f_k = (o_l + o'_l) / s_k, c0_k, r_k^dd, tau_0 per link and gamma_k^max. Energy (eqs. 14,
16) keeps the configured phi_k, f_k and kappa: nothing here measures joules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from collapipe_flwr.errors import ConfigError, InfeasiblePlanError
from collapipe_flwr.system import channel, pipeline_model
from collapipe_flwr.system.network import NetworkSpec
from collapipe_flwr.system.pipeline_model import Checkpoint, Schedule
from collapipe_flwr.system.profile import ClusterProfile
from collapipe_flwr.system.state import RoundState
from collapipe_flwr.system.workload import Workload

ENERGY_RTOL = 1e-12


# The fields of ClusterModel that hold one entry per device k (the rest are scalars of the cluster).
PER_DEVICE_FIELDS = (
    "flops_per_second",
    "flops_per_cycle",
    "f_hz",
    "d2d_rate",
    "d2d_power",
    "memory_cap",
    "d2d_latency_s",
    "per_microbatch_s",
    "memory_bytes",
)


@dataclass(frozen=True)
class ClusterModel:
    """Cluster n in round t: everything Sub-1 needs, per device k (arrays of length K)."""

    cluster: int
    num_blocks: int  # L
    batch_size: int  # b
    steps: int  # local steps per round
    flops_per_sample_block: float  # o_l + o'_l
    activation_bits: float  # (z^s + g^{s+1}) per sample, bits
    flops_per_second: np.ndarray  # phi_k f_k(t)
    flops_per_cycle: np.ndarray  # phi_k
    f_hz: np.ndarray  # f_k(t)
    d2d_rate: np.ndarray  # r_k^dd (bit/s)
    d2d_power: np.ndarray  # p_k (W)
    memory_cap: np.ndarray  # floor(gamma_k^max / gamma_0): C7 as a bound on delta_k
    energy_max: float  # E_k^max
    kappa: float
    # tau_0 per device: fixed hand-over latency of one micro-batch transfer (docs/system_model.md); a scalar
    # given here is the same for every device
    d2d_latency_s: np.ndarray | float = 0.0
    # c0 per device: fixed on-device time per chunk besides its FLOPs (docs/system_model.md); scalar as above
    per_microbatch_s: np.ndarray | float = 0.0
    # the CU's own seconds per local step outside the devices (measured profiles only; not in eq. 26)
    cu_step_s: float = 0.0
    # C7 under 1F1B (pipeline.schedule): gamma_k^max - gamma_rt per device (what the blocks may use) and gamma_0's
    # two parts (weights + gradients + optimizer slots; saved activation bytes per sample), so the cap can follow m;
    # GPipe uses memory_cap alone
    memory_bytes: np.ndarray | float = 0.0
    runtime_bytes: float = 0.0  # gamma_rt, the runtime's own working memory on every device (NetworkSpec)
    block_static_bytes: float = 0.0
    saved_bytes_per_sample: float = 0.0
    schedule: Schedule = Schedule.GPIPE
    # pipeline.checkpoint: re-materialization holds one micro-batch in full and the others' segment inputs z^s
    # (input_bytes_per_sample each, the widest block boundary), so the cap follows m under GPipe too
    checkpoint: Checkpoint = Checkpoint.NEVER
    input_bytes_per_sample: float = 0.0
    # o_l: the forward a re-materialized micro-batch's backward computes again (recompute_per_block); 0: none counted
    forward_flops_per_sample_block: float = 0.0

    def __post_init__(self) -> None:
        shape = np.shape(self.flops_per_second)  # [K], or [N, 1, K] for stack_models
        for name in ("d2d_latency_s", "per_microbatch_s", "memory_bytes"):
            value = np.broadcast_to(np.asarray(getattr(self, name), dtype=float), shape).copy()
            object.__setattr__(self, name, value)

    @classmethod
    def build(
        cls, spec: NetworkSpec, state: RoundState, workload: Workload, n: int, profile: ClusterProfile | None = None
    ) -> ClusterModel:
        """Cluster n in round t from the preset's constants, or from ``profile`` where it measured a device
        (a device it has no measurement of keeps the preset's numbers)."""
        model = cls._from_config(spec, state, workload, n)
        return model.with_profile(profile, workload) if profile is not None else model

    @classmethod
    def _from_config(cls, spec: NetworkSpec, state: RoundState, workload: Workload, n: int) -> ClusterModel:
        if spec.needs_sizing:
            raise ConfigError(
                f"network {spec.name!r} gives device memory as shares of the model's; size it first "
                "(NetworkSpec.sized_to(workload.encoder_memory_bytes))"
            )
        devices = spec.devices_of(n)
        avail = np.asarray(state.availability[n][: len(devices)], dtype=float)
        f_hz = np.array([d.f_hz for d in devices]) * avail
        phi = np.array([d.flops_per_cycle for d in devices])
        p_k = np.array([d.d2d_power_w for d in devices])
        gain = np.asarray(state.d2d_gain[n][: len(devices)], dtype=float)
        rate = channel.shannon_rate(spec.d2d_bandwidth_hz, p_k, gain, spec.d2d_interference_w, spec.noise_psd_w_hz)
        gamma0 = workload.block_memory_bytes()
        free = [max(0.0, d.memory_bytes - spec.device_runtime_bytes) for d in devices]  # gamma_k^max - gamma_rt
        mem = np.array([math.floor(f / gamma0) for f in free], dtype=int)
        return cls(
            cluster=n,
            num_blocks=workload.num_blocks,
            batch_size=workload.batch_size,
            steps=workload.steps_per_round,
            flops_per_sample_block=workload.flops_per_sample_block,
            activation_bits=2 * 8.0 * workload.activation_bytes_per_sample,
            flops_per_second=phi * f_hz,
            flops_per_cycle=phi,
            f_hz=f_hz,
            d2d_rate=np.asarray(rate, dtype=float),
            d2d_power=p_k,
            memory_cap=np.minimum(mem, workload.num_blocks),
            energy_max=spec.device_energy_max_j,
            kappa=spec.effective_capacitance,
            d2d_latency_s=spec.d2d_latency_s,
            per_microbatch_s=spec.per_microbatch_s,
            memory_bytes=np.array(free, dtype=float),
            runtime_bytes=spec.device_runtime_bytes,
            block_static_bytes=workload.block_static_bytes(),
            saved_bytes_per_sample=workload.saved_bytes_per_sample,
            schedule=workload.schedule,
            checkpoint=workload.checkpoint,
            input_bytes_per_sample=workload.activation_bytes_per_sample * workload.memory_scale,
            forward_flops_per_sample_block=workload.forward_flops_per_sample_block,
        )

    def with_profile(self, profile: ClusterProfile, workload: Workload) -> ClusterModel:
        """These numbers with the measured ones of ``profile`` put in: phi_k f_k(t) = (o_l + o'_l) / s_k (the
        measurement is the device's availability, so no f_k(t) draw scales it), c0_k, r_k^dd (bit/s), tau_0 of
        each link and C7's cap from the measured memory."""
        if profile.K != self.K:
            raise InfeasiblePlanError(
                f"the measured profile of cluster {self.cluster} has {profile.K} devices, the network {self.K}; "
                "set network.devices_per_cluster to the devices the CU drives"
            )
        fps, c0 = self.flops_per_second.copy(), np.asarray(self.per_microbatch_s, dtype=float).copy()
        rate, latency = self.d2d_rate.copy(), np.asarray(self.d2d_latency_s, dtype=float).copy()
        mem, gamma_max = self.memory_cap.copy(), np.asarray(self.memory_bytes, dtype=float).copy()
        gamma0 = workload.block_memory_bytes()
        for k, (dev, link) in enumerate(zip(profile.devices, profile.links)):
            if dev is not None:
                fps[k] = self.flops_per_sample_block / dev.seconds_per_sample_block
                c0[k] = dev.microbatch_s
                free = max(0.0, dev.memory_bytes - self.runtime_bytes)
                mem[k] = min(math.floor(free / gamma0), self.num_blocks)
                gamma_max[k] = free
            if link is not None:
                rate[k] = 8.0 * link.bytes_per_s
                latency[k] = link.latency_s
        return replace(
            self,
            flops_per_second=fps,
            per_microbatch_s=c0,
            d2d_rate=rate,
            d2d_latency_s=latency,
            memory_cap=mem,
            memory_bytes=gamma_max,
            cu_step_s=profile.cu_step_s,
        )

    @property
    def K(self) -> int:
        return int(np.shape(self.flops_per_second)[-1])

    # ---------------------------------------------------------------- per-m device numbers
    def _b_hat(self, m) -> np.ndarray:
        return np.ceil(self.batch_size / np.asarray(m, dtype=float))

    def compute_per_block(self, m) -> np.ndarray:
        """Compute time of one micro-batch through ONE block on device k (s); m scalar -> [K], [M] -> [M, K]."""
        b_hat = self._b_hat(m)[..., None]
        return pipeline_model.chunk_compute_delay(1, b_hat, self.flops_per_sample_block, self.flops_per_second)

    def recomputed(self, m) -> np.ndarray:
        """n^rc(m): the micro-batches re-materialized (``checkpoint``), m scalar or an array of M values."""
        return pipeline_model.recomputed_micro_batches(self.checkpoint, m)

    def recompute_per_block(self, m) -> np.ndarray:
        """The forward a recomputed micro-batch's backward runs again through ONE block: b_hat o_l / (phi_k f_k) (s)."""
        b_hat = self._b_hat(m)[..., None]
        return pipeline_model.chunk_compute_delay(1, b_hat, self.forward_flops_per_sample_block, self.flops_per_second)

    def planned_compute_per_block(self, m) -> np.ndarray:
        """Sub-1's c_k(m): :meth:`compute_per_block`, plus :meth:`recompute_per_block` at every m that recomputes a
        micro-batch. ``always``: the exact chunk; ``except_last``: (S + m - 1) C^rc bounds the critical path
        C + (S + m - 2) C^rc (``pipeline_model.pipeline_delay``, :meth:`evaluate`) by at most one recompute."""
        compute = self.compute_per_block(m)
        if self.checkpoint == Checkpoint.NEVER:
            return compute
        return compute + np.where(self.recomputed(m)[..., None] > 0, self.recompute_per_block(m), 0.0)

    def d2d_delay(self, m) -> np.ndarray:
        """tau_k^dd of one micro-batch (z^s + g^{s+1}, eq. 13) on device k (s), plus the fixed per-transfer
        hand-over latency tau_0 (network.d2d.latency_s): without it eq. (15) always prefers m = b, since
        (S + m - 1) / m falls with m; with it the best m is interior, as the paper's Fig. 4 shows."""
        b_hat = self._b_hat(m)[..., None]
        return channel.transfer_delay(b_hat * self.activation_bits, self.d2d_rate) + self.d2d_latency_s

    def chunk_fixed(self, m) -> np.ndarray:
        """The part of a chunk that does not scale with delta_k: c0 + tau_k^dd (s); m scalar -> [K], [M] -> [M, K].

        c0 (network.device.per_microbatch_s) is paid once per micro-batch per stage, so a round spends
        steps * (S + m - 1) * c0 on it along the critical path: this is what makes Sub-1's best m interior."""
        return self.d2d_delay(m) + self.per_microbatch_s

    def device_energy(self, delta, m) -> np.ndarray:
        """E_k^pipe of a whole round (eqs. 14, 16): steps * m * (compute + D2D energy per chunk), plus the n^rc
        recomputed forwards under ``checkpoint``; 0 if unused."""
        delta = np.asarray(delta, dtype=float)
        m_arr = np.asarray(m, dtype=float)[..., None]
        b_hat = self._b_hat(m)[..., None]
        comp = pipeline_model.compute_energy(
            self.kappa, delta, b_hat, self.flops_per_sample_block, self.flops_per_cycle, self.f_hz, m_arr
        )
        if self.checkpoint != Checkpoint.NEVER:  # n^rc forwards again: compute_energy at o_l, n^rc times
            n = self.recomputed(m)[..., None]
            comp = comp + pipeline_model.compute_energy(
                self.kappa, delta, b_hat, self.forward_flops_per_sample_block, self.flops_per_cycle, self.f_hz, n
            )
        d2d = m_arr * channel.transmit_energy(self.d2d_power, self.d2d_delay(m))
        return np.where(delta > 0, self.steps * (comp + d2d), 0.0)

    def energy_ok(self, delta, m) -> np.ndarray:
        return self.device_energy(delta, m) <= self.energy_max * (1 + ENERGY_RTOL)

    def energy_cap(self, m) -> np.ndarray:
        """The largest delta_k (0..L) with E_k^pipe <= E_k^max (C9'), checked on the direct formula."""
        L = self.num_blocks
        one = self.device_energy(np.ones(self.K), m)
        fixed = self.device_energy(np.ones(self.K), m) - self.device_energy(np.full(self.K, 2.0), m) + one
        per_block = one - fixed
        with np.errstate(divide="ignore", invalid="ignore"):
            guess = np.floor((self.energy_max - fixed) / per_block)
        cap = np.clip(np.nan_to_num(guess, nan=0.0, posinf=L, neginf=0.0), 0, L).astype(int)
        for _ in range(L + 1):  # fix float rounding at the boundary against the direct formula
            down = (cap > 0) & ~self.energy_ok(cap, m)
            up = ~down & (cap < L) & self.energy_ok(np.minimum(cap + 1, L), m)
            if not (down.any() or up.any()):
                break
            cap = cap - down + up
        return cap

    def memory_cap_at(self, m, S=None, k=None) -> np.ndarray:
        """C7 as a bound on delta_k: floor(gamma_k^max / gamma_0) with gamma_0's activation term for this
        schedule (``pipeline_model.held_samples``). GPipe: ``memory_cap`` (the whole batch b, any m). 1F1B: stage k
        of S holds min(b, ceil(b/m) min(m, S - k)) samples; without a position (the solver, before it picks
        the S devices) the first stage's count with S = min(K, L), a bound every stage of every plan meets.
        m scalar -> [K]; an array of M values -> [M, K] (GPipe: ``memory_cap`` itself, broadcast by the caller).
        With ``checkpoint`` (``pipeline_model.held_activation_samples``): floor((gamma_k^max - gamma_rt - z^s x the
        input-only samples) / gamma_0 at the samples held in full), under GPipe too."""
        never = self.checkpoint == Checkpoint.NEVER
        if (self.schedule == Schedule.GPIPE and never) or not np.any(np.asarray(self.memory_bytes) > 0):
            return self.memory_cap
        stages = float(min(self.K, self.num_blocks) if S is None else S) - (0.0 if k is None else np.asarray(k, float))
        m_arr = np.asarray(m, dtype=float)[..., None]
        held = m_arr if self.schedule == Schedule.GPIPE else np.minimum(m_arr, stages)  # m or min(m, S - k)
        b_hat = self._b_hat(m)[..., None]
        samples = np.minimum(self.batch_size, b_hat * held)
        in_full = 2.0 if self.checkpoint == Checkpoint.EXCEPT_LAST and self.schedule == Schedule.ONE_F_ONE_B else 1.0
        full = samples if never else np.minimum(samples, b_hat * np.minimum(in_full, held))
        gamma0 = self.block_static_bytes + self.saved_bytes_per_sample * full
        free = np.asarray(self.memory_bytes, dtype=float) - self.input_bytes_per_sample * (samples - full)
        return np.clip(np.floor(free / gamma0), 0, self.num_blocks).astype(int)

    def stage_memory_cap(self, delta, m: int) -> np.ndarray:
        """C7 for a given partition: device k, the j-th used one of S, holds ``memory_cap_at(m, S, j)`` blocks
        (1F1B's min(m, S - j) micro-batches); GPipe's ``memory_cap``. Unused devices: their plain cap."""
        used = np.asarray(delta) > 0
        position = np.cumsum(used) - 1
        return np.where(used, self.memory_cap_at(m, int(used.sum()), np.where(used, position, 0)), self.memory_cap)

    def block_cap(self, m) -> np.ndarray:
        """min(C7 memory cap, C9' energy cap) per device for this m (or [M, K] for an array of m)."""
        return np.minimum(self.memory_cap_at(m), self.energy_cap(m))

    # ---------------------------------------------------------------- direct evaluation
    def evaluate(self, delta, m: int) -> dict:
        """Delay split and energy of partition ``delta`` with ``m`` micro-batches (eqs. 13-16). Under ``checkpoint``
        the n^rc recomputed micro-batches' chunks add their forward again: (m - n^rc) clocks of the slowest plain
        chunk and S + n^rc - 1 of the slowest recomputed one (``pipeline_model.pipeline_delay``)."""
        delta = np.asarray(delta, dtype=int)
        used = delta > 0
        S = int(used.sum())
        comp = delta * self.compute_per_block(m) + self.per_microbatch_s
        d2d = self.d2d_delay(m)
        n = int(self.recomputed(m))
        kinds = [(S + m - 1 if n == 0 else m - n, comp)]  # (clocks, compute per stage) of each kind of chunk
        if n:
            kinds.append((S + n - 1, comp + delta * self.recompute_per_block(m)))
        chunks = [np.where(used, c + d2d, -np.inf) for _, c in kinds]
        stars = [int(np.argmax(chunk)) for chunk in chunks]  # the slowest stage of each kind
        pipe = pipeline_model.pipeline_delay(chunks[0][used], S, m, chunks[-1][used], n)
        return {
            "S": S,
            "pipeline_s": float(self.steps * pipe),
            "compute_s": float(sum(self.steps * c * x[k] for (c, x), k in zip(kinds, stars))),
            "d2d_s": float(sum(self.steps * c * d2d[k] for (c, _), k in zip(kinds, stars))),
            "overhead_s": float(self.steps * self.cu_step_s),
            "device_energy_j": [float(e) for e in self.device_energy(delta, m)],
        }

    # ---------------------------------------------------------------- data parallel (the paper's VanillaFL)
    def data_parallel_energy(self, users) -> np.ndarray:
        """E_k of a round when the devices ``users`` each train all L blocks on ceil(b / D) samples (eq. 16
        with delta_k = L, one micro-batch, no D2D); 0 for the others."""
        users = np.asarray(users, dtype=bool)
        share = math.ceil(self.batch_size / max(int(users.sum()), 1))
        comp = pipeline_model.compute_energy(
            self.kappa, self.num_blocks, share, self.flops_per_sample_block, self.flops_per_cycle, self.f_hz, 1
        )
        return np.where(users, self.steps * comp, 0.0)

    def data_users(self) -> np.ndarray:
        """The devices that can be VanillaFL data users: each holds the whole encoder (C7) and trains it on
        its share ceil(b / D) within E_k^max (C9'). Dropping a device that fails C9' grows the others' shares,
        so this repeats until the set is stable."""
        users = (self.memory_cap >= self.num_blocks) & (self.f_hz > 0)
        while users.any():
            ok = self.data_parallel_energy(users) <= self.energy_max * (1 + ENERGY_RTOL)
            if ok[users].all():
                break
            users &= ok
        return users

    def evaluate_data_parallel(self, users) -> dict:
        """Delay split and energy when ``users`` train the whole model in parallel, each on ceil(b / D) of
        the batch (standard FL inside the cluster, no partition, no pipeline, no D2D): one chunk per device,
        ``steps * max_k (L ceil(b/D) (o_l + o'_l) / (phi_k f_k) + c0)``."""
        users = np.asarray(users, dtype=bool)
        D = int(users.sum())
        share = math.ceil(self.batch_size / max(D, 1))
        comp = (
            pipeline_model.chunk_compute_delay(
                self.num_blocks, share, self.flops_per_sample_block, self.flops_per_second
            )
            + self.per_microbatch_s
        )
        slowest = float(np.max(np.where(users, comp, -np.inf))) if D else 0.0
        fastest_first = np.argsort(-np.where(users, self.flops_per_second, -np.inf), kind="stable")[:D]
        return {
            "S": 1,
            "data_users": D,
            "user_devices": [int(k) for k in fastest_first],
            "pipeline_s": float(self.steps * slowest),
            "compute_s": float(self.steps * slowest),
            "d2d_s": 0.0,
            "overhead_s": float(self.steps * self.cu_step_s),
            "device_energy_j": [float(e) for e in self.data_parallel_energy(users)],
        }

    def infeasible(self, m_values) -> InfeasiblePlanError:
        """The error naming why no partition exists (C7 memory or C9 energy) for this cluster."""
        L = self.num_blocks
        mem_cap = np.asarray(self.memory_cap_at(max(m_values)))  # 1F1B: the most any m allows
        if int(mem_cap.sum()) < L:
            small = [k for k in range(self.K) if mem_cap[k] == 0]
            who = f"devices {small} cannot hold one block" if small else "the devices together hold too few blocks"
            return InfeasiblePlanError(
                f"C7 (memory) violated in cluster {self.cluster}: {who}; the {self.K} devices hold "
                f"{int(mem_cap.sum())} of L={L} blocks; raise network.device.memory_bytes or use a smaller "
                "model"
            )
        best_m = max(m_values, key=lambda m: int(self.block_cap(m).sum()))
        caps = self.energy_cap(best_m)
        worst = int(np.argmin(caps))
        return InfeasiblePlanError(
            f"C9 (device energy) violated in cluster {self.cluster}: even at m={best_m} the devices' energy budgets "
            f"E_k^max={self.energy_max:g} J allow {int(caps.sum())} of L={L} blocks (device {worst} allows "
            f"{int(caps[worst])}); "
            "raise network.device.energy_max_j or lower the workload"
        )
