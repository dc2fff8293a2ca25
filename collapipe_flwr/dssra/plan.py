"""The per-round plan X(t) = [m, S, delta_k, I_{n,j}, p_n] (paper eq. 27), one entry per cluster."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

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
class RoundPlan:
    """All clusters' plans for round t plus the modelled figures (delay/energy split, Gamma, Y_n)."""

    round: int
    clusters: tuple[ClusterPlan, ...]
    modelled: dict = field(default_factory=dict)
    # {n: Sub-1's inputs for cluster n} (dssra/replan.py: sub1_inputs), sent to CU n so it can re-plan over
    # the devices it has left when one fails mid-round; not part of the record
    replan_inputs: dict[int, Sub1Inputs] = field(default_factory=dict, compare=False, repr=False)

    @property
    def selected(self) -> tuple[ClusterPlan, ...]:
        return tuple(c for c in self.clusters if c.selected)

    @property
    def left_out(self) -> dict[int, str]:
        """{n: why CU n sits this round out} for every CU without a channel."""
        reasons = self.modelled.get("left_out") or {}
        return {c.cluster: str(reasons.get(str(c.cluster), "not selected")) for c in self.clusters if not c.selected}

    def to_dict(self) -> dict:
        return {"round": self.round, "clusters": [c.to_dict() for c in self.clusters], "modelled": self.modelled}

    @classmethod
    def from_dict(cls, d: dict) -> RoundPlan:
        return cls(
            round=int(d["round"]),
            clusters=tuple(ClusterPlan.from_dict(c) for c in d["clusters"]),
            modelled=dict(d.get("modelled", {})),
        )
