"""Optimizer specification shared by the CU (embedding), the devices (segments) and the server (head).

Only element-wise optimizers are offered, so that stepping each segment separately equals stepping the
plain model (no global-norm clipping on the split path).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum

import torch

from collapipe_flwr.errors import ConfigError


class OptimizerName(StrEnum):
    """``model.optimizer.name``: the optimizer every part of the model trains with."""

    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"


# model.optimizer.name -> torch's Adam-family class (SGD takes other arguments)
_ADAMS = {OptimizerName.ADAM: torch.optim.Adam, OptimizerName.ADAMW: torch.optim.AdamW}


class NoOptimizer:
    """The optimizer of a module with nothing to train (a device the plan leaves idle, a frozen embedding):
    torch's optimizers refuse an empty parameter list."""

    def __init__(self) -> None:
        self.param_groups: list = []
        self.state: dict = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {"state": {}, "param_groups": []}

    def load_state_dict(self, state: dict) -> None:
        pass


FUSED_DEVICES = ("cpu", "cuda")  # where torch's fused Adam / AdamW kernel runs


def fused_kernel_fits(params) -> bool:
    """Whether torch's fused Adam / AdamW kernel takes ``params``: floating-point tensors on a CPU or a CUDA GPU.
    It updates each tensor in one pass instead of one op per moment: 3.9 ms instead of 10.6 ms for the six BERT
    blocks of benchmarks/pipeline_overhead.py on one CPU thread, the same update to 1e-6
    (tests/pipeline/test_optim_fused.py), and the CU's embedding, every device's segment and the server's decoder take
    one such step per local step."""
    return all(p.is_floating_point() and p.device.type in FUSED_DEVICES for p in params)


@dataclass(frozen=True)
class OptimizerSpec:
    name: OptimizerName = OptimizerName.ADAM
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    momentum: float = 0.0

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "name", OptimizerName(self.name))
        except ValueError:
            raise ConfigError(
                f"optimizer name {self.name!r} is not one of {', '.join(OptimizerName)}; set optimizer.name"
            ) from None
        if not self.lr > 0:
            raise ConfigError(f"optimizer lr={self.lr!r} must be > 0; set optimizer.lr")

    def _betas(self) -> tuple[float, float]:
        """(beta1, beta2) as a tuple (a config may give a list)."""
        beta1, beta2 = self.betas
        return beta1, beta2

    def build(self, params) -> torch.optim.Optimizer:
        """The optimizer over the trainable ``params`` (a :class:`NoOptimizer` when there are none)."""
        params = [p for p in params if p.requires_grad]
        if not params:
            return NoOptimizer()  # type: ignore[return-value]  # the optimizer interface the callers use
        adam = _ADAMS.get(self.name)
        if adam is not None:
            return adam(
                params, lr=self.lr, betas=self._betas(), weight_decay=self.weight_decay, fused=fused_kernel_fits(params)
            )
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> OptimizerSpec:
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(float(x) for x in d["betas"])
        return cls(**d)


def scale_lr(optimizer, base_lrs, factor: float) -> None:
    """Set every param group's lr to its base lr times ``factor`` (the learning-rate schedule's multiplier)."""
    for group, base in zip(optimizer.param_groups, base_lrs):
        group["lr"] = base * float(factor)
