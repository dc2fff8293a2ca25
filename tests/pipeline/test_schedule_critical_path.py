"""gpipe_critical_path_s against GPipe's clock count by hand, the flow-shop closed form and a longest path."""

from __future__ import annotations

import functools
import importlib.util
import random
import sys

import pytest

from collapipe_flwr.pipeline.schedule import gpipe_critical_path_s
from tests.paths import ROOT
from tests.workloads import random_call_times


@pytest.fixture(scope="module")
def bench():
    """benchmarks/pipeline_overhead.py as a module (it is a script, not in a package), loaded once."""
    path = ROOT / "benchmarks" / "pipeline_overhead.py"
    spec = importlib.util.spec_from_file_location("pipeline_overhead_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("S", "m"), [(1, 1), (1, 4), (2, 4), (3, 2), (4, 8)])
def test_equal_calls_take_s_plus_m_minus_1_clock_cycles_each_way(S, m):
    f, b = 0.07, 0.1
    got = gpipe_critical_path_s([[f] * S for _ in range(m)], [[b] * S for _ in range(m)])
    assert got == pytest.approx((S + m - 1) * (f + b))  # eq. (15)'s (S + m - 1) cycles, forward and backward


def test_unequal_stages_follow_the_flow_shop_closed_form():
    # identical micro-batches through stages of unequal speed: sum_k t_k + (m - 1) max_k t_k per pass
    fs, bs, m = [0.05, 0.2, 0.1], [0.3, 0.1, 0.15], 5
    got = gpipe_critical_path_s([fs] * m, [bs] * m)
    assert got == pytest.approx(sum(fs) + (m - 1) * max(fs) + sum(bs) + (m - 1) * max(bs))


def _longest_path(forward, backward):
    """The same step as a DAG of calls, each call's finish the max over its predecessors' plus its own time."""
    m, S = len(forward), len(forward[0])

    @functools.cache
    def fin_f(i, k):
        preds = [fin_f(i - 1, k)] if i else []
        preds += [fin_f(i, k - 1)] if k else []
        return max(preds, default=0.0) + forward[i][k]

    @functools.cache
    def fin_b(i, k):  # backward order: i = m-1 .. 0 on each stage, stage S-1 first
        preds = [fin_b(i + 1, k)] if i < m - 1 else []
        preds += [fin_b(i, k + 1)] if k < S - 1 else [fin_f(m - 1, S - 1)]
        return max(preds) + backward[i][k]

    return max(fin_b(i, k) for i in range(m) for k in range(S))


def test_random_call_times_match_the_longest_path_through_the_calls():
    rng = random.Random(0)
    for _ in range(50):
        S, m = rng.randint(1, 5), rng.randint(1, 8)
        forward, backward = random_call_times(rng, S, m)
        assert gpipe_critical_path_s(forward, backward) == pytest.approx(_longest_path(forward, backward))


def test_mismatched_call_tables_are_refused():
    with pytest.raises(ValueError, match="m x S call times"):
        gpipe_critical_path_s([[0.1, 0.1]], [[0.1]])
    with pytest.raises(ValueError, match="m x S call times"):
        gpipe_critical_path_s([], [])


def test_the_benchmarks_step_bound_reads_each_call_from_the_device_traces(bench):
    from collapipe_flwr.pipeline.timings import StepTimings

    # stage 0 forwards 0.1 s, backwards 0.2 s; stage 1 forwards 0.3 s, backwards 0.1 s; m = 2 (wall clocks apart)
    traces = [
        [("F", 0, 10.0, 10.1), ("F", 1, 10.1, 10.2), ("B", 1, 11.0, 11.2), ("B", 0, 11.2, 11.4)],
        [("F", 0, 50.0, 50.3), ("F", 1, 50.3, 50.6), ("B", 1, 51.0, 51.1), ("B", 0, 51.1, 51.2)],
    ]
    timings = StepTimings(embed=0.01, forward=0.7, head=0.02, backward=0.6, update=0.03, total=1.5)
    got = bench.step_bound(traces, timings, s1_compute_s=1.0)
    # by hand: forward 0.1 + 0.3 + 0.3 = 0.7 (stage 1 the slower); backward 0.1 + 0.2 + 0.2 = 0.5
    assert got["critical_path_s"] == pytest.approx(1.2)
    assert got["bound_s"] == pytest.approx(1.26)
    assert got["over_bound"] == pytest.approx(1.5 / 1.26)
    assert got["microbatch_inflation"] == pytest.approx(0.2 + 0.4 + 0.6 + 0.2)


@pytest.mark.parametrize("m", [1, 2, 4, 8])
@pytest.mark.parametrize("c", [1.0, 1.2, 1.5])
def test_the_benchmarks_gpipe_limit_at_a_pair_slowdown_is_the_critical_path_of_slowed_overlapping_calls(bench, m, c):
    # S = 2, forwards 1 s and backwards 2 s alone: in GPipe's clock stage 0's call on i overlaps stage 1's on i - 1
    # (forward) and stage 1's call on i overlaps stage 0's on i + 1 (backward, descending i), so in both passes
    # stage 0's calls i >= 1 and stage 1's calls i <= m - 2 run beside another and take c times as long
    f, b = 1.0, 2.0
    forward = [[f * (c if i >= 1 else 1.0), f * (c if i <= m - 2 else 1.0)] for i in range(m)]
    backward = [[b * (c if i >= 1 else 1.0), b * (c if i <= m - 2 else 1.0)] for i in range(m)]
    one_device = 2 * m * (f + b)  # S = 1, m = 1: the whole batch through both stages' blocks, alone
    got = bench.gpipe_limit_S2(m, c)
    assert got == pytest.approx(gpipe_critical_path_s(forward, backward) / one_device)
    if c == 1.0:
        assert got == pytest.approx((m + 2 - 1) / (2 * m))  # GPipe's (m + S - 1) / (S m)
