"""Examples are encoded on demand (``Task.features_at``): a CU tokenises its own partition, not the whole split, and
gets the batches rebuilt here by hand from the same examples encoded in another order (each example's encoding
stands alone) and ordered by ``batch_order`` with their lengths."""

from __future__ import annotations

import pytest
import torch

from collapipe_flwr.tasks import batching
from collapipe_flwr.tasks.registry import build_task
from tests.task_specs import specs

CASES = [("translation", "transformer_tiny"), ("classification", "bert_tiny"), ("ner", "bert_tiny")]


def _length(feature: dict) -> int:
    """A feature's token length as each task's bucketing counts it."""
    if "src" in feature:
        return len(feature["src"]) + len(feature["tgt"])
    return len(feature["input_ids"])


@pytest.mark.parametrize(("task_name", "model"), CASES)
def test_a_partitions_batches_equal_those_of_the_whole_split_encoded_at_once(data_dir, task_name, model):
    task = build_task(*specs(task_name, model), data_dir, seed=0)
    indices = task.partition(3, 1)[:300]  # one CU of three, a prefix of its D_n
    got = list(task.batches(indices, 16, seed=7))
    assert len(task._features["train"]) == len(set(indices))  # only this partition's examples were tokenised

    other = build_task(*specs(task_name, model), data_dir, seed=0)
    examples = other.examples("train")
    chosen = sorted(set(indices), reverse=True)  # encoded in another order and company than features_at's
    every = dict(zip(chosen, other.encode([examples[i] for i in chosen]), strict=True))
    lengths = {i: _length(f) for i, f in every.items()}
    order = batching.batch_order(indices, 16, 7, True, False, lengths, other.spec.bucket)
    assert other.spec.bucket > 1  # the length-bucketed order is the one compared
    expected = [other.collate([every[i] for i in batch]) for batch in order]
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), key


def test_an_evaluation_encodes_only_the_examples_it_scores(data_dir):
    task = build_task(*specs("classification", "bert_tiny"), data_dir, seed=0)
    model = task.build_model(0)
    metrics = task.evaluate(model, max_examples=40, batch_size=16)
    assert metrics["examples"] == 40.0
    assert sorted(task._features["val"]) == list(range(40))
