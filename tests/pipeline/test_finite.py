"""pipeline.finite.all_finite against an independent reference (numpy's isfinite over every value)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from collapipe_flwr.pipeline.finite import all_finite


def reference(t: torch.Tensor) -> bool:
    return bool(np.isfinite(t.detach().to(torch.float64).numpy()).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
def test_all_finite_agrees_with_numpy(dtype, bad):
    g = torch.Generator().manual_seed(3)
    for shape in [(64, 32, 256), (1,), (3, 5), (0, 4)]:
        t = (torch.randn(shape, generator=g) * 1e3).to(dtype)
        if bad is not None and t.numel():
            t.view(-1)[int(torch.randint(t.numel(), (1,), generator=g))] = bad
        assert all_finite(t) == reference(t)


def test_non_float_and_non_contiguous_tensors():
    assert all_finite(torch.arange(5)) and all_finite(torch.ones(3, dtype=torch.bool))
    t = torch.randn(8, 6).t()  # a transposed view
    t[2, 3] = float("nan")
    assert all_finite(t) == reference(t) is False
    leaf = torch.ones(4, requires_grad=True)  # works on a leaf that requires grad
    assert all_finite(leaf)
