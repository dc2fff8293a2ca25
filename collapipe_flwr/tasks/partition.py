"""Which training examples cluster n's CU reads: D_n of the paper (Section III.A), via flwr-datasets.

- ``iid``: the examples are shuffled with ``seed`` and cut into N nearly equal contiguous shards
  (IidPartitioner on the shuffled index);
- ``dirichlet``: label-skewed non-IID shares drawn from Dir(alpha) per class (DirichletPartitioner
  over the ``label`` column; smaller alpha = more skew).
Both return indices into the task's train examples; the same arguments give the same indices, and the
N partitions are disjoint and together cover every example.
"""

from __future__ import annotations

from collections.abc import Sequence

from collapipe_flwr.errors import ConfigError

SCHEMES = ("iid", "dirichlet")


def partition_indices(
    num_examples: int,
    num_partitions: int,
    partition_id: int,
    seed: int,
    scheme: str = "iid",
    labels: Sequence[int] | None = None,
    alpha: float = 0.5,
    min_partition_size: int = 1,
) -> list[int]:
    """Indices (ascending) of partition ``partition_id`` of ``num_partitions`` over ``num_examples``."""
    if scheme not in SCHEMES:
        raise ConfigError(f"task.partition={scheme!r} is not one of {', '.join(SCHEMES)}")
    if not isinstance(num_partitions, int) or num_partitions < 1:
        raise ConfigError(f"num_partitions={num_partitions!r} must be an integer >= 1")
    if not isinstance(partition_id, int) or not 0 <= partition_id < num_partitions:
        raise ConfigError(f"partition_id={partition_id!r} must be in 0..{num_partitions - 1}")
    if num_partitions > num_examples:
        raise ConfigError(
            f"cannot split {num_examples} training examples into {num_partitions} partitions; use fewer clusters"
        )
    partitioner = _build(scheme, num_partitions, seed, labels, alpha, min_partition_size, num_examples)
    partitioner.dataset = _index_dataset(num_examples, labels if scheme == "dirichlet" else None, seed, scheme)
    try:
        part = partitioner.load_partition(partition_id)
    except ValueError as err:
        raise ConfigError(
            f"Dirichlet partition with alpha={alpha} over {num_partitions} partitions failed ({err}); "
            "raise task.alpha or use fewer clusters"
        ) from None
    return sorted(int(i) for i in part["idx"])


def _build(scheme, num_partitions, seed, labels, alpha, min_partition_size, num_examples):
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner

    if scheme == "iid":
        return IidPartitioner(num_partitions=num_partitions)
    if labels is None:
        raise ConfigError("task.partition=dirichlet needs labelled examples; this task has none, use partition=iid")
    if len(labels) != num_examples:
        raise ValueError(f"{len(labels)} labels for {num_examples} examples")
    if not alpha > 0:
        raise ConfigError(f"task.alpha={alpha!r} must be > 0 (Dirichlet concentration)")
    return DirichletPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        alpha=float(alpha),
        min_partition_size=min_partition_size,
        self_balancing=False,
        shuffle=True,
        seed=seed,
    )


def _index_dataset(num_examples: int, labels: Sequence[int] | None, seed: int, scheme: str):
    import datasets

    columns = {"idx": list(range(num_examples))}
    if labels is not None:
        columns["label"] = [int(y) for y in labels]
    dataset = datasets.Dataset.from_dict(columns)
    if scheme == "iid":
        dataset = dataset.shuffle(seed=seed)
    return dataset
