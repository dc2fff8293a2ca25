"""The one example-weighted mean of FedAvg, for the server and the CUs: sum_n w_n theta_n and W = sum_n w_n, fed one
state at a time.

The round's aggregate of eqs. (6)-(7) (the example-weighted form the server uses: w_n = CU n's num-examples,
theta_n = its returned embedding + encoder theta_n^enc of eq. (4), flat) is

    theta_bar = sum_n w_n theta_n / W,

and a VanillaFL CU averages its D data users' models and optimizer moments the same way before it uploads one
(eq. (5)'s "simple averaging", ``fl/cu/data_parallel.py``; w_d = the examples user d trained on).

Flower's ``aggregate_arrayrecords`` computes sum_n (w_n / W) theta_n, which needs W before the first reply;
folding each state in as it arrives needs the sum first and the division last, so the holder keeps one running
sum per tensor (the model's size) instead of every state. Floating tensors are summed in the dtype Flower works in
(at least float32: float16/bfloat16 are promoted, float64 stays float64) and returned in their own dtype; integer
and bool tensors are never averaged as floats: their mean is the value every state had when all agree, else the
weighted mean rounded to the nearest integer.

:class:`WeightedSum` folds flat states ({name: tensor}: the server's replies); :class:`TreeMean` folds nested
dicts (a data user's weights and optimizer state dicts) through one :class:`WeightedSum` keyed by each leaf's path:
its tensors and float leaves are averaged there, any other leaf (lists such as Adam's ``param_groups``, ints,
names) is taken from the first state.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import Any, Generic, TypeVar

import torch

from collapipe_flwr.errors import CollaPipeError

K = TypeVar("K", bound=Hashable)
Path = tuple[Hashable, ...]  # a leaf's keys from the root of a nested dict


def sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a floating tensor is summed (and handed to Flower) in: at least float32."""
    return torch.promote_types(dtype, torch.float32)


class WeightedSum(Generic[K]):
    """sum_n w_n theta_n per tensor, W = sum_n w_n and the number n of states folded in."""

    def __init__(self) -> None:
        self._sums: dict[K, torch.Tensor] = {}  # floating: sum_n w_n theta_n; others: float64 sum
        self._first: dict[K, torch.Tensor] = {}  # non-floating: the first state's value
        self._same: dict[K, bool] = {}  # non-floating: every state so far had the first one's value
        self._dtypes: dict[K, torch.dtype] = {}  # the states' dtypes (the mean's)
        self.total = 0.0  # W
        self.count = 0  # n, the states folded in (central DP's sigma = z C / n)

    def keys(self) -> list[K]:
        return list(self._dtypes)

    def shape(self, key: K) -> tuple[int, ...]:
        return tuple(self._sums[key].shape)

    def add(self, state: Mapping[K, torch.Tensor], weight: float) -> None:
        """Fold ``state`` in with weight w (finite, >= 0). The first state fixes the names, shapes and dtypes;
        a later one that differs is refused before anything changes. ``state`` is not kept."""
        w = float(weight)
        if not math.isfinite(w) or w < 0:
            raise CollaPipeError(f"weight {weight!r}: a weight (num-examples) must be finite and >= 0")
        if self.count:
            self._check_layout(state)
        for key, value in state.items():
            value = value.detach().to("cpu")
            if value.is_floating_point():
                term = value.to(sum_dtype(value.dtype)) * w
            else:
                term = value.to(torch.float64) * w
                if key not in self._first:
                    self._first[key], self._same[key] = value.clone(), True
                elif self._same[key] and not torch.equal(self._first[key], value):
                    self._same[key] = False
            if key in self._sums:
                self._sums[key].add_(term)
            else:
                self._sums[key], self._dtypes[key] = term, value.dtype
        self.total += w
        self.count += 1

    def _check_layout(self, state: Mapping[K, torch.Tensor]) -> None:
        if set(state) != set(self._sums):
            missing, extra = _sorted(set(self._sums) - set(state)), _sorted(set(state) - set(self._sums))
            raise CollaPipeError(f"a state lacks {missing[:3]} / has unexpected {extra[:3]}; names must match")
        for key, value in state.items():
            if tuple(value.shape) != tuple(self._sums[key].shape) or value.dtype != self._dtypes[key]:
                raise CollaPipeError(
                    f"{key} is {value.dtype} {tuple(value.shape)}, the first state's is "
                    f"{self._dtypes[key]} {tuple(self._sums[key].shape)}"
                )

    def mean(self, key: K) -> torch.Tensor:
        """theta_bar[key] = sum_n w_n theta_n[key] / W: floating tensors in their summing dtype, others in
        their own dtype (the common value, or the rounded weighted mean)."""
        if not self.total > 0:
            raise CollaPipeError("aggregation weights (num-examples) sum to zero; every CU reported 0 examples")
        if key in self._first:
            if self._same[key]:
                return self._first[key].clone()
            return torch.round(self._sums[key] / self.total).to(self._dtypes[key])
        return self._sums[key] / self.total

    def means(self) -> dict[K, torch.Tensor]:
        """theta_bar for every tensor, each in its own dtype (what plain FedAvg returns)."""
        return {key: self.mean(key).to(self._dtypes[key]) for key in self._dtypes}


