"""Federated averaging of the concatenated encoders (paper eqs. 6-9, Algorithm 1 lines 24-26).

The CUs return theta_n^enc = theta_n^1 ⊕ ... ⊕ theta_n^S (and their embeddings); the server replaces the
global weights by the example-weighted mean  sum_n |D_n| theta_n / sum_n |D_n|.  The decoder is never
averaged: it is trained on the server from every CU's activations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from collapipe_flwr.errors import CollaPipeError


def weighted_average(
    state_dicts: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]
) -> dict[str, torch.Tensor]:
    """Example-weighted mean of state dicts with identical keys and shapes (accumulated in float64)."""
    if not state_dicts:
        raise CollaPipeError("no client results to aggregate; check that at least one CU finished the round")
    if len(state_dicts) != len(weights):
        raise CollaPipeError(f"{len(state_dicts)} results but {len(weights)} weights")
    total = float(sum(weights))
    if not total > 0:
        raise CollaPipeError("aggregation weights (num-examples) sum to zero; every CU reported 0 examples")
    keys = list(state_dicts[0].keys())
    for i, sd in enumerate(state_dicts[1:], start=1):
        if list(sd.keys()) != keys:
            missing = sorted(set(keys) ^ set(sd.keys()))
            raise CollaPipeError(f"result {i} has different parameter names than result 0 (e.g. {missing[:1]})")
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        ref = state_dicts[0][key]
        if not torch.is_floating_point(ref):
            out[key] = ref.clone()  # integer buffers (e.g. position ids) are not averaged
            continue
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for sd, w in zip(state_dicts, weights):
            t = sd[key]
            if t.shape != ref.shape:
                raise CollaPipeError(f"parameter {key} has shape {tuple(t.shape)} in one result and {tuple(ref.shape)} in another")
            acc.add_(t.to(torch.float64), alpha=float(w) / total)
        out[key] = acc.to(ref.dtype)
    return out
