"""RoundRecord: one round from ``configure_train`` through ``aggregate_train`` and ``evaluate`` to rounds.jsonl.

Fields (the JSON line of rounds.jsonl, docs/running.md "The run folder"): the round t, the method and scheduling policy,
the plan X(t) and its modelled delay / energy (eqs. 11-26), the CUs' training loss (example-weighted) and
per-CU metrics, the failures (cluster and one-line reason), the validation metrics when the round was
evaluated (``val_<name>``), the measured seconds of each server phase, and the clusters' measured profiles
(``profiles``: per device s_k, c0_k, memory; per link rate and latency; the CU's own seconds per step), and with
``privacy`` on the (epsilon, delta) spent (``privacy``: epsilon_round, epsilon_total, delta, accountant).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from collapipe_flwr.dssra.plan import RoundPlan


@dataclass
class RoundRecord:
    round: int
    method: str
    scheduler: str
    started_at: float = field(default_factory=time.time)
    plan: RoundPlan | None = None
    selected: list[int] = field(default_factory=list)
    train_loss: float | None = None  # None: no CU returned a valid result
    clients: dict[str, dict[str, Any]] | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    val: dict[str, float] = field(default_factory=dict)
    # plan_s, wait_clients_s, aggregate_s, overhead_s, evaluate_s, round_s
    measured_s: dict[str, float] = field(default_factory=dict)
    # {cluster: its kept (smoothed) measured profile after this round's report} (system/profile.py)
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    # {cluster: {"examples": |D_n|, "labels": examples per label}} (tasks/partition.py; the same every round)
    partitions: dict[str, dict[str, Any]] = field(default_factory=dict)
    # C7's modelled bytes beside each device's measured peak, and the planner's memory term (fl/server/memory_model.py)
    memory: dict[str, Any] = field(default_factory=dict)
    # the round on the virtual clock: per cluster its parts, the server's, the round (fl/server/virtual_round.py)
    virtual: dict[str, Any] = field(default_factory=dict)
    # with privacy on: epsilon_round, epsilon_total, delta, accountant (config/privacy_accounting.py)
    privacy: dict[str, Any] = field(default_factory=dict)

    def fail(self, cluster: int, reason: str) -> None:
        self.failures.append({"cluster": cluster, "error": reason})

    def to_json(self) -> dict[str, Any]:
        """The rounds.jsonl line (without the log's ``elapsed_s``)."""
        out: dict[str, Any] = {"round": self.round, "method": self.method, "scheduler": self.scheduler}
        if self.train_loss is not None:
            out["train_loss"] = self.train_loss
            out["clients"] = self.clients or {}
        out["failures"] = self.failures
        out.update({f"val_{k}": v for k, v in self.val.items()})
        out["plan"] = self.plan.to_dict() if self.plan else None
        out["modelled"] = self.plan.modelled_dict() if self.plan else {}
        out["measured_s"] = dict(self.measured_s)
        if self.profiles:
            out["profiles"] = dict(self.profiles)
        if self.partitions:
            out["partitions"] = dict(self.partitions)
        if self.memory:
            out["memory"] = dict(self.memory)
        if self.virtual:
            out["virtual"] = dict(self.virtual)
        if self.privacy:
            out["privacy"] = dict(self.privacy)
        return out
