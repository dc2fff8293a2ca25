"""Flower ClientApp: the control unit (CU) of one cluster (paper Algorithm 1, cluster side).

Thin on purpose: each message is handled by collapipe_flwr.fl.cu.client_main, which reads the node's
partition from its node config (simulation and deployment alike) and drives the cluster's devices. This is the
CU's composition root: the app and the one state store (``fl/cu/state_store.py``) its handlers share, which
lives as long as the process that loaded the app (Flower imports this module once per process).
"""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from collapipe_flwr.fl.cu import client_main
from collapipe_flwr.fl.cu.privacy_mod import privacy_mod
from collapipe_flwr.fl.cu.state_store import CUStateStore
from collapipe_flwr.fl.messages import HELLO_ACTION, RELEASE_ACTION


def compose_client_app() -> ClientApp:
    """The ClientApp, its handlers bound to one new CUStateStore (reachable only through them)."""
    cu_app = ClientApp(mods=[privacy_mod])  # privacy.mode: Flower's DP mods on the CU's upload (docs/privacy.md)
    store = CUStateStore()

    @cu_app.query(HELLO_ACTION)
    def hello(msg: Message, context: Context) -> Message:
        return client_main.handle_hello(msg, context, store)

    @cu_app.train()
    def train(msg: Message, context: Context) -> Message:
        return client_main.handle_train(msg, context, store)

    @cu_app.query(RELEASE_ACTION)
    def release(msg: Message, context: Context) -> Message:
        return client_main.handle_release(msg, context, store)

    return cu_app


app = compose_client_app()
