"""Evaluation of the full model (embedding -> encoder -> the server's head) on the validation split.

Runs between rounds on the server, holding the decoder's lock so no late data-plane step changes the
head mid-evaluation; without aggregation it scores each cluster's own embedding + encoder with the
server's head and reports the mean (the ``pipeline`` baseline).
"""

from __future__ import annotations

import torch

from collapipe_flwr.config import EvalSpec
from collapipe_flwr.fl.decoder_service import DecoderService
from collapipe_flwr.models.split import SplitModel
from collapipe_flwr.precision import autocast
from collapipe_flwr.tasks.base import Task


class Evaluator:
    """``evaluate(models)``: the task's metrics of each model, averaged over the models."""

    def __init__(self, task: Task, spec: EvalSpec, precision: str, decoder: DecoderService) -> None:
        self.task = task
        self.spec = spec
        self.precision = precision
        self.decoder = decoder

    def evaluate(self, models: list[SplitModel]) -> dict[str, float]:
        with self.decoder.head_locked():
            scores = [self._score(model) for model in models]
        return {k: sum(s[k] for s in scores) / len(scores) for k in scores[0]}

    def _score(self, model: SplitModel) -> dict[str, float]:
        ev = self.spec
        model.eval()
        try:
            with torch.no_grad(), autocast(self.precision):
                metrics = self.task.evaluate(
                    model, max_examples=ev.max_examples, batch_size=ev.batch_size, beam_size=ev.beam_size
                )
        finally:
            model.train()
        return dict(metrics)