def _sorted(keys: set) -> list:
    return sorted(keys, key=repr)


class TreeMean:
    """The weighted mean of nested dicts of tensors (FedAvg over a CU's data users), one tree at a time: every
    tensor and float leaf averaged by one :class:`WeightedSum` keyed by its path (a float leaf as a float64
    scalar, returned as a float), every other leaf taken from the first tree. A tree whose keys differ from the
    first one's is refused before anything changes."""

    def __init__(self) -> None:
        self._sum: WeightedSum[Path] = WeightedSum()
        self._first: Any = None  # the first tree: where the leaves go back, and the leaves not averaged
        self._paths: set[Path] = set()  # every leaf's path in the first tree

    def add(self, tree: Any, weight: float) -> None:
        leaves: dict[Path, torch.Tensor] = {}
        paths: set[Path] = set()
        _flatten(tree, (), leaves, paths)
        if self._first is not None and paths != self._paths:
            lacking, extra = _sorted(self._paths - paths)[:3], _sorted(paths - self._paths)[:3]
            raise ValueError(f"data users' states differ in their keys: lacking {lacking}, unexpected {extra}")
        self._sum.add(leaves, weight)
        if self._first is None:
            self._first, self._paths = tree, paths

    def mean(self) -> Any:
        """The tree of weighted means: the first tree's shape, its averaged leaves replaced by their means."""
        if self._first is None or not self._sum.total > 0:
            raise ValueError("no data user's state (or only zero weights) to average")
        return _rebuilt(self._first, (), self._sum.means())


def _flatten(tree: Any, path: Path, leaves: dict[Path, torch.Tensor], paths: set[Path]) -> None:
    """The averaged leaves of ``tree`` by path (tensors; floats as float64 scalars), and every leaf's path."""
    paths.add(path)  # every node's, a dict's too: an empty dict in one tree and none in another differ
    if isinstance(tree, dict):
        for key, value in tree.items():
            _flatten(value, (*path, key), leaves, paths)
        return
    if torch.is_tensor(tree):
        leaves[path] = tree
    elif isinstance(tree, float):
        leaves[path] = torch.tensor(tree, dtype=torch.float64)


def _rebuilt(tree: Any, path: Path, means: Mapping[Path, torch.Tensor]) -> Any:
    if isinstance(tree, dict):
        return {key: _rebuilt(value, (*path, key), means) for key, value in tree.items()}
    if isinstance(tree, float):
        return float(means[path].item())
    return means.get(path, tree)


def tree_mean(trees: list[Any] | tuple[Any, ...], weights: list[float] | tuple[float, ...]) -> Any:
    """The weighted mean of ``trees`` (:class:`TreeMean` over them)."""
    running = TreeMean()
    for tree, weight in zip(trees, weights, strict=True):
        running.add(tree, weight)
    return running.mean()
