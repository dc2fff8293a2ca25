"""A running FedAvg: sum_n w_n theta_n and W = sum_n w_n, fed one CU's reply at a time.

The round's aggregate of eqs. (6)-(7) (the example-weighted form the server uses: w_n = CU n's num-examples,
theta_n = its returned embedding + encoder theta_n^enc of eq. (4), flat) is

    theta_bar = sum_n w_n theta_n / W.

Flower's ``aggregate_arrayrecords`` computes sum_n (w_n / W) theta_n, which needs W before the first reply;
folding each reply in as it arrives needs the sum first and the division last, so the server holds one
running sum per tensor (the model's size) instead of every CU's copy. Floating tensors are summed in the
dtype Flower works in (at least float32: float16/bfloat16 are promoted, float64 stays float64); integer and
bool buffers are never averaged as floats: their mean is the value every CU returned when all agree, else the
example-weighted mean rounded to the nearest integer (as :class:`ServerOptimizer` did over a list).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from collapipe_flwr.errors import CollaPipeError


def sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a floating tensor is summed (and handed to Flower) in: at least float32."""
    return torch.promote_types(dtype, torch.float32)


class WeightedSum:
    """sum_n w_n theta_n per tensor, W = sum_n w_n and the number n of states folded in."""

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}  # floating: sum_n w_n theta_n; others: float64 sum
        self._first: dict[str, torch.Tensor] = {}  # non-floating: the first state's value
        self._same: dict[str, bool] = {}  # non-floating: every state so far had the first one's value
        self._dtypes: dict[str, torch.dtype] = {}  # the states' dtypes (the mean's)
        self.total = 0.0  # W
        self.count = 0  # n, the states folded in (central DP's sigma = z C / n)

    def keys(self) -> list[str]:
        return list(self._dtypes)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._sums[key].shape)

    def add(self, state: Mapping[str, torch.Tensor], weight: float) -> None:
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

    def _check_layout(self, state: Mapping[str, torch.Tensor]) -> None:
        if set(state) != set(self._sums):
            missing, extra = sorted(set(self._sums) - set(state)), sorted(set(state) - set(self._sums))
            raise CollaPipeError(f"a state lacks {missing[:3]} / has unexpected {extra[:3]}; names must match")
        for key, value in state.items():
            if tuple(value.shape) != tuple(self._sums[key].shape) or value.dtype != self._dtypes[key]:
                raise CollaPipeError(
                    f"{key} is {value.dtype} {tuple(value.shape)}, the first state's is "
                    f"{self._dtypes[key]} {tuple(self._sums[key].shape)}"
                )

    def mean(self, key: str) -> torch.Tensor:
        """theta_bar[key] = sum_n w_n theta_n[key] / W: floating tensors in their summing dtype, others in
        their own dtype (the common value, or the rounded weighted mean)."""
        if not self.total > 0:
            raise CollaPipeError("aggregation weights (num-examples) sum to zero; every CU reported 0 examples")
        if key in self._first:
            if self._same[key]:
                return self._first[key].clone()
            return torch.round(self._sums[key] / self.total).to(self._dtypes[key])
        return self._sums[key] / self.total

    def means(self) -> dict[str, torch.Tensor]:
        """theta_bar for every tensor, each in its own dtype (what plain FedAvg returns)."""
        return {key: self.mean(key).to(self._dtypes[key]) for key in self._dtypes}
