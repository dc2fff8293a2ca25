"""Each domain's own validation data under ``task.partition: domain``.

With domain skew every cluster trains on one corpus (tasks/partition.py): ``train_file`` is domain 0, each of
``extra_train_files`` a further domain d = 1, 2, ... The main corpus has its own validation file (the ``val``
split, the global validation every run reports); the extra corpora ship as one file each, so each keeps a held-out
slice of itself out of training as its domain's validation: split ``val_domain<d>``, min(1,000, 10% of the
corpus) examples picked by a generator seeded with d alone, so every run and seed holds out the same examples
and none of them is ever trained on. The server then reports the global model's metric on the global validation
(``val_<metric>``) and on each domain's (``val_<metric>_domain<d>``): how well the average model serves each
cluster's own data.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

MAX_EXAMPLES = 1000  # per domain
FRACTION = 0.1  # of the domain's corpus, when that is fewer
SPLIT = re.compile(r"val_domain([1-9][0-9]*)")


def split_name(domain: int) -> str:
    """The split holding domain ``domain``'s held-out validation examples (domain >= 1)."""
    return f"val_domain{domain}"


def hold_out(examples: Sequence, corpus_sizes: Sequence[int]) -> tuple[list, list[int], dict[str, list]]:
    """(training examples left, their corpus sizes, {split name: held-out examples}) for the training examples of
    the corpora ``corpus_sizes`` (in file order, corpus 0 first; corpus 0 keeps all of its examples)."""
    train: list = []
    sizes: list[int] = []
    held: dict[str, list] = {}
    start = 0
    for domain, size in enumerate(corpus_sizes):
        corpus = list(examples[start : start + size])
        start += size
        if domain == 0:
            train.extend(corpus)
            sizes.append(len(corpus))
            continue
        count = min(MAX_EXAMPLES, int(len(corpus) * FRACTION))
        picked = set(np.random.default_rng(domain).permutation(len(corpus))[:count].tolist())
        held[split_name(domain)] = [x for i, x in enumerate(corpus) if i in picked]
        kept = [x for i, x in enumerate(corpus) if i not in picked]
        train.extend(kept)
        sizes.append(len(kept))
    return train, sizes, held
