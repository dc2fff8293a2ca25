"""What the testbed sets up on the host and takes down again (a cgroup, a qdisc), removed as its ``with`` block ends."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class RemovedOnExit:
    """``with x:`` gives ``x`` and calls ``x.remove()`` when the block ends, however it ends."""

    def remove(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()
