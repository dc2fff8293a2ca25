"""Which training examples cluster n's CU reads: D_n of the paper (Section III.A), via flwr-datasets.

- ``iid``: the examples are shuffled with ``seed`` and cut into N nearly equal contiguous shards
  (IidPartitioner on the shuffled index);
- ``quantity``: IID content, skewed sizes: partition n's share grows with n as ``task.quantity`` says
  (``linear``: n + 1, ``square``: (n + 1)^2, ``exponential``: e^n; flwr-datasets' Linear / Square /
  ExponentialPartitioner on the shuffled index);
- ``dirichlet``: label-skewed shares drawn from Dir(alpha) per class (DirichletPartitioner over the ``label``
  column; smaller alpha = more skew);
- ``pathological``: partition n holds k = ``task.classes_per_partition`` classes only, classes n .. n + k - 1
  (mod C) (PathologicalPartitioner, deterministic assignment); with N + k - 1 < C classes the examples of the
  classes no partition draws are left out;
- ``domain``: one corpus per cluster: the task's training corpora (``train_file`` and each of
  ``extra_train_files``) are the domains, cluster n reads domain n mod D, and the clusters of one domain
  split it IID.

The label of the label-skewed kinds is the task's ``partition_labels()`` (the class of a title; for NER and
translation a documented proxy, see each task). Every kind returns indices into the task's train examples; the
same arguments give the same indices, and the N partitions are disjoint and together cover every example (but
for the classes a pathological split leaves out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.spec_parsing import choice


class Partition(StrEnum):
    """``task.partition``: how the training set is split into the clusters' D_n (docs/partitions.md)."""

    IID = "iid"
    QUANTITY = "quantity"
    DIRICHLET = "dirichlet"
    PATHOLOGICAL = "pathological"
    DOMAIN = "domain"

    @property
    def by_label(self) -> bool:
        """Whether the split reads each example's class (``dirichlet``, ``pathological``)."""
        return self in (Partition.DIRICHLET, Partition.PATHOLOGICAL)


class QuantityShape(StrEnum):
    """``task.quantity``: how the shares grow with the partition id under ``partition: quantity``."""

    LINEAR = "linear"
    SQUARE = "square"
    EXPONENTIAL = "exponential"


SCHEMES = tuple(Partition)
QUANTITY_SHAPES = tuple(QuantityShape)


@dataclass(frozen=True)
class Skew:
    """How uneven a non-IID kind makes the partitions (the task config's settings of the same names; each kind
    reads its own): ``alpha`` and ``min_partition_size`` for ``dirichlet``, ``quantity`` for ``quantity``,
    ``classes_per_partition`` for ``pathological``."""

    alpha: float = 0.5
    min_partition_size: int = 1
    quantity: QuantityShape = QuantityShape.LINEAR
    classes_per_partition: int = 2


def partition_indices(
    num_examples: int,
    num_partitions: int,
    partition_id: int,
    seed: int,
    scheme: str = "iid",
    labels: Sequence[int] | None = None,
    skew: Skew | None = None,
) -> list[int]:
    """Indices (ascending) of partition ``partition_id`` of ``num_partitions`` over ``num_examples``. ``labels``:
    one per example, the class for ``dirichlet`` / ``pathological``, the corpus for ``domain``; ``skew``: the
    non-IID kinds' settings (default: ``Skew()``)."""
    skew = skew if skew is not None else Skew()
    kind = _check_arguments(num_examples, num_partitions, partition_id, scheme)
    if kind is Partition.DOMAIN:
        return _domain_partition(num_partitions, partition_id, seed, _checked_labels(labels, num_examples, kind))
    if kind.by_label:
        _checked_labels(labels, num_examples, kind)
    partitioner = _PARTITIONERS[kind](num_partitions, seed, skew)
    partitioner.dataset = _index_dataset(num_examples, labels if kind.by_label else None, seed, kind)
    try:
        part = partitioner.load_partition(partition_id)
    except ValueError as err:
        raise ConfigError(
            f"task.partition={kind} over {num_partitions} partitions failed ({err}); "
            + ("raise task.alpha or use fewer clusters" if kind is Partition.DIRICHLET else "use fewer clusters")
        ) from None
    return _sorted_indices(part)


def _sorted_indices(part) -> list[int]:
    """The ``idx`` column of a partition, ascending, as Python ints. Read as one Arrow column through the
    partition's indices mapping: iterating ``part["idx"]`` formats every row on its own (0.4 s for a third of
    Multi30K on a 2.5 GHz core, paid by every CU at hello and at its first round); the column read ~20 ms."""
    import numpy as np

    return np.sort(part.with_format("arrow")[:]["idx"].to_numpy()).tolist()


