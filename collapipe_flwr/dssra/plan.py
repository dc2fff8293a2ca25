"""The per-round plan X(t) = [m, S, delta_k, I_{n,j}, p_n] (paper eq. 27), one entry per cluster."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from collapipe_flwr.dssra.replan import Sub1Inputs


@dataclass(frozen=True)
class ClusterPlan:
    """Plan for cluster n in round t.

    selected: whether CU n got a channel (I_{n,j} = 1 for some j); unselected CUs sit the round out.
    channel: j, or None when not selected.  power_w: p_n (W).
    S: number of non-zero entries of delta.  m: micro-batches.  delta: delta_k per device, sum L.
    data_users: D, the devices that each train the whole model on their own share of the batch (data
    parallel, VanillaFL read the paper's way); 1 for every pipelined method (the CU's batch is one stream).
    user_devices: the devices k of those D users, fastest first (the first is the one delta names); empty for
    a pipelined plan. The CU trains user d on device ``user_devices[d]``.
    """

    cluster: int
    selected: bool
    channel: int | None
    power_w: float
    S: int
    m: int
    delta: tuple[int, ...]
    data_users: int = 1
    user_devices: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.data_users < 1:
            raise ValueError(f"cluster {self.cluster}: data_users={self.data_users} must be >= 1")
        if self.user_devices and len(self.user_devices) != self.data_users:
            raise ValueError(
                f"cluster {self.cluster}: {len(self.user_devices)} user_devices for data_users={self.data_users}; "
                "name one device per data user"
            )
        if len(set(self.user_devices)) != len(self.user_devices) or any(
            not 0 <= k < len(self.delta) for k in self.user_devices
        ):
            raise ValueError(
                f"cluster {self.cluster}: user_devices={list(self.user_devices)} must be distinct devices in "
                f"0..{len(self.delta) - 1}"
            )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["delta"] = list(self.delta)
        d["user_devices"] = list(self.user_devices)
        if self.data_users == 1:  # the pipelined methods' plans (and their records) carry no such keys
            del d["data_users"]
        if not self.user_devices:
            del d["user_devices"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ClusterPlan:
        return cls(
            cluster=int(d["cluster"]),
            selected=bool(d["selected"]),
            channel=None if d.get("channel") is None else int(d["channel"]),
            power_w=float(d["power_w"]),
            S=int(d["S"]),
            m=int(d["m"]),
            delta=tuple(int(x) for x in d["delta"]),
            data_users=int(d.get("data_users", 1)),
            user_devices=tuple(int(k) for k in d.get("user_devices", ())),
        )


@dataclass(frozen=True)
class ModelledCluster:
    """Cluster n's modelled figures for round t (one per cluster, selected or not; eqs. 10-16, 26, 28).

    pipeline_s: tau_n^pipe, the pipeline delay of its S, m, delta_k (eqs. 13-15).  compute_s / d2d_s: that
    delay's computation and D2D parts (the bottleneck chunk's two parts times (S + m - 1)).  overhead_s: the
    CU's measured time per round outside the devices (measured profiles only; not in eq. 26).  uplink_s:
    tau_n^Up (eq. 11, 0 when idle).  delay_s: tau_n^pipe + tau_n^Up when selected, else 0 (eq. 26's term).
    device_energy_j: E_k per device (eq. 16).  cu_energy_j: p_n tau_n^Up.  gamma: Gamma_n (eq. 28).  Y: the
    queue Y_n the plan was made with (eq. 29).  data_users: D of a data-parallel plan (VanillaFL), else None.
    """

    pipeline_s: float
    compute_s: float
    d2d_s: float
    overhead_s: float
    uplink_s: float
    delay_s: float
    device_energy_j: tuple[float, ...]
    cu_energy_j: float
    gamma: float
    Y: float
    data_users: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record's ``modelled.clusters[n]`` (rounds.jsonl); ``data_users`` only for a data-parallel plan."""
        d = asdict(self)
        d["device_energy_j"] = list(self.device_energy_j)
        if self.data_users is None:
            del d["data_users"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelledCluster:
        names = [f.name for f in fields(cls) if f.name not in ("device_energy_j", "data_users")]
        return cls(
            **{name: float(d[name]) for name in names},
            device_energy_j=tuple(float(x) for x in d["device_energy_j"]),
            data_users=int(d["data_users"]) if "data_users" in d else None,
        )


@dataclass(frozen=True)
class ModelledRound:
    """The modelled figures of round t's plan (what rounds.jsonl keeps under ``modelled``).

    method / policy: the training method and scheduling policy that planned it.  V: the Lyapunov trade-off
    weight.  round_delay_s: tau(t) = max_n over the selected CUs of tau_n^pipe + tau_n^Up (eq. 26; 0 if none).
    objective: V tau(t) + the drift term of the chosen plan (P3).  bcd_objective: the decomposed objective
    after every BCD half-step (never increasing), bcd_iterations the Sub-1/Sub-2 passes.  uplink_bits: the
    bits D_n a selected CU sends (eq. 11).  gamma_max: Gamma^max (C10).  gamma_mean: the mean of Gamma_n over
    the clusters.  clusters: one :class:`ModelledCluster` per cluster n, in cluster order.  left_out: {n: why
    CU n sits the round out}, only for CUs without a channel (dssra/selectors.py: sit_out_reason).
    """

    method: str
    policy: str
    V: float
    round_delay_s: float
    objective: float
    bcd_objective: tuple[float, ...]
    bcd_iterations: int
    uplink_bits: float
    gamma_max: float
    gamma_mean: float
    clusters: tuple[ModelledCluster, ...]
    left_out: Mapping[int, str] = field(default_factory=dict)

    def uplink_bytes_per_s(self, n: int) -> float:
        """R_n of cluster n's plan: D_n / tau_n^Up in bytes per second (eq. 11); 0 when n does not upload."""
        up = self.clusters[n].uplink_s
        return self.uplink_bits / 8.0 / up if up > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The record's ``modelled`` section; ``left_out`` (keys the clusters as strings) only when a CU sits out."""
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "left_out"}
        d["bcd_objective"] = list(self.bcd_objective)
        d["clusters"] = [c.to_dict() for c in self.clusters]
        if self.left_out:
            d["left_out"] = {str(n): reason for n, reason in sorted(self.left_out.items())}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelledRound:
        return cls(
            method=str(d["method"]),
            policy=str(d["policy"]),
            V=float(d["V"]),
            round_delay_s=float(d["round_delay_s"]),
            objective=float(d["objective"]),
            bcd_objective=tuple(float(x) for x in d["bcd_objective"]),
            bcd_iterations=int(d["bcd_iterations"]),
            uplink_bits=float(d["uplink_bits"]),
            gamma_max=float(d["gamma_max"]),
            gamma_mean=float(d["gamma_mean"]),
            clusters=tuple(ModelledCluster.from_dict(c) for c in d["clusters"]),
            left_out={int(n): str(reason) for n, reason in (d.get("left_out") or {}).items()},
        )


@dataclass(frozen=True)
class RoundPlan:
    """All clusters' plans for round t plus the modelled figures (delay/energy split, Gamma, Y_n; None for a plan
    not made by a policy)."""

    round: int
    clusters: tuple[ClusterPlan, ...]
    modelled: ModelledRound | None = None
    # {n: Sub-1's inputs for cluster n} (dssra/replan.py: sub1_inputs), sent to CU n so it can re-plan over
    # the devices it has left when one fails mid-round; not part of the record
    replan_inputs: dict[int, Sub1Inputs] = field(default_factory=dict, compare=False, repr=False)

    @property
    def selected(self) -> tuple[ClusterPlan, ...]:
        return tuple(c for c in self.clusters if c.selected)

    @property
    def left_out(self) -> dict[int, str]:
        """{n: why CU n sits this round out} for every CU without a channel."""
        reasons = self.modelled.left_out if self.modelled is not None else {}
        return {c.cluster: reasons.get(c.cluster, "not selected") for c in self.clusters if not c.selected}

    def modelled_dict(self) -> dict[str, Any]:
        """The record's ``modelled`` section ({} without modelled figures)."""
        return self.modelled.to_dict() if self.modelled is not None else {}

    def to_dict(self) -> dict:
        return {"round": self.round, "clusters": [c.to_dict() for c in self.clusters], "modelled": self.modelled_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> RoundPlan:
        modelled = d.get("modelled")
        return cls(
            round=int(d["round"]),
            clusters=tuple(ClusterPlan.from_dict(c) for c in d["clusters"]),
            modelled=ModelledRound.from_dict(modelled) if modelled else None,
        )
