"""The CUs' replies one at a time as they arrive, instead of one list at the end of the round.

Flower's ``Grid.send_and_receive`` pushes a round's messages, pulls until every reply is in or ``timeout`` has
passed, and returns them all in one list, so the server would hold every CU's uploaded weights theta_n^enc at
once. :class:`StreamingGrid` wraps the run's Grid for ``Strategy.start``: its ``send_and_receive`` pushes at
once (the round's timeout counts from the push, as in Flower's) and returns a generator that pulls each
outstanding reply on its own (``pull_messages([message_id])``) and yields it before pulling the next, so
``aggregate_train`` folds one reply in and releases it before the next is in memory. The loop is Flower's
(``InMemoryGrid`` / ``GrpcGrid.send_and_receive``): pull, stop when every message has its reply, else sleep
the grid's pull interval; pull no more once the timeout has passed (the missing CUs are the round's failures,
as before). A grid without ``push_messages`` / ``pull_messages`` (the tests' in-process grids) is asked with
its own ``send_and_receive`` and its list handed over one reply at a time, each dropped once taken.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

PULL_INTERVAL_S = 3.0  # Flower's GrpcGrid.send_and_receive sleeps 3 s between pulls (InMemoryGrid: pull_interval)


def pulls_one_by_one(grid: object) -> bool:
    """Whether ``grid`` has Flower's push/pull API (every real Grid does)."""
    return callable(getattr(grid, "push_messages", None)) and callable(getattr(grid, "pull_messages", None))


def stream_replies(grid, messages: Iterable[Message], timeout: float | None) -> Iterator[Message]:
    """Push ``messages`` now; the replies, each yielded as soon as it is pulled (see the module docstring)."""
    if not pulls_one_by_one(grid):
        return _handed_over(list(grid.send_and_receive(messages, timeout=timeout)))
    pending = dict.fromkeys(grid.push_messages(messages))  # message id -> None, in push order
    if not pending:
        return iter(())
    deadline = time.time() + (timeout if timeout is not None else 0.0)
    interval = float(getattr(grid, "pull_interval", PULL_INTERVAL_S))
    return _pulled(grid, pending, timeout, deadline, interval)


def _pulled(grid, pending: dict[str, None], timeout: float | None, deadline: float, interval: float):
    """Flower's pull loop, one message id per pull, each reply yielded before the next pull."""
    while timeout is None or time.time() < deadline:
        for message_id in list(pending):
            replies = list(grid.pull_messages([message_id]))
            for reply in replies:
                pending.pop(reply.metadata.reply_to_message_id, None)
            while replies:
                yield replies.pop(0)
        if not pending:
            return
        time.sleep(interval)


def _handed_over(replies: list[Message]) -> Iterator[Message]:
    """``replies`` one by one, each dropped from the list as it is taken (the caller holds the only reference)."""
    replies.reverse()
    while replies:
        yield replies.pop()


class StreamingGrid(Grid):
    """``grid`` with :func:`stream_replies` as its ``send_and_receive``; everything else is ``grid``'s own."""

    def __init__(self, grid) -> None:
        self.grid = grid

    # Run (flwr.supercore.run) is outside Flower's public API: typed Any here, passed through as it is
    def set_run(self, run: Any) -> None:
        self.grid.set_run(run)

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return stream_replies(self.grid, messages, timeout)