def _check_arguments(num_examples: int, num_partitions: int, partition_id: int, scheme: str) -> Partition:
    """``scheme`` as its Partition, once the partition's arguments are checked."""
    kind = choice("task.partition", scheme, Partition)
    if not isinstance(num_partitions, int) or num_partitions < 1:
        raise ConfigError(f"num_partitions={num_partitions!r} must be an integer >= 1")
    if not isinstance(partition_id, int) or not 0 <= partition_id < num_partitions:
        raise ConfigError(f"partition_id={partition_id!r} must be in 0..{num_partitions - 1}")
    if num_partitions > num_examples:
        raise ConfigError(
            f"cannot split {num_examples} training examples into {num_partitions} partitions; use fewer clusters"
        )
    return kind


def _checked_labels(labels: Sequence[int] | None, num_examples: int, scheme: str) -> Sequence[int]:
    if labels is None:
        raise ConfigError(
            f"task.partition={scheme} needs a label per training example; this task has none, use partition=iid "
            "or quantity"
        )
    if len(labels) != num_examples:
        raise ValueError(f"{len(labels)} labels for {num_examples} examples")
    return labels


def _iid(num_partitions: int, seed: int, skew: Skew):
    """IID content in equal shares."""
    from flwr_datasets.partitioner import IidPartitioner

    return IidPartitioner(num_partitions=num_partitions)


def _by_quantity(num_partitions: int, seed: int, skew: Skew):
    """IID content in shares growing with the partition id as ``skew.quantity`` says."""
    from flwr_datasets.partitioner import ExponentialPartitioner, LinearPartitioner, SquarePartitioner

    shapes = {
        QuantityShape.LINEAR: LinearPartitioner,
        QuantityShape.SQUARE: SquarePartitioner,
        QuantityShape.EXPONENTIAL: ExponentialPartitioner,
    }
    return shapes[choice("task.quantity", skew.quantity, QuantityShape)](num_partitions=num_partitions)


def _dirichlet(num_partitions: int, seed: int, alpha: float, min_partition_size: int):
    from flwr_datasets.partitioner import DirichletPartitioner

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


def _pathological(num_partitions: int, seed: int, classes_per_partition: int):
    from flwr_datasets.partitioner import PathologicalPartitioner

    if not isinstance(classes_per_partition, int) or classes_per_partition < 1:
        raise ConfigError(f"task.classes_per_partition={classes_per_partition!r} must be an integer >= 1")
    return PathologicalPartitioner(
        num_partitions=num_partitions,
        partition_by="label",
        num_classes_per_partition=classes_per_partition,
        class_assignment_mode="deterministic",
        shuffle=True,
        seed=seed,
    )


# task.partition (but domain, which flwr-datasets cannot split) -> its partitioner, from (N, seed, skew)
_PARTITIONERS: dict[Partition, Callable[[int, int, Skew], Any]] = {
    Partition.IID: _iid,
    Partition.QUANTITY: _by_quantity,
    Partition.DIRICHLET: lambda n, seed, skew: _dirichlet(n, seed, skew.alpha, skew.min_partition_size),
    Partition.PATHOLOGICAL: lambda n, seed, skew: _pathological(n, seed, skew.classes_per_partition),
}


def _domain_partition(num_partitions: int, partition_id: int, seed: int, domains: Sequence[int]) -> list[int]:
    """Cluster n reads domain n mod D; the clusters of one domain split it IID (shuffled, near-equal shards).
    Written here because flwr-datasets' natural-id partitioners map one id to one partition (or group ids),
    and a domain shared by several clusters is the case that matters (N > D)."""
    import numpy as np

    names = sorted(set(int(d) for d in domains))
    if len(names) < 2:
        raise ConfigError(
            "task.partition=domain needs two or more training corpora; name the others in task.extra_train_files"
        )
    if num_partitions < len(names):
        raise ConfigError(
            f"task.partition=domain with {len(names)} corpora needs at least {len(names)} clusters "
            f"(federation.num_clusters={num_partitions})"
        )
    domain = names[partition_id % len(names)]
    sharing = [n for n in range(num_partitions) if names[n % len(names)] == domain]
    members = np.array([i for i, d in enumerate(domains) if int(d) == domain])
    np.random.default_rng(seed).shuffle(members)
    shard = np.array_split(members, len(sharing))[sharing.index(partition_id)]
    return sorted(int(i) for i in shard)


def _index_dataset(num_examples: int, labels: Sequence[int] | None, seed: int, scheme: str):
    import datasets

    columns = {"idx": list(range(num_examples))}
    if labels is not None:
        columns["label"] = [int(y) for y in labels]
    dataset = datasets.Dataset.from_dict(columns)
    if scheme in (Partition.IID, Partition.QUANTITY):
        dataset = dataset.shuffle(seed=seed)
    return dataset
