"""PrivacyLedger: the run's kept privacy accountant (``privacy.mode`` local or central), round by round.

It keeps what the accountant needs (config/privacy_accounting.py, where the mechanisms, the sampling assumption
and the formulas are): for central DP the rounds whose aggregate got the noise (each a step of the Gaussian
mechanism with noise multiplier z, q = 1); for local DP each cluster's uploads (releases: every CU the round
selected counts, whether or not its reply was kept). Each round's record gets a ``privacy`` section
(epsilon_round, epsilon_total, delta, accountant, and the counts), summary.json the run's totals. A resumed run
takes the counts back from the last kept rounds.jsonl record that has the section.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from collapipe_flwr.config import PrivacyMode, PrivacySpec
from collapipe_flwr.config.privacy_accounting import central_entry, local_entry


class PrivacyLedger:
    """Counts the charged rounds (central) or releases per cluster (local); pure bookkeeping, no I/O."""

    def __init__(self, privacy: PrivacySpec, steps: int = 0, releases: dict[int, int] | None = None) -> None:
        self.privacy = privacy
        self.steps = steps  # central: rounds whose aggregate was noised
        self.releases: dict[int, int] = dict(releases or {})  # local: uploads per cluster
        self._charged = False  # the round in flight was charged

    @classmethod
    def resumed(cls, privacy: PrivacySpec, records: Sequence[dict]) -> PrivacyLedger:
        """The ledger after the rounds of ``records`` (rounds.jsonl, in order): the counts of the last one with a
        ``privacy`` section (a fresh ledger when none has)."""
        for record in reversed(records):
            section = record.get("privacy")
            if isinstance(section, dict):
                steps = int(section.get("steps", 0) or 0)
                releases = {int(n): int(k) for n, k in (section.get("releases") or {}).items()}
                return cls(privacy, steps, releases)
        return cls(privacy)

    @property
    def enabled(self) -> bool:
        return self.privacy.enabled

    def charge(self, selected: Iterable[int], aggregated: bool) -> None:
        """Round's spending: central DP one step when its aggregate was formed (and noised); local DP one release
        per selected cluster."""
        if self.privacy.mode is PrivacyMode.CENTRAL and aggregated:
            self.steps += 1
            self._charged = True
        elif self.privacy.mode is PrivacyMode.LOCAL:
            for cluster in selected:
                self.releases[cluster] = self.releases.get(cluster, 0) + 1
                self._charged = True

    def close_round(self) -> dict[str, Any]:
        """The round's ``privacy`` section (empty when privacy is off); the next round starts uncharged."""
        charged, self._charged = self._charged, False
        p = self.privacy
        match p.mode:
            case PrivacyMode.CENTRAL:
                return central_entry(p.noise_multiplier, self.steps, charged, p.delta)
            case PrivacyMode.LOCAL:
                return local_entry(p.epsilon, p.delta, self.releases, charged)
        return {}

    def summary(self, num_rounds: int) -> dict[str, Any]:
        """summary.json's ``privacy``: the totals (the last round's section without its per-round epsilon), the
        budget and the planned worst case of ``num_rounds`` rounds."""
        section = self.close_round()
        section.pop("epsilon_round", None)
        section["max_epsilon"] = self.privacy.max_epsilon
        section["epsilon_planned"] = self.privacy.planned_epsilon(num_rounds)
        return section
