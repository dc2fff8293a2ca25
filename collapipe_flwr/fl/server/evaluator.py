"""Evaluation of the full model (embedding -> encoder -> the server's head) on the validation split (and, under
``task.partition: domain``, on each extra domain's held-out validation: ``<metric>_domain<d>``,
tasks/domain_validation.py).

Runs between rounds on the server, holding the decoder's lock so no late data-plane step changes the
head mid-evaluation; without aggregation it scores each cluster's own embedding + encoder with the
server's head and reports the mean (the ``pipeline`` baseline). On a GPU (``runtime.server_device``) the
embedding and encoder are scored from copies on that device; the head is used where it is.
"""

from __future__ import annotations

import copy

import torch

from collapipe_flwr.accelerator import module_device
from collapipe_flwr.config import EvalSpec
from collapipe_flwr.fl.server.decoder.service import DecoderService
from collapipe_flwr.fl.server.threads import torch_threads
from collapipe_flwr.models.split import SplitModel
from collapipe_flwr.pipeline.executors import usable_cores
from collapipe_flwr.precision import autocast
from collapipe_flwr.tasks.base import Task


class Evaluator:
    """``evaluate(models)``: the task's metrics of each model, averaged over the models."""

    def __init__(
        self,
        task: Task,
        spec: EvalSpec,
        precision: str,
        decoder: DecoderService,
        device: torch.device | None = None,
    ) -> None:
        self.task = task
        self.spec = spec
        self.precision = precision
        self.decoder = decoder
        self.device = device if device is not None else torch.device("cpu")

    def evaluate(self, models: list[SplitModel]) -> dict[str, float]:
        with self.decoder.head_locked(), torch_threads(usable_cores()):  # no CU trains meanwhile (fl/server/threads.py)
            scores = [self._score(model) for model in models]
        return {k: sum(s[k] for s in scores) / len(scores) for k in scores[0]}

    def _score(self, model: SplitModel) -> dict[str, float]:
        ev = self.spec
        model = on_device(model, self.device)
        model.eval()
        try:
            with torch.no_grad(), autocast(self.precision, self.device.type):
                metrics: dict[str, float] = {}
                for split in ["val", *self.task.domain_validation_splits()]:  # domain splits: task.partition=domain
                    scores = self.task.evaluate(
                        model,
                        max_examples=ev.max_examples,
                        batch_size=ev.batch_size,
                        beam_size=ev.beam_size,
                        split=split,
                    )
                    suffix = "" if split == "val" else "_" + split.removeprefix("val_")
                    metrics.update({f"{k}{suffix}": v for k, v in scores.items()})
        finally:
            model.train()
        return metrics


def on_device(model: SplitModel, device: torch.device) -> SplitModel:
    """``model`` with every part on ``device``: the parts already there as they are, the others as copies (the
    server's own modules never move)."""

    def there(module):
        return module if module_device(module) == device else copy.deepcopy(module).to(device)

    if all(module_device(part) == device for part in (model.embedding, model.blocks, model.head)):
        return model
    return SplitModel(there(model.embedding), there(model.blocks), there(model.head), model.family)
