"""A Flower Grid that delivers each message to the real CU handlers in this process, in node order.

The whole server (``run_server``: strategy, data plane, planner, evaluation) and the whole CU side
(``client_main`` handlers behind the ClientApp's mods, sessions, pipeline) run as in a deployment, minus Flower's
processes. The CUs
answer one after the other, so a run is deterministic for a fixed seed.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable

from flwr.app import Context, Message, RecordDict

from collapipe_flwr.fl import messages
from collapipe_flwr.fl.cu import client_main
from collapipe_flwr.fl.cu.privacy_mod import privacy_mod
from collapipe_flwr.fl.cu.state_store import CUStateStore
from collapipe_flwr.flower_internals import TaskIdentity

RUN_ID = 7
_HANDLERS = {
    messages.HELLO: client_main.handle_hello,
    messages.TRAIN: client_main.handle_train,
    messages.RELEASE: client_main.handle_release,
}


class InProcessGrid:
    """``get_node_ids`` / ``send_and_receive`` over N in-process CUs (node ids 101, 102, ...), served by one CU
    process's state store (as one worker of Flower's simulation serves many CUs)."""

    def __init__(self, num_clusters: int, data_dir: str, run_id: int = RUN_ID) -> None:
        self.run_id = run_id
        self.store = CUStateStore()
        self.contexts = {
            101 + n: Context(
                run_id=run_id,
                node_id=101 + n,
                node_config={"partition-id": n, "num-partitions": num_clusters, "data-dir": str(data_dir)},
                state=RecordDict(),
                run_config={},
            )
            for n in range(num_clusters)
        }
        self._ids = itertools.count(1)
        # what Flower's ServerApp process sets before it creates messages
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 1

    def get_node_ids(self) -> list[int]:
        return sorted(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], timeout: float | None = None) -> list[Message]:
        replies = []
        for msg in sorted(messages, key=lambda m: m.metadata.dst_node_id):
            msg.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
            msg.metadata.__dict__["_run_id"] = self.run_id
            handler = functools.partial(_HANDLERS[msg.metadata.message_type], store=self.store)
            # behind the ClientApp's mod, as client_app.py has it
            replies.append(privacy_mod(msg, self.contexts[msg.metadata.dst_node_id], handler))
        return replies
