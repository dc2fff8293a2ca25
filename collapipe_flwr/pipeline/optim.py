"""Optimizer specification shared by the CU (embedding), the devices (segments) and the server (head).

Only element-wise optimizers are offered, so that stepping each segment separately equals stepping the
plain model (no global-norm clipping on the split path).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from collapipe_flwr.errors import ConfigError

_NAMES = ("adam", "adamw", "sgd")


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


@dataclass(frozen=True)
class OptimizerSpec:
    name: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    momentum: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in _NAMES:
            raise ConfigError(f"optimizer name {self.name!r} is not one of {', '.join(_NAMES)}; set optimizer.name")
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
        if self.name == "adam":
            return torch.optim.Adam(params, lr=self.lr, betas=self._betas(), weight_decay=self.weight_decay)
        if self.name == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, betas=self._betas(), weight_decay=self.weight_decay)
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
