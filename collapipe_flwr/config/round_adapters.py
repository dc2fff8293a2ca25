"""The ``round_adapters`` section: a LoRA causal LM's adapters in PEFT's format after every k-th round.

A federated run of ``task=causal_lm`` with LoRA writes ``<run>/model/rounds/<t>/peft/`` (the adapters of the
global model after round t, in PEFT's format over the run's ``model/base/``: models/hf/round_adapters.py) after
rounds k, 2k, ... and after the last round, keeping the newest ``keep``; ``generate --round t`` reads one
(docs/hf_export.md). Any other run writes none, whatever the section says.
"""

from __future__ import annotations

from dataclasses import dataclass

from collapipe_flwr.spec_parsing import require


@dataclass(frozen=True)
class RoundAdaptersSpec:
    """``every``: k, the rounds between two adapter folders (0 = none); ``keep``: how many of the newest stay
    (0 = all of them)."""

    every: int = 1
    keep: int = 5

    def __post_init__(self) -> None:
        require(
            self.every >= 0,
            f"round_adapters.every={self.every} must be >= 0: the adapters are saved after every k-th round "
            "(1 = each round, 0 = never)",
        )
        require(
            self.keep >= 0,
            f"round_adapters.keep={self.keep} must be >= 0: how many of the newest rounds' adapters stay (0 = all)",
        )

    def due(self, t: int, last: int) -> bool:
        """Whether round t's adapters are saved: every k-th round and the last one (``last``), unless k is 0."""
        return self.every > 0 and (t % self.every == 0 or t == last)
