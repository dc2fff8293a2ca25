"""One row of the table and how it reads its figure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Figures = dict[str, float]


@dataclass(frozen=True)
class Row:
    figure: str
    value: Callable[[Figures], float | None]
    unit: str
    target: float | None  # None: no target, reported for context
    command: str
    lower_is_better: bool = True

    def cells(self, figures: Figures) -> list[str]:
        try:
            value = self.value(figures)
        except (KeyError, ZeroDivisionError):
            value = None
        if value is None:
            return [self.figure, "not measured", self._target(), "-", f"`{self.command}`"]
        met = "-" if self.target is None else ("yes" if (value <= self.target) == self.lower_is_better else "no")
        return [self.figure, f"{number(value)} {self.unit}".strip(), self._target(), met, f"`{self.command}`"]

    def _target(self) -> str:
        if self.target is None:
            return "-"
        return f"{'<=' if self.lower_is_better else '>='} {self.target:g} {self.unit}".strip()


def number(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def figure_named(name: str) -> Callable[[Figures], float]:
    return lambda f: f[name]
