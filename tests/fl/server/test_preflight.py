"""The server refuses, at start-up and before any CU is asked, a run whose data partitions cannot be made
(issue 45: they used to fail only in the CUs' first round, "example index 3 is out of range")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.fl.server.preflight import check_partitions
from collapipe_flwr.fl.server.server_main import run_server
from collapipe_flwr.tasks.partition import Skew, partition_indices
from tests.inprocess_grid import InProcessGrid


class _Corpus:
    """A task of ``n`` training examples with labels, partitioned by the project's real partitioner."""

    def __init__(self, n: int, scheme: str, labels: list[int] | None = None, **kw) -> None:
        self.n, self.labels, self.kw = n, labels, kw
        self.spec = SimpleNamespace(partition=scheme)

    def train_examples(self):
        return tuple(range(self.n))

    def partition(self, num_partitions: int, partition_id: int) -> list[int]:
        scheme = self.spec.partition
        return partition_indices(self.n, num_partitions, partition_id, 0, scheme, self.labels, Skew(**self.kw))


def test_more_clusters_than_examples_is_one_line_naming_the_limit():
    with pytest.raises(ConfigError, match="cannot split 5 training examples into 6 clusters.*at most 5"):
        check_partitions(_Corpus(5, "iid"), 6, batch_size=2)
    assert check_partitions(_Corpus(5, "iid"), 5, batch_size=2) == [1, 1, 1, 1, 1]


def test_a_split_that_leaves_a_cluster_empty_names_the_cluster():
    """exponential quantity shares over 12 clusters of 40 examples: the first clusters get nothing (by hand:
    2^n / (2^12 - 1) x 40 < 1 for n < 6), which flwr-datasets refuses; a Dirichlet draw that empties a cluster
    is refused too."""
    with pytest.raises(ConfigError, match=r"cannot make cluster 0's data partition: .*use fewer clusters"):
        check_partitions(_Corpus(40, "quantity", quantity="exponential"), 12, batch_size=4)
    labels = [i % 2 for i in range(40)]
    with pytest.raises(ConfigError, match=r"cannot make cluster 0's data partition: .*raise task.alpha"):
        check_partitions(_Corpus(40, "dirichlet", labels, alpha=0.01), 30, batch_size=4)


def test_a_task_without_training_data_on_the_server_is_not_judged():
    class _NoTrain(_Corpus):
        def train_examples(self):
            raise FileNotFoundError("train.de")

    assert check_partitions(_NoTrain(5, "iid"), 6, batch_size=2) == []


class _Silent(InProcessGrid):
    """Counts the messages the server sends."""

    sent = 0

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        _Silent.sent += len(messages)
        return super().send_and_receive(messages, timeout)


def test_a_run_whose_split_cannot_be_made_fails_before_any_cu_is_asked(data_dir, tmp_path):
    overrides = (
        "task=translation model=transformer_tiny federation=tiny network=small runtime.backend=local "
        "task.partition=quantity task.quantity=exponential federation.num_clusters=24 run_name=bad"
    )
    grid = _Silent(24, str(data_dir))
    with pytest.raises(ConfigError, match="cannot make cluster 0's data partition: task.partition=quantity over 24"):
        run_server(grid, {"overrides": overrides, "data-dir": str(data_dir), "output-dir": str(tmp_path)})
    assert _Silent.sent == 0


def _small_multi30k(data_dir, folder, lines: int) -> None:
    """A data folder whose Multi30K training files hold their first ``lines`` pairs (validation: the real ones)."""
    small = folder / "multi30k" / "tok"
    small.mkdir(parents=True)
    for name in ("train.lc.norm.tok.de", "train.lc.norm.tok.en"):
        text = (data_dir / "multi30k" / "tok" / name).read_text(encoding="utf-8")
        small.joinpath(name).write_text("".join(text.splitlines(keepends=True)[:lines]), encoding="utf-8")
    for name in ("val.lc.norm.tok.de", "val.lc.norm.tok.en"):
        small.joinpath(name).symlink_to(data_dir / "multi30k" / "tok" / name)


def test_partitions_too_small_for_the_clusters_are_refused_before_the_servers_probe(data_dir, tmp_path, cache):
    """4 clusters over 3-line training files: the partition check, not the 8-example workload probe ("example
    index 3 is out of range", 21 s in), refuses the run, in one line, before any CU is asked."""
    _small_multi30k(data_dir, tmp_path / "data", lines=3)
    overrides = (
        "task=translation model=transformer_tiny federation=tiny network=small runtime.backend=local "
        "federation.num_clusters=4 run_name=small"
    )
    grid = _Silent(4, str(tmp_path / "data"))
    _Silent.sent = 0
    with pytest.raises(ConfigError) as info:
        run_server(grid, {"overrides": overrides, "data-dir": str(tmp_path / "data"), "output-dir": str(tmp_path)})
    message = str(info.value)
    assert "\n" not in message and "cannot split 3 training examples into 4 clusters" in message, message
    assert "federation.num_clusters" in message and "out of range" not in message
    assert _Silent.sent == 0


def test_the_servers_probe_takes_no_more_examples_than_the_training_set_holds(data_dir, tmp_path, cache):
    """3 training examples over 2 clusters is a valid split: the 8-example probe takes the 3 there are."""
    from collapipe_flwr.config import load_run_config
    from collapipe_flwr.fl.server.server_state import ServerState

    _small_multi30k(data_dir, tmp_path / "data", lines=3)
    overrides = [
        "task=translation", "model=transformer_tiny", "federation=tiny", "network=small", "runtime.backend=local",
        "federation.num_clusters=2", "task.batch_size=8", "clock.host_flops=1e9",
    ]  # fmt: skip
    server = ServerState.build(load_run_config(overrides, data_dir=str(tmp_path / "data")))
    try:
        assert server.workload.forward_flops[0] > 0
    finally:
        server.shutdown()
