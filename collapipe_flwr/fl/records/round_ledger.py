"""RoundLedger: one round's :class:`~collapipe_flwr.fl.records.round_record.RoundRecord` from open to close.

The strategy's hooks configure, aggregate and evaluate; what they learn on the way (the plan, each phase's
seconds, the failures, the CUs' metrics, profiles and memory, the validation metrics) they hand to the ledger,
which keeps the round's record and, when the round closes, does the round's side effects in one fixed order:

1. the JSON line in rounds.jsonl (:class:`~collapipe_flwr.fl.records.run_log.RunLog`);
2. the checkpoint, after the line: a resumed run never repeats a logged round;
3. the progress display's end-of-round line;
4. the round listeners (each gets the line: TensorBoard, say);
5. the check that may stop the run once its record is kept (the server's training watch).

The ledger is handed everything it drives (the checkpoint and the check as callables), so it knows nothing of
the server side. Round 0 (the model before any training) is a line of its validation metrics only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from collapipe_flwr.dssra.plan import RoundPlan
from collapipe_flwr.fl.records.progress import RoundProgress, StepCounter
from collapipe_flwr.fl.records.round_record import RoundRecord
from collapipe_flwr.fl.records.run_log import RunLog
from collapipe_flwr.fl.round_report import RoundReport

RoundListener = Callable[[dict], None]


class RoundLedger:
    """Keeps the round in flight's record (:meth:`open` ... :meth:`close`) and writes it out.

    ``checkpoint(t)`` saves the run's state after round t's line (None: the run keeps no checkpoint);
    ``check()`` comes last and may raise to stop the run (None: nothing to check).
    """

    def __init__(
        self,
        run_log: RunLog,
        progress: RoundProgress | None = None,
        listeners: Sequence[RoundListener] = (),
        checkpoint: Callable[[int], object] | None = None,
        check: Callable[[], None] | None = None,
    ) -> None:
        self.run_log = run_log
        self.progress = progress
        self.listeners = list(listeners)
        self.checkpoint = checkpoint
        self.check = check
        self._record: RoundRecord | None = None  # the round in flight: open -> close

    # ------------------------------------------------------------------ lifecycle
    def open(self, t: int, method: str, scheduler: str, started_at: float | None = None) -> None:
        """Round t begins (now, or at ``started_at``): its record replaces any earlier round's."""
        if started_at is None:
            self._record = RoundRecord(t, method, scheduler)
        else:
            self._record = RoundRecord(t, method, scheduler, started_at=started_at)

    def is_open(self, t: int) -> bool:
        """Whether round t's record is open (False for a round whose training was never configured)."""
        return self._record is not None and self._record.round == t

    @property
    def _open_record(self) -> RoundRecord:
        """The round in flight's record."""
        if self._record is None:
            raise RuntimeError("no round is open: RoundLedger.open(t) comes before anything is noted")
        return self._record

    def initial(self, val: Mapping[str, float]) -> None:
        """Round 0, the model before training: its line holds the validation metrics only (no record is open,
        no checkpoint, progress or listener)."""
        self.run_log.append_round({"round": 0, **{f"val_{k}": v for k, v in val.items()}})

    def close(self, t: int, val: Mapping[str, float], evaluated_since: float) -> dict[str, Any]:
        """Round t ends with its validation metrics (empty when it was not evaluated; evaluation began at
        ``evaluated_since``): the last timings, then the line, checkpoint, progress, listeners and the check,
        in that order. Returns the line."""
        if not self.is_open(t):
            raise RuntimeError(f"round {t} is not open: RoundLedger.open({t}) comes before close")
        record = self._open_record
        record.val = dict(val)
        record.measured_s["evaluate_s"] = time.time() - evaluated_since
        record.measured_s["round_s"] = time.time() - record.started_at
        line = record.to_json()
        self._record = None  # closed: the next round opens its own
        self.run_log.append_round(line)
        if self.checkpoint is not None:  # after the record: a resumed run never repeats a logged round
            self.checkpoint(t)
        if self.progress is not None:
            self.progress.round_finished(t, line)
        for listener in self.listeners:
            listener(line)
        if self.check is not None:
            self.check()
        return line

    # ------------------------------------------------------------------ what the hooks note
    def note_plan(self, plan: RoundPlan, partitions: dict[str, dict[str, Any]], plan_s: float) -> None:
        """The round's plan X(t) (planned in ``plan_s`` seconds), its selected CUs and the clusters' partitions."""
        record = self._open_record
        record.plan = plan
        record.partitions = partitions
        record.measured_s["plan_s"] = plan_s
        record.selected = [c.cluster for c in plan.selected]

    def started(self, steps_of: StepCounter | None = None) -> None:
        """The round's train messages are ready: the progress display shows the plan (``steps_of``: the decoder's
        per-CU step counter, for the in-round progress lines)."""
        record = self._open_record
        if self.progress is None or record.plan is None:
            return
        segments = {c.cluster: (c.S, c.m, c.delta) for c in record.plan.selected}
        self.progress.round_started(record.round, record.selected, record.plan.left_out, steps_of, segments)

    @property
    def failures(self) -> list[dict[str, Any]]:
        """The round's failures so far ({"cluster": n, "error": reason}), in order."""
        return self._open_record.failures

    @property
    def plan(self) -> RoundPlan | None:
        """The round's plan X(t) (None before :meth:`note_plan`)."""
        return self._open_record.plan

    def fail(self, cluster: int, reason: str) -> None:
        """CU ``cluster`` failed the round (refused, raised or timed out) for ``reason``."""
        self._open_record.fail(cluster, reason)

    def unanswered(self, replied: set[int]) -> list[int]:
        """The selected CUs that neither replied nor failed yet, in order."""
        record = self._open_record
        return sorted(set(record.selected) - {f["cluster"] for f in record.failures} - replied)

    def note_profile(self, cluster: int, profile: dict[str, Any]) -> None:
        """CU ``cluster``'s kept measured profile after this round's report."""
        self._open_record.profiles[str(cluster)] = profile

    def note_wait(self, replies_ended_at: float, fold_s: float) -> None:
        """``wait_clients_s``: from the round's start to the last reply, less the planning and the folding."""
        record = self._open_record
        record.measured_s["wait_clients_s"] = (
            replies_ended_at - fold_s - record.started_at - record.measured_s.get("plan_s", 0.0)
        )

    def note_seconds(self, phase: str, seconds: float) -> None:
        """A server phase's measured seconds (``aggregate_s``, say)."""
        self._open_record.measured_s[phase] = seconds

    def note_overhead(self, train_s: float) -> None:
        """``overhead_s``: what the round cost so far beyond the CUs' training loops (``train_s``, the longest)."""
        record = self._open_record
        record.measured_s["overhead_s"] = time.time() - record.started_at - train_s

    def note_training(self, train_loss: float, clients: Mapping[int, RoundReport]) -> None:
        """The CUs' example-weighted training loss and each CU's report (flat, as it travelled)."""
        record = self._open_record
        record.train_loss = train_loss
        record.clients = {str(c): r.to_record() for c, r in clients.items()}

    def note_memory(self, memory: dict[str, Any]) -> None:
        """C7's modelled bytes beside each device's measured peak, and the planner's memory term."""
        self._open_record.memory = memory

    def note_virtual(self, virtual: dict[str, Any]) -> None:
        """The round on the virtual clock (``fl/server/virtual_round.py``)."""
        self._open_record.virtual = virtual

    def note_privacy(self, privacy: dict[str, Any]) -> None:
        """The (epsilon, delta) spent this round and in total (``fl/server/privacy_ledger.py``)."""
        self._open_record.privacy = privacy
