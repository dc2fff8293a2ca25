"""C7 beside what the devices measured, each round, and the planner's memory term corrected from it.

For every selected CU and every device k its (re-)plan used, the round record's ``memory`` section puts side by
side C7's modelled bytes gamma_rt + delta_k gamma_0 (``Workload.stage_memory_bytes`` at the round's S, m and the
stage's position, gamma_0 as counted on the blocks, gamma_rt the network's runtime term) and the peak the device
measured (``pipeline/process_memory.py``: its memory cgroup's peak, else its resident set's), with the testbed's
limit gamma_k^max where one was set. The median of |measured - modelled| / measured is the round's model error.

:class:`MemoryCorrection` fits measured = gamma_rt' + s x delta_k gamma_0 over every device-round so far (the last
``KEEP`` of them): the slope s by least squares, the runtime term gamma_rt' raised until no kept peak lies above
the line (an upper envelope: C7 is a hard limit that the kernel enforces on the testbed, and a least-squares line
leaves half the peaks above it, so a plan at a device's cap would be killed about half the time). With
``system.profile: measured``, and on a testbed that enforces gamma_k^max, the policy plans
with them (C7's caps then follow what the devices really use); otherwise (the paper's way) it plans from the model
and the record shows the fit.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collapipe_flwr.dssra.plan import RoundPlan
from collapipe_flwr.fl.round_report import RoundReport
from collapipe_flwr.system.workload import Workload


def _stage_bytes(workload: Workload, delta: list[int], m: int) -> list[float]:
    """delta_k gamma_0(m, S, position of k among the used devices) for every device k (0 where idle)."""
    S = sum(1 for d in delta if d > 0)
    out, position = [], 0
    for d in delta:
        if d > 0:
            out.append(workload.stage_memory_bytes(int(d), int(m), S, position))
            position += 1
        else:
            out.append(0.0)
    return out


def _user_bytes(workload: Workload, users: Sequence[int], K: int) -> list[float]:
    """C7's bytes on each of K devices when ``users`` (device indices) are VanillaFL's data users, each holding
    the whole encoder for its share of the batch (``Workload.user_memory_bytes``); 0 on the others."""
    each, chosen = workload.user_memory_bytes(len(users)), set(users)
    return [each if k in chosen else 0.0 for k in range(K)]


def memory_rows(
    plan: RoundPlan, workload: Workload, clients: Mapping[int, RoundReport], runtime_bytes: float = 0.0
) -> dict[str, Any]:
    """The round's ``memory`` section: per CU that replied, its final delta and m (after any re-plan), C7's bytes
    per device (``runtime_bytes`` = gamma_rt added on every used device), the measured peaks and limits, the
    devices lost for memory; the median relative error of the model, and the (delta_k gamma_0, measured) pairs.
    A VanillaFL plan's data users (``ClusterPlan.user_devices``, D > 1) each get the whole encoder on their share
    ceil(b / D) of the batch, whichever device delta names."""
    base = workload.with_memory_scale(1.0)
    rows: dict[str, Any] = {}
    errors: list[float] = []
    pairs: list[tuple[float, float]] = []
    for cplan in plan.selected:
        report = clients.get(cplan.cluster)
        if report is None:
            continue
        replan = report.replan
        delta = [int(d) for d in (replan.delta if replan is not None and replan.delta else cplan.delta)]
        m = int(replan.m if replan is not None and replan.m else cplan.m)
        users = [int(k) for k in cplan.user_devices] if cplan.data_users > 1 else []
        tensors = _user_bytes(base, users, len(delta)) if users else _stage_bytes(base, delta, m)
        modelled = [runtime_bytes + x if x > 0 else 0.0 for x in tensors]
        measured = [float(x) for x in (report.devices.measured_peak_bytes or [0.0] * len(delta))]
        limits = [float(x) for x in (report.devices.limit_bytes or [0.0] * len(delta))]
        rows[str(cplan.cluster)] = {
            "delta": delta,
            "m": m,
            "modelled_bytes": modelled,
            "measured_bytes": measured,
            "limit_bytes": limits,
            "lost_for_memory": list(replan.lost_for_memory) if replan is not None else [],
        }
        errors += [abs(meas - mod) / meas for mod, meas in zip(modelled, measured) if mod > 0 and meas > 0]
        pairs += [(x, meas) for x, meas in zip(tensors, measured) if x > 0 and meas > 0]
    return {
        "clusters": rows,
        "relative_error_median": statistics.median(errors) if errors else None,
        "pairs": pairs,
    }


KEEP = 400  # device-rounds the fit remembers


@dataclass
class MemoryCorrection:
    """The planner's memory term: measured = runtime_bytes + scale x delta_k gamma_0, fitted on the device-rounds
    so far (until there are any: the network's gamma_rt and scale 1)."""

    runtime_bytes: float = 0.0
    scale: float = 1.0
    measured: bool = False
    pairs: list[tuple[float, float]] = field(default_factory=list)

    def update(self, pairs: list[tuple[float, float]]) -> tuple[float, float]:
        """Add a round's (delta_k gamma_0, measured peak) pairs and refit; returns (runtime_bytes, scale). One
        distinct block count cannot separate the two: then the slope stays 1. A negative intercept or slope is
        noise: refit through the origin / slope 1. The runtime term is then raised so that every kept peak is at or
        below runtime_bytes + scale x delta_k gamma_0."""
        self.pairs = (self.pairs + [(float(x), float(y)) for x, y in pairs])[-KEEP:]
        if not self.pairs:
            return self.runtime_bytes, self.scale
        x = np.array([p[0] for p in self.pairs])
        y = np.array([p[1] for p in self.pairs])
        slope, intercept = np.polyfit(x, y, 1) if np.unique(x).size >= 2 else (1.0, float(np.median(y - x)))
        if not slope > 0:
            slope, intercept = 1.0, float(np.median(y - x))
        if intercept < 0:
            slope, intercept = float(np.dot(x, y) / np.dot(x, x)), 0.0
        intercept += max(0.0, float(np.max(y - (intercept + slope * x))))  # the envelope: every kept peak below
        self.runtime_bytes, self.scale, self.measured = float(intercept), float(slope), True
        return self.runtime_bytes, self.scale
