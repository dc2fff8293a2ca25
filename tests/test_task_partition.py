"""D_n partitions: IID and Dirichlet-by-label via flwr-datasets; reproducible, disjoint, covering."""

from __future__ import annotations

from collections import Counter

import pytest

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.tasks.partition import partition_indices


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
    parts = _all(2000, 4, seed=3, scheme="dirichlet", labels=labels, alpha=0.1)
    flat = [i for p in parts for i in p]
    assert sorted(flat) == list(range(2000))
    assert parts == _all(2000, 4, seed=3, scheme="dirichlet", labels=labels, alpha=0.1)
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
        partition_indices(10, 2, 0, seed=0, scheme="pathological")
