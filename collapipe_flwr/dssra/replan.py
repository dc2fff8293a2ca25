"""Sub-1 again, on a CU, over the devices a cluster has left after some of them failed mid-round.

The server hands each selected CU the inputs of its Sub-1 (the cluster's :class:`ClusterModel` for the round,
V, the segment drift by S and the candidate m values) with its plan. When device k dies, the CU drops k
from that model and solves Sub-1 exactly over the K - 1 others (:func:`solve_segments`: the same
objective V tau^pipe + drift(S) under C7 and C9'), so the cluster finishes the round on the best partition
it still has instead of losing the round. The answer is expressed over the original K devices, with
delta_k = 0 on every lost device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from collapipe_flwr.dssra.cluster_model import PER_DEVICE_FIELDS, ClusterModel
from collapipe_flwr.dssra.segments import SegmentPlan, solve_segments
from collapipe_flwr.errors import InfeasiblePlanError

_ARRAYS = PER_DEVICE_FIELDS


@dataclass(frozen=True)
class Sub1Inputs:
    """What a CU needs to re-solve its Sub-1: the cluster's :class:`ClusterModel` for the round, V, the segment
    drift by S (S = 0..K) and the candidate m values. Travels as JSON (:meth:`to_dict` / :meth:`from_dict`)."""

    model: ClusterModel
    V: float
    drift: tuple[float, ...]
    m_values: tuple[int, ...]

    def to_dict(self) -> dict:
        raw: dict[str, Any] = {}
        for field in dataclasses.fields(self.model):
            value = getattr(self.model, field.name)
            if field.name in _ARRAYS:
                raw[field.name] = np.asarray(value).tolist()
            else:
                raw[field.name] = value.item() if isinstance(value, np.generic) else value
        return {"model": raw, "V": float(self.V), "drift": list(self.drift), "m_values": list(self.m_values)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sub1Inputs:
        raw = dict(data["model"])
        for name in _ARRAYS:
            raw[name] = np.asarray(raw[name], dtype=float if name != "memory_cap" else int)
        drift = tuple(float(x) for x in data["drift"])
        return cls(ClusterModel(**raw), float(data["V"]), drift, tuple(int(m) for m in data["m_values"]))


def sub1_inputs(model: ClusterModel, V: float, drift_by_S: Iterable[float], m_values: Iterable[int]) -> Sub1Inputs:
    """Sub-1's inputs of one cluster for its CU: the cluster model, V, drift(S) for S = 0..K, the m values."""
    return Sub1Inputs(model, float(V), tuple(float(x) for x in drift_by_S), tuple(int(m) for m in m_values))


def without_devices(model: ClusterModel, lost: Iterable[int]) -> ClusterModel:
    """The same cluster without the ``lost`` devices (their entries removed from every per-device array)."""
    keep = [k for k in range(model.K) if k not in set(lost)]
    arrays: dict[str, Any] = {name: np.asarray(getattr(model, name))[keep] for name in _ARRAYS}
    return dataclasses.replace(model, **arrays)


def replan_without(inputs: Sub1Inputs, lost: Iterable[int]) -> SegmentPlan:
    """Sub-1 over the devices left; the plan's delta has one entry per original device (0 on the lost ones).
    InfeasiblePlanError when the devices left cannot hold the encoder (C7 / C9')."""
    lost = sorted(set(int(k) for k in lost))
    model = inputs.model
    keep = [k for k in range(model.K) if k not in lost]
    if not keep:
        raise InfeasiblePlanError(f"cluster {model.cluster} has no device left (lost {lost}); it sits the round out")
    drift = np.asarray(inputs.drift, dtype=float)[: len(keep) + 1]
    plan = solve_segments(without_devices(model, lost), inputs.V, drift, list(inputs.m_values))
    delta = np.zeros(model.K, dtype=int)
    delta[keep] = plan.delta
    return dataclasses.replace(plan, delta=tuple(int(x) for x in delta))
