"""The command line of a tiny central training run (``collapipe_flwr.apps.train_central``) for the tests."""

from __future__ import annotations


def tiny_classification_args(data_dir, train_examples: int) -> list[str]:
    """bert_tiny on classification, 3 steps over ``train_examples`` training examples, 32 validation examples,
    quiet; the test adds its own flags."""
    return [
        "task=classification",
        "model=bert_tiny",
        f"data_dir={data_dir}",
        "eval.max_examples=32",
        "--max-steps",
        "3",
        "--train-examples",
        str(train_examples),
        "--quiet",
    ]
