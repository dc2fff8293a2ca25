"""runtime.pin_threads: the core sets of a host's device actors (executors.core_sets), checked against
hand-written sets and by brute force over host sizes, and the config key's validation."""

from __future__ import annotations

import pytest

from collapipe_flwr.config import build_run_config, compose
from collapipe_flwr.errors import ConfigError
from collapipe_flwr.pipeline.executors import core_sets
from collapipe_flwr.pipeline.runtime_spec import parse_runtime


@pytest.mark.parametrize(
    "cores,S,mode,want",
    [
        ([0, 1], 2, "auto", [(0,), (1,)]),  # as many cores as stages: one each, the CU shares
        ([0, 1], 1, "auto", [(1,)]),  # a spare core: core 0 left to the CU
        ([0, 1, 2, 3], 2, "auto", [(1, 2), (3,)]),  # 3 cores for 2 stages: the first gets the extra one
        (list(range(8)), 3, "auto", [(1, 2, 3), (4, 5), (6, 7)]),
        ([4, 5, 6, 7], 3, "auto", [(5,), (6,), (7,)]),  # the numbers the process may use, not 0..C-1
        ([0, 1], 3, "auto", None),  # fewer cores than stages: auto does not pin
        ([0, 1], 3, "true", [(0,), (1,), (0,)]),  # true: round-robin, two stages share core 0
        (list(range(8)), 3, "false", None),
    ],
)
def test_core_sets_by_hand(cores, S, mode, want):
    assert core_sets(cores, S, mode) == want


def test_core_sets_are_disjoint_and_balanced_whenever_there_are_enough_cores():
    for C in range(1, 17):
        for S in range(1, C + 1):
            sets = core_sets(range(C), S, "auto")
            assert sets is not None and len(sets) == S
            flat = [c for s in sets for c in s]
            assert len(flat) == len(set(flat)), (C, S, sets)  # disjoint
            assert all(sets), (C, S)  # every stage has a core
            assert set(flat) == set(range(1 if C > S else 0, C))  # every core used, core 0 left to the CU if spare
            sizes = [len(s) for s in sets]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_a_bad_mode_names_the_key():
    with pytest.raises(ConfigError, match=r"^runtime.pin_threads='yes' must be one of auto, true, false$"):
        core_sets([0, 1], 2, "yes")
    with pytest.raises(ConfigError, match=r"runtime.pin_threads"):
        build_run_config(compose(["runtime.pin_threads=sometimes"]))


def test_yaml_booleans_are_read_as_modes():
    assert parse_runtime({"pin_threads": True}).pin_threads == "true"
    assert parse_runtime({"pin_threads": False}).pin_threads == "false"
    assert parse_runtime({}).pin_threads == "false"  # off unless asked: CUs sharing a host pin blind to each other
