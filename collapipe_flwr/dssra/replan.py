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
from typing import Any

import numpy as np

from collapipe_flwr.dssra.cluster_model import PER_DEVICE_FIELDS, ClusterModel
from collapipe_flwr.dssra.segments import SegmentPlan, solve_segments
from collapipe_flwr.errors import InfeasiblePlanError

_ARRAYS = PER_DEVICE_FIELDS


def sub1_inputs(model: ClusterModel, V: float, drift_by_S: Iterable[float], m_values: Iterable[int]) -> dict:
    """What a CU needs to re-solve its Sub-1 (JSON-safe): the cluster model, V, drift(S) for S = 0..K, m values."""
    raw: dict[str, Any] = {}
    for field in dataclasses.fields(model):
        value = getattr(model, field.name)
        if field.name in _ARRAYS:
            raw[field.name] = np.asarray(value).tolist()
        else:
            raw[field.name] = value.item() if isinstance(value, np.generic) else value
    return {
        "model": raw,
        "V": float(V),
        "drift": [float(x) for x in drift_by_S],
        "m_values": [int(m) for m in m_values],
    }


def cluster_model_of(inputs: Mapping[str, Any]) -> ClusterModel:
    raw = dict(inputs["model"])
    for name in _ARRAYS:
        raw[name] = np.asarray(raw[name], dtype=float if name != "memory_cap" else int)
    return ClusterModel(**raw)


def without_devices(model: ClusterModel, lost: Iterable[int]) -> ClusterModel:
    """The same cluster without the ``lost`` devices (their entries removed from every per-device array)."""
    keep = [k for k in range(model.K) if k not in set(lost)]
    arrays: dict[str, Any] = {name: np.asarray(getattr(model, name))[keep] for name in _ARRAYS}
    return dataclasses.replace(model, **arrays)


def replan_without(inputs: Mapping[str, Any], lost: Iterable[int]) -> SegmentPlan:
    """Sub-1 over the devices left; the plan's delta has one entry per original device (0 on the lost ones).
    InfeasiblePlanError when the devices left cannot hold the encoder (C7 / C9')."""
    lost = sorted(set(int(k) for k in lost))
    model = cluster_model_of(inputs)
    keep = [k for k in range(model.K) if k not in lost]
    if not keep:
        raise InfeasiblePlanError(f"cluster {model.cluster} has no device left (lost {lost}); it sits the round out")
    drift = np.asarray(inputs["drift"], dtype=float)[: len(keep) + 1]
    plan = solve_segments(without_devices(model, lost), float(inputs["V"]), drift, inputs["m_values"])
    delta = np.zeros(model.K, dtype=int)
    delta[keep] = plan.delta
    return dataclasses.replace(plan, delta=tuple(int(x) for x in delta))
