"""Does the run train at all? A run in which no CU completes a round is a failure, never "done".

Every round ends with the CUs that returned a result (``trained``: at least one local step folded into the
global model) or with none of them (each selected CU failed, was refused or timed out). A run that trains
nothing must not print "done", save the untrained model and exit 0 (issue 45: ``testbed.fastest_cores=inf``
made both CUs fail ``set_testbed`` in every round of such a run). So:

- ``federation.max_failed_rounds`` (K, default 3) consecutive rounds whose selected CUs all failed stop the run
  at once, with the last failure's reason (0: never stop early);
- a run none of whose rounds in this process trained (the CUs failed, or none was selected) fails at its end,
  whatever K is; rounds.jsonl keeps every round's record.

A CU whose failure every later round would repeat (:class:`~collapipe_flwr.errors.CannotContinue`: its
optimizer-state file is damaged) stops the run after that round too, rather than the run going on without it.

The run's failure is a one-line :class:`~collapipe_flwr.errors.CollaPipeError` naming the rounds and the last
reason a CU gave; the launcher turns it into exit code 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from collapipe_flwr.errors import CannotContinue, CollaPipeError


class NothingTrained(CollaPipeError):
    """No CU completed a round: in K consecutive rounds, or in every round of the run."""


def last_reason(failures: list[dict], left_out: Mapping[int, str]) -> str:
    """``cluster n: <its error>`` of a round's last failure; for a round no CU was selected in, why each sat out."""
    if failures:
        last = failures[-1]
        return f"cluster {last.get('cluster')}: {last.get('error')}"
    if left_out:
        return "no CU was selected (" + "; ".join(f"CU {n}: {why}" for n, why in sorted(left_out.items())) + ")"
    return "no CU was selected or none replied"


@dataclass
class TrainingWatch:
    """Counts the rounds that trained and the current run of rounds whose selected CUs all failed
    (K = ``max_failed_rounds``). A round no CU was selected in (DSSRA found no feasible CU: C8's energy, say) is
    a planned sit-out, not a failure: it never stops the run early, but it trains nothing either."""

    max_failed_rounds: int = 3
    trained_rounds: int = 0
    untrained: list[int] = field(default_factory=list)  # the rounds t without a result since the last trained one
    failed_streak: int = 0  # of those, how many in a row had CUs selected that all failed
    last_failure: str = ""
    fatal: str = ""  # a CU's failure that every later round would repeat (errors.CannotContinue)

    def round_ended(self, t: int, trained: bool, failures: list[dict], left_out: Mapping[int, str]) -> None:
        """Round t's training is over (its record is still to be written: :meth:`check_streak` comes after)."""
        if trained:
            self.trained_rounds += 1
            self.untrained, self.failed_streak = [], 0
            return
        self.untrained.append(int(t))
        self.last_failure = last_reason(failures, left_out)
        self.failed_streak = self.failed_streak + 1 if failures else 0

    def cannot_continue(self, t: int, cluster: int, reason: str) -> None:
        """CU ``cluster`` failed round t in a way every later round would repeat (a damaged CU-state file):
        :meth:`check_streak` stops the run with it once the round's record is kept."""
        self.fatal = self.fatal or f"round {t}: cluster {cluster} cannot go on: {reason}"

    def check_streak(self) -> None:
        """After the round's record is kept: raise the failure a CU cannot go on from, or :class:`NothingTrained`
        on the K-th consecutive round whose selected CUs all failed."""
        if self.fatal:
            raise CannotContinue(self.fatal + "; the run stops (rounds.jsonl keeps its rounds)")
        k = self.max_failed_rounds
        if k and self.failed_streak >= k:
            raise NothingTrained(
                f"no CU completed a round in rounds {self._span(self.untrained[-k:])} ({k} in a row, "
                f"federation.max_failed_rounds); last failure: {self.last_failure}; stopping, the model is not saved"
            )

    def check_run(self) -> None:
        """At the run's end: a run none of whose rounds trained fails."""
        if self.trained_rounds == 0 and self.untrained:
            raise NothingTrained(
                f"no CU completed a round in any of rounds {self._span(self.untrained)}; last: {self.last_failure}; "
                "nothing was trained, the model is not saved"
            )

    @staticmethod
    def _span(rounds: list[int]) -> str:
        return str(rounds[0]) if rounds[0] == rounds[-1] else f"{rounds[0]}-{rounds[-1]}"
