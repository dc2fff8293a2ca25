"""Whether a tensor holds only finite values, in one read of it.

The head refuses a step whose loss or gradients dL/dz_enc are not finite (one bad batch must not poison the
decoder every CU shares). ``torch.isfinite(t).all()`` answers that with a bool tensor as large as ``t`` and
several passes (on CPU ~20x the cost of one read of a 2 MiB dL/dz_enc); ``torch.aminmax`` reads ``t`` once
into two scalars and propagates NaN, and an Inf is itself the min or the max, so both are finite exactly when
every value is.
"""

from __future__ import annotations

import math

import torch


def all_finite(t: torch.Tensor) -> bool:
    """True when ``t`` holds no NaN / Inf (non-float and empty tensors: True)."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t.detach())
    return math.isfinite(float(lo)) and math.isfinite(float(hi))
