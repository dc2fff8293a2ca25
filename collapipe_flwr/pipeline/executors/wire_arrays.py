"""How activations and gradients cross between Ray device actors and the CU: as NumPy arrays where they can.

Ray keeps a NumPy array in its shared-memory object store as one out-of-band buffer and hands the next actor a
read-only view of it (no copy), while a torch tensor is pickled through its storage (copied on each side).
Measured on this 2-core machine, a chain of actor calls passing a 512 KB micro-batch activation costs about
3.4 ms a hop as an array and 5.3 ms as a tensor (``docs/benchmarks.md``); a GPipe step at S = 2, m = 4 has about
ten such hops on its critical path. Hand-written because it is two small conversions at the seam Ray owns; a
dtype NumPy lacks (bfloat16) or a tensor not on the CPU crosses as the tensor itself.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

_NUMPY_DTYPES = {torch.float32, torch.float64, torch.float16, torch.int64, torch.int32, torch.bool}


def to_wire(value: Any) -> Any:
    """A CPU tensor of a dtype NumPy has as a NumPy view of it (no copy); anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dtype in _NUMPY_DTYPES:
        return value.detach().numpy()
    return value


def from_wire(value: Any, copy: bool = False) -> Any:
    """A NumPy array as a tensor over the same memory (Ray's read-only view: a device stage never writes into its
    input, autograd refuses in-place changes of a leaf that requires grad), or over a writable copy of it
    (``copy``: the CU's side, whose head and embedding use it further); anything else unchanged."""
    if isinstance(value, np.ndarray):
        if copy:
            return torch.from_numpy(np.array(value))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "the given NumPy array is not writable"
            return torch.from_numpy(value)
    return value
