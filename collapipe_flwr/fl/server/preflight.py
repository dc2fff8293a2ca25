"""Checks the server can make before any CU is asked anything: the clusters' data partitions D_n.

Every CU computes its own D_n from the training set (``Task.partition``: seeded, so every machine gets the same
split). A split that cannot be made (fewer training examples than clusters, a Dirichlet draw that leaves a
cluster empty, label schemes on a task without labels) used to surface only in the CUs' first round, as a
traceback and "example index 3 is out of range". The server holds the same data folder in a simulation and
usually in a deployment, so it computes every D_n once at start-up and refuses the run with one line naming the
cluster and the fix. It runs first in ``ServerState.build``, right after the task, before the model and the
workload probe (a few training examples through the embedding), which on too few examples failed 21 s in with
that index error instead. A server without the training file (a deployment whose server keeps only the validation
data) skips the check: its CUs still refuse a bad split themselves.

What it costs: counting the training examples (0.3 s for Multi30K here). ``iid`` with N <= |D| can leave no
cluster empty, so its partitions are not drawn; every other scheme's are (flwr-datasets builds each one: about
0.5 s per cluster for Toutiao's 24k titles on this machine, so N = 3 costs ~1.5 s and N = 100 ~20 s, the same
work each CU does for its own D_n).
"""

from __future__ import annotations

import logging

from collapipe_flwr.errors import ConfigError
from collapipe_flwr.tasks.base import Task
from collapipe_flwr.tasks.partition import Partition

log = logging.getLogger(__name__)


def check_partitions(task: Task, num_clusters: int, batch_size: int) -> list[int]:
    """Each cluster n's |D_n| (all >= 1); a ConfigError naming the first cluster whose D_n cannot be made or is
    empty. ``batch_size`` (b) only shapes the message: a D_n smaller than b still trains, on short batches."""
    try:
        total = len(task.train_examples())
    except (OSError, FileNotFoundError) as err:  # the server has no training data: the CUs check their own
        log.info("partition check skipped: the server cannot read the training set (%s)", err)
        return []
    if num_clusters > total:
        raise ConfigError(
            f"cannot split {total} training examples into {num_clusters} clusters' partitions; use at most {total} "
            "clusters (federation.num_clusters)"
        )
    if task.spec.partition is Partition.IID:  # equal shares of >= 1 example each: nothing can be empty
        return [total // num_clusters + (n < total % num_clusters) for n in range(num_clusters)]
    sizes = []
    for n in range(num_clusters):
        try:
            size = len(task.partition(num_clusters, n))
        except ConfigError as err:
            raise ConfigError(f"cannot make cluster {n}'s data partition: {err}") from None
        if size == 0:
            raise ConfigError(
                f"cluster {n}'s data partition D_{n} is empty ({total} training examples over {num_clusters} "
                f"clusters, task.partition={task.spec.partition}); use fewer clusters or another task.partition"
            )
        sizes.append(size)
    if min(sizes) < batch_size:
        log.warning(
            "the smallest data partition holds %d examples, fewer than the batch size b=%d", min(sizes), batch_size
        )
    return sizes
