"""D_n partitions via flwr-datasets (IID, quantity skew, Dirichlet and pathological label skew) and by corpus
(domain skew): reproducible, disjoint, covering; each skew checked against what it promises."""

from __future__ import annotations

from collections import Counter

import pytest

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.tasks.partition import Skew, partition_indices


def _all(n, N, seed, **kw):
    return [partition_indices(n, N, pid, seed, **kw) for pid in range(N)]


def test_iid_partitions_are_disjoint_cover_everything_and_balanced():
    parts = _all(1003, 4, seed=7)
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(1003))
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def test_iid_partitions_are_reproducible_and_seeded():
    assert _all(500, 3, seed=1) == _all(500, 3, seed=1)
    assert _all(500, 3, seed=1) != _all(500, 3, seed=2)
    # shuffled, not contiguous blocks of the file
    assert partition_indices(500, 2, 0, seed=1) != list(range(250))


def test_dirichlet_partitions_skew_labels_and_cover_everything():
    labels = [i % 5 for i in range(2000)]
    parts = _all(2000, 4, seed=3, scheme="dirichlet", labels=labels, skew=Skew(alpha=0.1))
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(2000))
    assert parts == _all(2000, 4, seed=3, scheme="dirichlet", labels=labels, skew=Skew(alpha=0.1))
    # with alpha = 0.1 some partition holds a class at more than twice its global share (0.2)
    shares = [max(Counter(labels[i] for i in p).values()) / len(p) for p in parts if p]
    assert max(shares) > 0.4


def test_bad_partition_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="partition_id"):
        partition_indices(10, 2, 2, seed=0)
    with pytest.raises(ConfigError, match="fewer clusters"):
        partition_indices(3, 5, 0, seed=0)
    with pytest.raises(ConfigError, match="iid"):
        partition_indices(10, 2, 0, seed=0, scheme="dirichlet", labels=None)
    with pytest.raises(ConfigError, match="task.partition"):
        partition_indices(10, 2, 0, seed=0, scheme="by_moon_phase")
    with pytest.raises(ConfigError, match="task.quantity"):
        partition_indices(10, 2, 0, seed=0, scheme="quantity", skew=Skew(quantity="cubic"))
    with pytest.raises(ConfigError, match="two or more training corpora"):
        partition_indices(10, 2, 0, seed=0, scheme="domain", labels=[0] * 10)
    with pytest.raises(ConfigError, match="at least 3 clusters"):
        partition_indices(9, 2, 0, seed=0, scheme="domain", labels=[0, 1, 2] * 3)


@pytest.mark.parametrize("shape,weight", [("linear", lambda n: n + 1), ("square", lambda n: (n + 1) ** 2)])
def test_quantity_skew_sizes_follow_the_shape_and_content_stays_iid(shape, weight):
    parts = _all(3000, 4, seed=5, scheme="quantity", skew=Skew(quantity=shape))
    assert sorted(i for p in parts for i in p) == list(range(3000))
    total = sum(weight(n) for n in range(4))
    for n, part in enumerate(parts):  # sizes by the shape's weights, to rounding
        assert abs(len(part) - 3000 * weight(n) / total) <= 2
    assert parts[0] != list(range(len(parts[0])))  # shuffled, not the first examples of the file


def test_pathological_partitions_hold_only_their_classes():
    labels = [i % 6 for i in range(1200)]
    parts = _all(1200, 6, seed=2, scheme="pathological", labels=labels, skew=Skew(classes_per_partition=2))
    assert sorted(i for p in parts for i in p) == list(range(1200))
    assert [sorted({labels[i] for i in p}) for p in parts] == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [0, 5]]
    few = _all(1200, 3, seed=2, scheme="pathological", labels=labels, skew=Skew(classes_per_partition=2))
    assert {labels[i] for p in few for i in p} == {0, 1, 2, 3}  # N + k - 1 < C: classes 4 and 5 are left out


def test_domain_skew_gives_each_cluster_one_corpus_and_splits_a_shared_one():
    domains = [0] * 600 + [1] * 300  # e.g. People's Daily, then the MSRA supplement
    parts = _all(900, 4, seed=1, scheme="domain", labels=domains)
    assert sorted(i for p in parts for i in p) == list(range(900))
    assert [{domains[i] for i in p} for p in parts] == [{0}, {1}, {0}, {1}]
    assert [len(p) for p in parts] == [300, 150, 300, 150]
    assert parts == _all(900, 4, seed=1, scheme="domain", labels=domains)


@pytest.mark.parametrize(
    "scheme,labels",
    [
        ("iid", None),
        ("quantity", None),
        ("dirichlet", [i % 3 for i in range(600)]),
        ("pathological", [i % 4 for i in range(600)]),
    ],
)
def test_the_column_read_gives_the_partitioners_rows_one_by_one(scheme, labels):
    """The partition's idx column read at once (Arrow) holds exactly the rows flwr-datasets' partitioner yields
    when read one row at a time (how the indices were read before: kept runs keep their D_n), as Python ints."""
    from collapipe_flwr.tasks import partition as P

    skew = Skew()
    for pid in range(3):
        partitioner = P._PARTITIONERS[P.Partition(scheme)](3, 5, skew)
        partitioner.dataset = P._index_dataset(600, labels, 5, scheme)
        rows = sorted(int(row["idx"]) for row in partitioner.load_partition(pid))
        got = partition_indices(600, 3, pid, 5, scheme=scheme, labels=labels)
        assert got == rows
        assert all(type(i) is int for i in got)
